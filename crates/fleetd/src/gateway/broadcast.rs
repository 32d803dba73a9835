//! `fleet_broadcast`: one message to every worker (or a group), each copy delivered by the
//! normal rules of its worker's gateway.

use std::sync::Arc;

use fleet_core::authz::{Tool, check_tool};
use fleet_core::clock::now_ms;
use fleet_core::delivery::Placement;
use fleet_core::message::check_size;
use fleet_core::typed::typeable;
use fleet_core::{ErrorCode, FleetError, Message, MsgId, TraceId};

use super::afar::Broadcast;
use super::views::BroadcastResult;
use super::{Caller, LocalPlane};

impl LocalPlane {
    /// The local side of [`Gateway::broadcast`].
    pub(super) async fn broadcast(
        self: &Arc<Self>,
        caller: &Caller,
        text: String,
        group: Option<String>,
    ) -> Result<BroadcastResult, FleetError> {
        check_tool(&caller.entity, Tool::Broadcast)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        typeable(&text).map_err(|found| found.refusal())?;
        if let Some(group) = &group {
            fleet_core::entity::validate_name("group", group)?;
        }
        let (msg_id, trace_id) = (MsgId::mint(), TraceId::mint());
        let mut unreached = false;
        let (copies, refused) = if let Some(afar) = self.afar.as_deref() {
            let broadcast = Broadcast {
                from: &caller.entity,
                group: group.as_deref(),
                text: &text,
                ids: (msg_id, trace_id),
            };
            match afar.broadcast(self, broadcast).await {
                Ok(sent) => sent,
                // This host's workers still get theirs; the caller hears the others did not.
                Err(e) if e.code == ErrorCode::BrokerUnavailable => {
                    tracing::warn!(%msg_id, error = %e.message, "the broker cannot be reached: the broadcast goes to this host's workers only");
                    unreached = true;
                    self.broadcast_here(caller, &text, group.as_deref(), msg_id, trace_id)
                        .await?
                }
                Err(e) => return Err(e),
            }
        } else {
            self.broadcast_here(caller, &text, group.as_deref(), msg_id, trace_id)
                .await?
        };
        tracing::info!(%trace_id, %msg_id, group = ?group, copies, "broadcast");
        let mut note = String::from(
            "each copy is typed in when its worker is free; their answers come back as ordinary replies (fleet_poll)",
        );
        for why in refused {
            note.push_str("; no copy: ");
            note.push_str(&why);
        }
        if unreached {
            note.push_str(
                "; only this host's workers got a copy: the broker cannot be reached, so the other hosts were not reached",
            );
        }
        Ok(BroadcastResult {
            msg_id,
            copies,
            note,
        })
    }

    /// A copy of a broadcast for each of this host's workers (of `group`), queued here: how
    /// many were queued, and why any worker got none (at its cap).
    async fn broadcast_here(
        self: &Arc<Self>,
        caller: &Caller,
        text: &str,
        group: Option<&str>,
        msg_id: MsgId,
        trace_id: TraceId,
    ) -> Result<(usize, Vec<String>), FleetError> {
        // Only the workers the caller may task: its own and those shared with it.
        let targets = self.sessions.lock().taskable(&caller.entity, group);
        let (mut copies, mut full) = (0, Vec::new());
        for gid in targets {
            let copy = Message::task(caller.entity.gid, gid, text.to_string(), trace_id, now_ms())
                .with_id(msg_id.derived(&gid.to_string()));
            match self.deliver(copy).await {
                Ok(Placement::Queue) => copies += 1,
                Ok(_) => {}
                // A worker at its cap gets no copy; the others still do, and the note says who
                // did not.
                Err(e) if e.code == ErrorCode::TooMany => full.push(e.message),
                Err(e) => return Err(e),
            }
        }
        Ok((copies, full))
    }
}
