//! The federation behind the local plane's seam ([`Afar`]): each method is one of this
//! module's acts, so the local plane names none of them.

use std::collections::HashMap;
use std::sync::Arc;

use fleet_core::control::Target;
use fleet_core::delivery::Placement;
use fleet_core::{Entity, FleetError, Gid, Message, MsgId};
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::Federation;
use crate::gateway::afar::{Afar, Broadcast};
use crate::gateway::views::{HostView, RosterEntry, SpawnResult, StopResult};
use crate::gateway::{Caller, Gateway, SpawnRequest};

impl Afar for Federation {
    fn entity(&self, gid: Gid) -> Option<Entity> {
        self.lock().roster.entity(gid).map(|e| e.entity.clone())
    }

    fn named(&self, name: &str) -> Vec<Entity> {
        self.lock()
            .roster
            .named(name)
            .map(|e| e.entity.clone())
            .collect()
    }

    fn names(&self) -> Vec<String> {
        self.lock().roster.names().map(String::from).collect()
    }

    fn name(&self, gid: Gid) -> Option<String> {
        let state = self.lock();
        state
            .roster
            .entity(gid)
            .map(|e| e.entity.name.clone())
            .or_else(|| state.senders.get(&gid).cloned())
    }

    fn host(&self, gid: Gid) -> Option<String> {
        self.host_of(gid)
    }

    fn busy(&self, gid: Gid) -> Option<bool> {
        self.lock().roster.entity(gid).map(|e| e.is_busy())
    }

    fn hosts_heard(&self) -> usize {
        if self.link().is_none() {
            return 0;
        }
        self.lock().roster.hosts_heard().count()
    }

    fn brief_state(&self, msg_id: MsgId) -> Option<&'static str> {
        self.lock().receipts.state(msg_id)
    }

    fn roster(&self, leads: &HashMap<Gid, String>) -> (Vec<RosterEntry>, Vec<HostView>) {
        self.roster_view(leads)
    }

    fn spawn_target(&self, g: &Gateway, requested: Option<&str>) -> Result<Target, FleetError> {
        g.spawn_target(requested)
    }

    fn send<'a>(
        &'a self,
        g: &'a Arc<Gateway>,
        message: Message,
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        Box::pin(g.send_remote(message))
    }

    fn send_in_turn<'a>(
        &'a self,
        g: &'a Gateway,
        message: &'a Message,
        turn: (&'a str, u64),
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        Box::pin(g.publish_in_turn(message, Some(turn)))
    }

    fn keep<'a>(&'a self, g: &'a Gateway, notice: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(g.keep_for_broker(notice))
    }

    fn broadcast<'a>(
        &'a self,
        g: &'a Gateway,
        broadcast: Broadcast<'a>,
    ) -> BoxFuture<'a, Result<(usize, Vec<String>), FleetError>> {
        Box::pin(g.publish_broadcast(broadcast))
    }

    fn spawn<'a>(
        &'a self,
        g: &'a Arc<Gateway>,
        caller: &'a Caller,
        request: SpawnRequest,
        host: &'a str,
        ct: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<SpawnResult, FleetError>> {
        Box::pin(g.spawn_remote(caller, request, host, ct))
    }

    fn stop<'a>(
        &'a self,
        g: &'a Arc<Gateway>,
        caller: &'a Caller,
        worker: &'a Entity,
    ) -> BoxFuture<'a, Result<StopResult, FleetError>> {
        Box::pin(g.stop_remote(caller, worker))
    }

    fn sent_between<'a>(
        &'a self,
        g: &'a Gateway,
        task: MsgId,
        host: String,
        (from, to): (Gid, Gid),
    ) -> BoxFuture<'a, bool> {
        Box::pin(g.sent_between(task, host, from, to))
    }

    fn brief_going<'a>(&'a self, g: &'a Gateway, brief: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(g.track_remote_brief(brief))
    }

    fn briefs_settled<'a>(&'a self, g: &'a Gateway, briefs: Vec<MsgId>) -> BoxFuture<'a, ()> {
        Box::pin(g.receipts_settled(briefs))
    }

    fn injected<'a>(&'a self, g: &'a Arc<Gateway>, task: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(g.receipt_injected(task))
    }

    fn ask_abandoned<'a>(
        &'a self,
        g: &'a Gateway,
        ask: &'a Message,
        turn: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(g.ask_abandoned(ask, turn))
    }

    fn joined<'a>(&'a self, g: &'a Arc<Gateway>, gid: Gid) -> BoxFuture<'a, ()> {
        Box::pin(g.federation_joined(gid))
    }

    fn left<'a>(&'a self, g: &'a Arc<Gateway>, entity: &'a Entity) -> BoxFuture<'a, ()> {
        Box::pin(g.federation_left(entity))
    }

    fn sender_gone<'a>(&'a self, g: &'a Gateway, sender: Gid) -> BoxFuture<'a, ()> {
        Box::pin(g.receipts_sent_by(sender))
    }

    fn reaped(&self, g: &Arc<Gateway>, entity: Entity) {
        g.reaped(entity);
    }
}
