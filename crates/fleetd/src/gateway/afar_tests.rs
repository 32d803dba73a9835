//! The local plane's seam to other hosts, against a fake of it: what goes there goes through
//! [`Afar`] alone, and what happens between this host's own never reaches it. (The federation
//! behind the seam, on the real broker, is in the `suite` integration tests.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_core::control::Target;
use fleet_core::delivery::Placement;
use fleet_core::{Entity, FleetError, Gid, Message, MsgId, Role, TraceId};
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::afar::{Afar, Broadcast};
use super::local_tests::{local_on, send, settle};
use super::views::{HostView, RosterEntry, SendResult, SpawnResult, StopResult};
use super::{Caller, LocalPlane, SpawnRequest};

/// Another host with one worker, `wz` on `hostz`, that notes what it is sent and told.
struct FakeAfar {
    wz: Entity,
    heard: Mutex<Vec<String>>,
}

impl FakeAfar {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            wz: Entity {
                gid: Gid::mint(),
                name: "wz".into(),
                host: "hostz".into(),
                role: Role::Worker,
                profile: None,
                sandbox: None,
                profile_role: None,
                groups: Vec::new(),
                parent: None,
            },
            heard: Mutex::new(Vec::new()),
        })
    }

    fn note(&self, what: String) {
        self.heard.lock().unwrap().push(what);
    }

    fn heard(&self) -> Vec<String> {
        self.heard.lock().unwrap().clone()
    }

    fn noted<'a>(&'a self, what: String) -> BoxFuture<'a, ()> {
        self.note(what);
        Box::pin(async {})
    }
}

impl Afar for FakeAfar {
    fn entity(&self, gid: Gid) -> Option<Entity> {
        (gid == self.wz.gid).then(|| self.wz.clone())
    }

    fn named(&self, name: &str) -> Vec<Entity> {
        self.entity(self.wz.gid)
            .filter(|e| e.name == name)
            .into_iter()
            .collect()
    }

    fn names(&self) -> Vec<String> {
        vec![self.wz.name.clone()]
    }

    fn name(&self, gid: Gid) -> Option<String> {
        self.entity(gid).map(|e| e.name)
    }

    fn host(&self, gid: Gid) -> Option<String> {
        self.entity(gid).map(|e| e.host)
    }

    fn busy(&self, _: Gid) -> Option<bool> {
        None
    }

    fn hosts_heard(&self) -> usize {
        1
    }

    fn remote_entities(&self) -> usize {
        0
    }

    fn brief_state(&self, _: MsgId) -> Option<&'static str> {
        None
    }

    fn roster(&self, _: &HashMap<Gid, String>) -> (Vec<RosterEntry>, Vec<HostView>) {
        (Vec::new(), Vec::new())
    }

    fn spawn_target(&self, _: &LocalPlane, _: Option<&str>) -> Result<Target, FleetError> {
        Ok(Target::Here)
    }

    fn send<'a>(
        &'a self,
        _: &'a Arc<LocalPlane>,
        message: Message,
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        self.note(format!("send {}", message.body));
        Box::pin(async { Ok(Placement::Remote) })
    }

    fn send_in_turn<'a>(
        &'a self,
        _: &'a LocalPlane,
        message: &'a Message,
        _: (&'a str, u64),
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        self.note(format!("send in turn {}", message.body));
        Box::pin(async { Ok(Placement::Remote) })
    }

    fn keep<'a>(&'a self, _: &'a LocalPlane, notice: &'a Message) -> BoxFuture<'a, ()> {
        self.noted(format!("keep {}", notice.kind))
    }

    fn broadcast<'a>(
        &'a self,
        _: &'a LocalPlane,
        broadcast: Broadcast<'a>,
    ) -> BoxFuture<'a, Result<(usize, Vec<String>), FleetError>> {
        self.note(format!("broadcast {}", broadcast.text));
        Box::pin(async { Ok((0, Vec::new())) })
    }

    fn spawn<'a>(
        &'a self,
        _: &'a Arc<LocalPlane>,
        _: &'a Caller,
        _: SpawnRequest,
        _: &'a str,
        _: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<SpawnResult, FleetError>> {
        Box::pin(async { Err(FleetError::internal("no spawns here")) })
    }

    fn stop<'a>(
        &'a self,
        _: &'a Arc<LocalPlane>,
        _: &'a Caller,
        _: &'a Entity,
    ) -> BoxFuture<'a, Result<StopResult, FleetError>> {
        Box::pin(async { Err(FleetError::internal("no stops here")) })
    }

    fn sent_between<'a>(
        &'a self,
        _: &'a LocalPlane,
        _: MsgId,
        _: String,
        _: (Gid, Gid),
    ) -> BoxFuture<'a, bool> {
        Box::pin(async { false })
    }

    fn brief_going<'a>(&'a self, _: &'a LocalPlane, brief: &'a Message) -> BoxFuture<'a, ()> {
        self.noted(format!("brief going {}", brief.body))
    }

    fn briefs_settled<'a>(&'a self, _: &'a LocalPlane, briefs: Vec<MsgId>) -> BoxFuture<'a, ()> {
        self.noted(format!("briefs settled {}", briefs.len()))
    }

    fn injected<'a>(&'a self, _: &'a Arc<LocalPlane>, task: &'a Message) -> BoxFuture<'a, ()> {
        self.noted(format!("injected {}", task.body))
    }

    fn ask_abandoned<'a>(
        &'a self,
        _: &'a LocalPlane,
        _: &'a Message,
        turn: &'a str,
    ) -> BoxFuture<'a, ()> {
        self.noted(format!("ask abandoned {turn}"))
    }

    fn joined<'a>(&'a self, _: &'a Arc<LocalPlane>, gid: Gid) -> BoxFuture<'a, ()> {
        self.noted(format!("joined {gid}"))
    }

    fn left<'a>(&'a self, _: &'a Arc<LocalPlane>, entity: &'a Entity) -> BoxFuture<'a, ()> {
        self.noted(format!("left {}", entity.name))
    }

    fn sender_gone<'a>(&'a self, _: &'a LocalPlane, sender: Gid) -> BoxFuture<'a, ()> {
        self.noted(format!("sender gone {sender}"))
    }

    fn reaped(&self, _: &Arc<LocalPlane>, entity: Entity) {
        self.note(format!("reaped {}", entity.name));
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_for_another_hosts_worker_goes_through_the_seam_and_nothing_is_typed_here() {
    let afar = FakeAfar::new();
    let l = local_on(|_| {}, Some(afar.clone() as Arc<dyn Afar>)).await;
    let ct = CancellationToken::new();
    let sent = l
        .gateway
        .send(&l.lead, "wz", "for hostz".into(), Duration::ZERO, &ct)
        .await
        .unwrap();
    assert!(matches!(sent, SendResult::Pending { .. }), "{sent:?}");
    settle().await;
    // Its receipt is awaited before it goes, and it goes there, once.
    assert_eq!(afar.heard(), ["brief going for hostz", "send for hostz"]);
    assert!(l.panes.submitted(&l.pane).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_local_task_and_its_reply_never_reach_the_seam() {
    let afar = FakeAfar::new();
    let l = local_on(|_| {}, Some(afar.clone() as Arc<dyn Afar>)).await;
    let task = send(&l, "stay here").await;
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["stay here"]);
    l.gateway
        .reply(&l.worker, "done here".into(), Some(task))
        .await
        .unwrap();
    settle().await;
    assert!(afar.heard().is_empty(), "{:?}", afar.heard());
}

#[tokio::test(start_paused = true)]
async fn a_task_from_another_host_typed_in_here_is_told_there() {
    let afar = FakeAfar::new();
    let l = local_on(|_| {}, Some(afar.clone() as Arc<dyn Afar>)).await;
    let brief = Message::task(
        afar.wz.gid,
        l.worker.entity.gid,
        "from hostz".into(),
        TraceId::mint(),
        1,
    );
    let placement = l.gateway.deliver(brief).await.unwrap();
    assert_eq!(placement, Placement::Queue);
    settle().await;
    assert_eq!(l.panes.submitted(&l.pane), ["from hostz"]);
    // Its INJECTED receipt goes back to its sender's host.
    assert_eq!(afar.heard(), ["injected from hostz"]);
}
