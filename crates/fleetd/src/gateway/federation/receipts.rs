//! The sweep: marks quiet roster entries unreachable and forgets those quiet too long (while
//! the link is up: with it down, nobody can be heard), and fails remote briefs whose
//! `INJECTED` receipt is overdue, by the bound `fleet_core::receipts` keeps: it waits while a
//! recipient is busy, unreachable or its heartbeat overdue (every one while this gateway's own
//! link is down).

use std::sync::Arc;
use std::time::Duration;

use fleet_core::Message;
use fleet_core::receipts::Standing;
use tokio::time::Instant;

use super::super::LocalPlane;
use super::FedState;
use super::Federation;
use fleet_core::clock::now_ms;

impl Federation {
    /// Expires quiet roster entries, and fails remote briefs whose receipt is overdue.
    pub(super) async fn sweep(&self, g: &Arc<LocalPlane>) {
        let now = Instant::now().into_std();
        let (overdue, bound) = {
            let mut state = self.lock();
            let up = self.link().is_some();
            if up {
                state.roster.expire(now, now_ms());
            }
            // A heartbeat is overdue half an interval and a second late (gateways beat on their
            // own schedule, and a sweep may hold one up a little).
            let interval = Duration::from_secs(self.config.presence_interval_s);
            let late = interval + interval / 2 + Duration::from_secs(1);
            let FedState {
                roster, receipts, ..
            } = &mut *state;
            let overdue = receipts.sweep(now, |gid| {
                if up {
                    roster.standing(gid, now, late)
                } else {
                    Standing::Unheard
                }
            });
            (overdue, receipts.bound())
        };
        self.receipts_settled(g, overdue.iter().map(|(id, _)| *id).collect())
            .await;
        for (msg_id, pending) in overdue {
            let name = g.name_of(pending.recipient).await;
            let reason = format!(
                "no INJECTED receipt from '{name}' within {} s of it being free and reachable (or by the end of the brief's life on the broker): the brief may not have been typed in, and is not retried",
                bound.as_secs()
            );
            tracing::warn!(trace_id = %pending.trace_id, %msg_id, "remote brief not confirmed");
            let original = Message::task(
                pending.sender,
                pending.recipient,
                String::new(),
                pending.trace_id,
                now_ms(),
            )
            .with_id(msg_id);
            Box::pin(g.notify_failed(&original, &reason)).await;
        }
    }
}
