//! `fleet_reply`: an answer to a task (the caller's in flight, or a message named by id), and
//! the end of the turn it answers.

use std::sync::Arc;

use fleet_core::authz::{Tool, check_tool};
use fleet_core::clock::now_ms;
use fleet_core::delivery::Placement;
use fleet_core::message::check_size;
use fleet_core::{ErrorCode, FleetError, Gid, Message, MsgId};

use super::views::ReplyResult;
use super::{Caller, LocalPlane, store_error};

impl LocalPlane {
    /// The local side of [`Gateway::reply`].
    pub(super) async fn reply(
        self: &Arc<Self>,
        caller: &Caller,
        text: String,
        in_reply_to: Option<MsgId>,
    ) -> Result<ReplyResult, FleetError> {
        check_tool(&caller.entity, Tool::Reply)?;
        check_size(&text, self.config.gateway.max_message_bytes)?;
        let me = caller.entity.gid;
        let answered = self.answered_by(me, in_reply_to).await?;
        if let Some(coord_id) = self.coord_sender(&answered).await {
            return Err(FleetError::invalid(format!(
                "message {} is coordination from the lead '{coord_id}' of another fleet, not a task: answer it with fleet_send{{coord_id: \"{coord_id}\", message}}",
                answered.msg_id
            )));
        }
        let task = answered.msg_id;
        crate::logs::step(task, "reply_received");
        if self.db.at_once().is_answered(task).map_err(store_error)? {
            return Err(FleetError::new(
                ErrorCode::TooLate,
                format!(
                    "task {task} has its answer already: a task is answered once (fleet_poll shows what waits for you)"
                ),
            ));
        }
        let reply = Message::reply_to(&answered, text, now_ms());
        let msg_id = reply.msg_id;
        if matches!(self.placement(&reply), Placement::Dead) {
            return Err(FleetError::new(
                ErrorCode::Gone,
                format!(
                    "'{}' who sent message {} is gone; your reply has nowhere to go",
                    self.name_of(answered.from).await,
                    answered.msg_id
                ),
            ));
        }
        // Take the task out of flight first, so a session ending while the reply is stored
        // does not also report the task unanswered; put it back if storing fails.
        let ending = self.take_current(me, answered.msg_id);
        if let Err(e) = self.deliver(reply).await {
            if let Some(task) = ending {
                self.restore_current(me, task);
            }
            return Err(e);
        }
        crate::logs::step(task, "reply_held");
        if ending.is_some() {
            self.end_turn(me);
        }
        Ok(ReplyResult {
            msg_id,
            to: answered.from,
            to_name: self.name_of(answered.from).await,
        })
    }

    /// The task a reply of `me` answers: `in_reply_to`, a message sent to it, or else its task
    /// in flight; never one not typed in to it yet (it has seen nothing of it to answer).
    async fn answered_by(
        &self,
        me: Gid,
        in_reply_to: Option<MsgId>,
    ) -> Result<Message, FleetError> {
        let answered = match in_reply_to {
            Some(id) => self
                .db
                .run(move |s| s.message(id))
                .await?
                .filter(|m| m.to == me)
                .ok_or_else(|| {
                    FleetError::invalid(format!(
                        "in_reply_to {id} is not a message sent to you; fleet_poll shows what you received"
                    ))
                })?,
            None => self.sessions
                .lock()
                .panes
                .get(&me)
                .and_then(|s| s.current().cloned())
                .ok_or_else(|| {
                    FleetError::invalid(
                        "you have no task in flight to answer: pass in_reply_to (the msg_id you answer)",
                    )
                })?,
        };
        let untyped = self
            .sessions
            .lock()
            .panes
            .get(&me)
            .is_some_and(|s| s.awaits_typing(answered.msg_id));
        if untyped {
            return Err(FleetError::invalid(format!(
                "task {} has not been typed in to you yet: answer the task you were given",
                answered.msg_id
            )));
        }
        Ok(answered)
    }

    /// Takes `gid`'s task in flight out of flight if it is `answered`.
    fn take_current(&self, gid: Gid, answered: MsgId) -> Option<Message> {
        self.sessions
            .lock()
            .panes
            .get_mut(&gid)?
            .take_current(answered)
    }

    /// Puts a task taken by [`LocalPlane::take_current`] back in flight.
    fn restore_current(&self, gid: Gid, task: Message) {
        if let Some(session) = self.sessions.lock().panes.get_mut(&gid) {
            session.restore_current(task);
        }
    }

    /// Ends `gid`'s turn: the worker is idle again and its next task may go in.
    fn end_turn(&self, gid: Gid) {
        if let Some(session) = self.sessions.lock().panes.get_mut(&gid)
            && let Err(e) = session.end_turn()
        {
            tracing::warn!(%gid, error = %e, "reply outside a turn");
        }
    }
}
