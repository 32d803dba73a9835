//! The local plane's one seam to other hosts. Sessions, delivery, calls, asks, dialogs and
//! spawns reach the federation only through [`Afar`]: what other hosts hold (looked up), what
//! goes there (sent, with its outcome), and what happened here that another host must hear of
//! (told, as events). The federation implements it; the local plane never names a federation
//! type or function, so either side can change behind it.
//!
//! Every method takes the gateway whose local plane is asking: the federation acts through its
//! handles (the store, the sessions, delivery), never the other way round.

use std::collections::HashMap;
use std::sync::Arc;

use fleet_core::control::Target;
use fleet_core::delivery::Placement;
use fleet_core::{Entity, FleetError, Gid, Message, MsgId, TraceId};
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::views::{HostView, RosterEntry, SpawnResult, StopResult};
use super::{Caller, LocalPlane, SpawnRequest};

/// A broadcast, as the local plane hands it over: who sends what to which group.
pub(super) struct Broadcast<'a> {
    /// Its sender.
    pub from: &'a Entity,
    /// Its group; every worker when `None`.
    pub group: Option<&'a str>,
    /// Its text.
    pub text: &'a str,
    /// Its message and trace ids.
    pub ids: (MsgId, TraceId),
}

/// What the local plane asks of, sends to, and tells the other hosts of the fleet.
pub(super) trait Afar: Send + Sync {
    // ---- What other hosts hold, as their heartbeats and messages told.

    /// The remote entity `gid`, live in the roster.
    fn entity(&self, gid: Gid) -> Option<Entity>;
    /// The live remote entities called `name`.
    fn named(&self, name: &str) -> Vec<Entity>;
    /// Every name the remote roster holds.
    fn names(&self) -> Vec<String>;
    /// The name of remote entity `gid`: as the roster knows it, else as its last message said.
    fn name(&self, gid: Gid) -> Option<String>;
    /// The host remote entity `gid` is (or was last) on.
    fn host(&self, gid: Gid) -> Option<String>;
    /// Whether remote entity `gid` is busy as its host last said; `None` when unknown.
    fn busy(&self, gid: Gid) -> Option<bool>;
    /// How many other hosts are heard from now.
    fn hosts_heard(&self) -> usize;
    /// How many other hosts' entities the roster holds (heard or unreachable).
    fn remote_entities(&self) -> usize;
    /// How far a brief published from here has got, while its receipt is awaited.
    fn brief_state(&self, msg_id: MsgId) -> Option<&'static str>;
    /// The other hosts' entities as `fleet_list` shows them (each owner named as `name@host`,
    /// this host's `leads` among them), and the other hosts.
    fn roster(&self, leads: &HashMap<Gid, String>) -> (Vec<RosterEntry>, Vec<HostView>);
    /// Where a spawn asked for `requested` goes: here, or a host that is heard from.
    fn spawn_target(&self, g: &LocalPlane, requested: Option<&str>) -> Result<Target, FleetError>;

    // ---- What goes there, with its outcome.

    /// Sends `message` to its remote recipient: published, carried through an outage, or
    /// refused with why.
    fn send<'a>(
        &'a self,
        g: &'a Arc<LocalPlane>,
        message: Message,
    ) -> BoxFuture<'a, Result<Placement, FleetError>>;
    /// Sends `message`, a turn of an ask's conversation (`turn`: its id and how long, in
    /// seconds, it is good for).
    fn send_in_turn<'a>(
        &'a self,
        g: &'a LocalPlane,
        message: &'a Message,
        turn: (&'a str, u64),
    ) -> BoxFuture<'a, Result<Placement, FleetError>>;
    /// Keeps `notice` (for a sender there) until the broker takes it.
    fn keep<'a>(&'a self, g: &'a LocalPlane, notice: &'a Message) -> BoxFuture<'a, ()>;
    /// Publishes a broadcast: how many workers may take a copy, and why some got none.
    fn broadcast<'a>(
        &'a self,
        g: &'a LocalPlane,
        broadcast: Broadcast<'a>,
    ) -> BoxFuture<'a, Result<(usize, Vec<String>), FleetError>>;
    /// Spawns on `host`, through its gateway.
    fn spawn<'a>(
        &'a self,
        g: &'a Arc<LocalPlane>,
        caller: &'a Caller,
        request: SpawnRequest,
        host: &'a str,
        ct: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<SpawnResult, FleetError>>;
    /// Stops `worker`, another host's, through its gateway.
    fn stop<'a>(
        &'a self,
        g: &'a Arc<LocalPlane>,
        caller: &'a Caller,
        worker: &'a Entity,
    ) -> BoxFuture<'a, Result<StopResult, FleetError>>;
    /// Whether this gateway published `task` between `(from, to)` on `host`.
    fn sent_between<'a>(
        &'a self,
        g: &'a LocalPlane,
        task: MsgId,
        host: String,
        between: (Gid, Gid),
    ) -> BoxFuture<'a, bool>;

    // ---- Told: what happened here that another host must hear of.

    /// A brief to another host is about to go: its receipt is awaited from now.
    fn brief_going<'a>(&'a self, g: &'a LocalPlane, brief: &'a Message) -> BoxFuture<'a, ()>;
    /// Briefs whose receipts are no longer awaited (they never went).
    fn briefs_settled<'a>(&'a self, g: &'a LocalPlane, briefs: Vec<MsgId>) -> BoxFuture<'a, ()>;
    /// `task` was typed into its worker (or handed to its pull): its sender there hears so.
    fn injected<'a>(&'a self, g: &'a Arc<LocalPlane>, task: &'a Message) -> BoxFuture<'a, ()>;
    /// The remote ask `ask` of turn `turn` ended unanswered.
    fn ask_abandoned<'a>(
        &'a self,
        g: &'a LocalPlane,
        ask: &'a Message,
        turn: &'a str,
    ) -> BoxFuture<'a, ()>;
    /// A local entity joined: other hosts can reach it from now.
    fn joined<'a>(&'a self, g: &'a Arc<LocalPlane>, gid: Gid) -> BoxFuture<'a, ()>;
    /// A local entity left: other hosts hear it is gone.
    fn left<'a>(&'a self, g: &'a Arc<LocalPlane>, entity: &'a Entity) -> BoxFuture<'a, ()>;
    /// `sender` is gone: the briefs it sent elsewhere are no longer awaited.
    fn sender_gone<'a>(&'a self, g: &'a LocalPlane, sender: Gid) -> BoxFuture<'a, ()>;
    /// A previous run's worker was reaped at start: its inbox is to be cleared.
    fn reaped(&self, g: &Arc<LocalPlane>, entity: Entity);
}

impl LocalPlane {
    /// The other hosts, when `message` came from one of them (its sender is not this host's):
    /// what is told of it goes there. A message between this host's own never reaches the
    /// federation.
    pub(super) fn afar_of(&self, message: &Message) -> Option<&dyn Afar> {
        let afar = self.afar.as_deref()?;
        (!self.sessions.lock().is_local(message.from)).then_some(afar)
    }
}
