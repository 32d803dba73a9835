//! What `/metrics` reads off the gateway at a scrape: the gauges' [`Snapshot`], and who may
//! use the operator surfaces (a lead's or an operator's bearer token, checked without counting
//! as a call).

use std::collections::HashMap;

use fleet_core::{FleetError, Gid, WorkerStatus};

use super::{Caller, OperatorViews, Viewer, store_error};
use crate::metrics::Snapshot;

impl OperatorViews {
    /// What [`Gateway::viewer`] reads.
    pub(super) fn viewer(&self, hash: &[u8; 32]) -> Result<Option<Viewer>, FleetError> {
        let Some(gid) = self
            .local
            .db
            .at_once()
            .gid_for_token(hash)
            .map_err(store_error)?
        else {
            return Ok(None);
        };
        if let Some(lead) = self.local.sessions.lock().leads.get(&gid) {
            return Ok(Some(Viewer::Lead(Caller {
                entity: lead.entity_shared(),
            })));
        }
        Ok(self
            .local
            .config
            .operators
            .iter()
            .find(|(name, _)| Gid::of_operator(name) == gid)
            .map(|(name, operator)| Viewer::Operator {
                name: name.clone(),
                read_only: operator.read_only,
            }))
    }

    /// What [`Gateway::metrics_text`] reads.
    pub(super) async fn metrics_text(&self) -> Result<String, FleetError> {
        let snapshot = self.snapshot().await?;
        self.local
            .metrics
            .render(&snapshot)
            .map_err(|e| FleetError::internal(format!("cannot write the metrics: {e}")))
    }

    async fn snapshot(&self) -> Result<Snapshot, FleetError> {
        let sessions = {
            let sessions = self.local.sessions.lock();
            let mut by_status: HashMap<WorkerStatus, i64> = HashMap::new();
            for session in sessions.panes.values() {
                *by_status.entry(session.status()).or_default() += 1;
            }
            WorkerStatus::ALL
                .iter()
                .map(|s| {
                    (
                        s.as_str().to_string(),
                        by_status.get(s).copied().unwrap_or(0),
                    )
                })
                .collect()
        };
        let messages = self
            .local
            .db
            .run(|s| s.message_counts())
            .await?
            .into_iter()
            .map(|(kind, state, n)| (kind, state, count(n)))
            .collect();
        let waiting_by_gid = self.local.db.run(|s| s.waiting_by_recipient()).await?;
        let mut names: HashMap<Gid, String> = HashMap::new();
        let mut waiting = Vec::with_capacity(waiting_by_gid.len());
        for (gid, state, n) in waiting_by_gid {
            let name = self.cached_name(&mut names, gid).await;
            waiting.push((name, state, count(n)));
        }
        let afar = self.local.afar.as_deref();
        let hosts_up = 1 + afar.map_or(0, |afar| count(afar.hosts_heard()));
        let remote_entities = afar.map_or(0, |afar| count(afar.remote_entities()));
        Ok(Snapshot {
            sessions,
            messages,
            waiting,
            hosts_up,
            remote_entities,
            connections: self.local.listener.figures(),
        })
    }
}

/// A count as a gauge value.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
