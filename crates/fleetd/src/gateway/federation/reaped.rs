//! The inboxes a previous run's workers left on the broker: each brief still waiting there is
//! dead-lettered and its sender told, then the inbox goes.

use std::sync::Arc;

use fleet_amqp::Broker;
use fleet_core::Entity;
use fleet_core::admission::Handled;

use super::super::LocalPlane;
use super::Federation;
use super::settle::settle;

/// How many messages are taken off a reaped worker's inbox at once.
const DRAIN_BATCH: usize = 64;

impl Federation {
    /// Clears the inboxes of the reaped workers, once the broker can be reached (else the next
    /// link does); one the broker will not let go of yet stays for the next beat.
    pub(super) async fn clear_reaped_inboxes(&self, g: &Arc<LocalPlane>) {
        let Some(link) = self.link() else {
            let waiting = self.lock().reaped.len();
            if waiting > 0 {
                tracing::warn!(
                    inboxes = waiting,
                    "the broker cannot be reached: the inboxes of a previous run's workers are cleared once it can"
                );
            }
            return;
        };
        let reaped = std::mem::take(&mut self.lock().reaped);
        for entity in reaped {
            if !self.clear_reaped_inbox(g, link.as_ref(), &entity).await {
                // Tried again at the next beat (or the next link).
                self.lock().reaped.push(entity);
            }
        }
    }

    /// The inbox of a worker a previous run left: every brief still waiting there is
    /// dead-lettered and its (genuine) sender told the worker is gone, then the inbox is
    /// deleted — nothing sent to it vanishes unannounced — and the worker announced gone. False
    /// when the broker would not let the inbox be deleted yet: to be tried again.
    async fn clear_reaped_inbox(
        &self,
        g: &Arc<LocalPlane>,
        link: &dyn Broker,
        entity: &Entity,
    ) -> bool {
        let gid = entity.gid;
        let why = format!(
            "'{}' is gone: its gateway restarted before the message could be typed in",
            entity.name
        );
        let mut told = 0usize;
        let mut handled = std::collections::HashSet::new();
        loop {
            let batch = match link.drain_inbox(gid, DRAIN_BATCH).await {
                Ok(batch) if batch.is_empty() => break,
                Ok(batch) => batch,
                Err(e) => {
                    // (A quorum queue with a single active consumer cannot be read by a get at
                    // all: it is deleted, and the senders' receipt bounds tell them.)
                    tracing::debug!(%gid, error = %e, "nothing drained from a reaped inbox");
                    break;
                }
            };
            // A message handled already came again: its settlement did not reach the broker.
            // Stop rather than go round; the inbox goes, and what is left in it, with it.
            let again = batch
                .iter()
                .any(|d| d.envelope().is_ok_and(|e| handled.contains(&e.msg_id)));
            if again {
                tracing::warn!(%gid, "a reaped inbox gives back what was settled: deleting it as it is");
                break;
            }
            for delivery in batch {
                let Ok(envelope) = delivery.envelope() else {
                    settle(&delivery, Handled::Refused, false).await;
                    continue;
                };
                handled.insert(envelope.msg_id);
                // Only a genuine sender is told.
                match self.check_genuine(g, &envelope, &delivery) {
                    Ok(()) => {
                        self.refuse_and_tell(g, gid, &envelope, &delivery, "recipient gone", &why)
                            .await;
                        told += 1;
                    }
                    Err(refusal) => self.refuse_untrusted(&delivery, &envelope, &refusal).await,
                }
            }
        }
        match link.delete_inbox(gid).await {
            Ok(()) => {
                tracing::info!(%gid, name = %entity.name, refused = told, "deleted the inbox of a previous run's worker")
            }
            Err(e) => {
                tracing::warn!(%gid, error = %e, "cannot delete the inbox of a previous run's worker: tried again at the next beat");
                return false;
            }
        }
        // (The other gateways heard it is gone from this run's first whole account, which
        // named only this run's entities.)
        true
    }
}
