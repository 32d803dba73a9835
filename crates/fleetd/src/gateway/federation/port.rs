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
use crate::gateway::{Caller, LocalPlane, SpawnRequest};

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

    fn remote_entities(&self) -> usize {
        self.lock().roster.entities().count()
    }

    fn brief_state(&self, msg_id: MsgId) -> Option<&'static str> {
        self.lock().receipts.state(msg_id)
    }

    fn roster(&self, leads: &HashMap<Gid, String>) -> (Vec<RosterEntry>, Vec<HostView>) {
        self.roster_view(leads)
    }

    fn spawn_target(&self, g: &LocalPlane, requested: Option<&str>) -> Result<Target, FleetError> {
        Federation::spawn_target(self, g, requested)
    }

    fn send<'a>(
        &'a self,
        g: &'a Arc<LocalPlane>,
        message: Message,
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        Box::pin(self.send_remote(g, message))
    }

    fn send_in_turn<'a>(
        &'a self,
        g: &'a LocalPlane,
        message: &'a Message,
        turn: (&'a str, u64),
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        Box::pin(self.publish_in_turn(g, message, Some(turn)))
    }

    fn keep<'a>(&'a self, g: &'a LocalPlane, notice: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(self.keep_for_broker(g, notice))
    }

    fn broadcast<'a>(
        &'a self,
        g: &'a LocalPlane,
        broadcast: Broadcast<'a>,
    ) -> BoxFuture<'a, Result<(usize, Vec<String>), FleetError>> {
        Box::pin(self.publish_broadcast(g, broadcast))
    }

    fn spawn<'a>(
        &'a self,
        g: &'a Arc<LocalPlane>,
        caller: &'a Caller,
        request: SpawnRequest,
        host: &'a str,
        ct: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<SpawnResult, FleetError>> {
        Box::pin(self.spawn_remote(g, caller, request, host, ct))
    }

    fn stop<'a>(
        &'a self,
        g: &'a Arc<LocalPlane>,
        caller: &'a Caller,
        worker: &'a Entity,
    ) -> BoxFuture<'a, Result<StopResult, FleetError>> {
        Box::pin(self.stop_remote(g, caller, worker))
    }

    fn sent_between<'a>(
        &'a self,
        g: &'a LocalPlane,
        task: MsgId,
        host: String,
        (from, to): (Gid, Gid),
    ) -> BoxFuture<'a, bool> {
        Box::pin(Federation::sent_between(self, g, task, host, from, to))
    }

    fn brief_going<'a>(&'a self, g: &'a LocalPlane, brief: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(self.track_remote_brief(g, brief))
    }

    fn briefs_settled<'a>(&'a self, g: &'a LocalPlane, briefs: Vec<MsgId>) -> BoxFuture<'a, ()> {
        Box::pin(self.receipts_settled(g, briefs))
    }

    fn injected<'a>(&'a self, g: &'a Arc<LocalPlane>, task: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(self.receipt_injected(g, task))
    }

    fn ask_abandoned<'a>(
        &'a self,
        g: &'a LocalPlane,
        ask: &'a Message,
        turn: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(Federation::ask_abandoned(self, g, ask, turn))
    }

    fn joined<'a>(&'a self, g: &'a Arc<LocalPlane>, gid: Gid) -> BoxFuture<'a, ()> {
        Box::pin(self.federation_joined(g, gid))
    }

    fn left<'a>(&'a self, g: &'a Arc<LocalPlane>, entity: &'a Entity) -> BoxFuture<'a, ()> {
        Box::pin(self.federation_left(g, entity))
    }

    fn sender_gone<'a>(&'a self, g: &'a LocalPlane, sender: Gid) -> BoxFuture<'a, ()> {
        Box::pin(self.receipts_sent_by(g, sender))
    }

    fn reaped(&self, g: &Arc<LocalPlane>, entity: Entity) {
        Federation::reaped(self, g, entity);
    }
}
