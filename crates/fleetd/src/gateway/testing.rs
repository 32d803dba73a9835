//! What the gateway's own tests build on: a real gateway (its store on disk) over the pane host
//! and federated plane a test gives, with its lead `alice`, and a worker session of that lead.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleet_core::ownership::LeadRef;
use fleet_core::{Entity, Gid, Role};
use fleet_mux::PaneHost;
use fleet_store::{SqliteStore, Store};
use tokio_util::sync::CancellationToken;

use super::afar::Afar;
use super::session::PaneSession;
use super::{Federation, Gateway, LocalPlane, Parts, Workdirs};
use crate::config::{Config, ProfileConfig};
use crate::launch::{HostFacts, Launchers};

/// What a gateway of host `hosta` runs on: its store and state in `dir`, `panes`, and (when
/// given) `federation`.
fn parts_on(dir: &Path, panes: Arc<dyn PaneHost>, federation: Option<Arc<Federation>>) -> Parts {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("fleet.db")).unwrap());
    Parts {
        store,
        panes,
        launchers: Launchers::new(dir, HostFacts::default()),
        federation,
        coordinator: None,
        workdirs: Workdirs::new(dir, &[]).unwrap(),
        health: crate::health::Health::new(None),
        listener: Arc::default(),
    }
}

/// Declares the lead `alice` on `local`.
async fn alice_on(local: &LocalPlane) -> Entity {
    let gid = local
        .db
        .run(|s| s.ensure_lead("alice", "hosta", &[]))
        .await
        .unwrap();
    let alice = local
        .db
        .run(move |s| s.entity(gid))
        .await
        .unwrap()
        .unwrap()
        .entity;
    local.sessions.lock().add_lead(alice.clone());
    alice
}

/// A gateway of host `hosta` with `config`, its store and state in `dir`, over `panes` and
/// (when given) `federation`; and its lead `alice`, declared.
pub(super) async fn gateway_on(
    dir: &Path,
    config: Config,
    panes: Arc<dyn PaneHost>,
    federation: Option<Arc<Federation>>,
) -> (Arc<Gateway>, Entity) {
    let gateway = Gateway::new(
        Arc::new(config),
        "hosta".into(),
        "http://127.0.0.1:1/mcp".into(),
        parts_on(dir, panes, federation),
        CancellationToken::new(),
    )
    .unwrap();
    let alice = alice_on(&gateway.local).await;
    (gateway, alice)
}

/// [`gateway_on`]'s local plane alone, without a federation, the other hosts seen through
/// `afar` (a fake of the seam) when given.
pub(super) async fn plane_on(
    dir: &Path,
    config: Config,
    panes: Arc<dyn PaneHost>,
    afar: Option<Arc<dyn Afar>>,
) -> (Arc<LocalPlane>, Entity) {
    let local = LocalPlane::new(
        Arc::new(config),
        "hosta".into(),
        "http://127.0.0.1:1/mcp".into(),
        parts_on(dir, panes, None),
        afar,
        CancellationToken::new(),
    )
    .unwrap();
    let alice = alice_on(&local).await;
    (local, alice)
}

/// Lead `alice` of `hosta`, as a test names it without a store.
pub(super) fn alice() -> Entity {
    Entity {
        gid: Gid::mint(),
        name: "alice".into(),
        host: "hosta".into(),
        role: Role::Lead,
        profile: None,
        sandbox: None,
        profile_role: None,
        groups: vec![],
        parent: None,
    }
}

/// A spawning session of worker `w1` of `lead`, with `profile`, working in `/work`.
pub(super) fn worker_session(lead: &Entity, profile: ProfileConfig) -> PaneSession {
    let entity = Entity {
        gid: Gid::mint(),
        name: "w1".into(),
        host: "hosta".into(),
        role: Role::Worker,
        profile: Some(profile.name.clone()),
        sandbox: profile.sandbox(),
        profile_role: profile.role.clone(),
        groups: vec![],
        parent: Some(lead.gid),
    };
    PaneSession::spawning(
        entity,
        Arc::new(profile),
        PathBuf::from("/work"),
        LeadRef {
            name: lead.name.clone(),
            host: lead.host.clone(),
        },
        vec![],
    )
}
