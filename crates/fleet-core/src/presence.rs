//! One heartbeat per host: a gateway announces its entities inside its own host entry's
//! heartbeat, not one heartbeat per entity, so presence costs the broker a delivery per host
//! and round, however many entities each host runs.
//!
//! A round's heartbeat is an [`Account`]: now and then a *whole* one, naming every entity of the
//! host (any other the roster held of it left), and between them a change, naming the current
//! status of every entity that changed since the last whole one (so one change lost on the way
//! is made good by the next). An entity joining or leaving is told at once by a heartbeat of its
//! own change only. Each account names the whole one it builds on; a roster that did not hear
//! that one asks for a whole account ([`Account::resync`]), as a gateway whose roster queue is
//! new does. The [`Ledger`] decides what each heartbeat carries; it is pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::roster::{GONE, malformed_entity};
use crate::{Entity, Gid, MsgId};

/// A host's account of its entities, carried by its host entry's heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// The id of the whole account this one builds on (its own heartbeat's id, when whole).
    pub base: MsgId,
    /// Whether `states` names every entity of the host: one the roster holds of the host and
    /// `states` does not name has left.
    pub whole: bool,
    /// Entities and their statuses ([`GONE`] for one that left): all of them when whole, else
    /// those changed since `base` (or, told at once, since the last heartbeat).
    pub states: Vec<EntityState>,
    /// Asks every gateway that hears it for a whole account soon: this gateway's roster queue
    /// is new, or it heard a change built on a whole account it missed.
    #[serde(default)]
    pub resync: bool,
}

/// One entity as its host announces it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityState {
    /// The entity.
    pub entity: Entity,
    /// Its status ([`GONE`] when it left).
    pub status: String,
}

/// Which heartbeat is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// The round's heartbeat: whole every [`WHOLE_EVERY`] rounds, else every change since the
    /// last whole one.
    Regular,
    /// An entity joined or left: what changed since the last heartbeat, at once.
    Change,
    /// A whole account, now (the link came up, or another gateway asked for one).
    Whole,
}

/// Every how many rounds a regular heartbeat is whole.
pub const WHOLE_EVERY: u32 = 12;

/// What this gateway told the others of its entities.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Every entity and its status, as the last heartbeat left them.
    said: HashMap<Gid, (Entity, String)>,
    /// The entities changed since the last whole account (still here).
    touched: BTreeSet<Gid>,
    /// The entities that left since the last whole account.
    left: BTreeMap<Gid, Entity>,
    /// The id of the last whole account.
    base: Option<MsgId>,
    /// Regular rounds since the last whole account.
    rounds: u32,
    /// Whether the next heartbeat asks for whole accounts.
    resync: bool,
    /// Whether the host said it is gone: nothing more is told.
    closed: bool,
}

impl Ledger {
    /// A ledger that has told nothing yet: its first heartbeat is whole.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next heartbeat (of id `id`) asks every other gateway for a whole account.
    pub fn ask_resync(&mut self) {
        self.resync = true;
    }

    /// The host said it is gone: a heartbeat after that would bring it back.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Whether the host said it is gone.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// A whole account of the host's entities for one gateway that asked for it alone: what
    /// a gateway that heard every heartbeat told to all holds now (the last whole account and
    /// every change since), so the changes that follow, told to all, bring it up to date as
    /// they do the others. Nothing is noted as told. `None` before any whole account was told
    /// to all.
    pub fn snapshot(&self) -> Option<Account> {
        let base = self.base?;
        let mut states: Vec<EntityState> = self.said.values().map(state).collect();
        states.sort_by_key(|s| s.entity.gid);
        Some(Account {
            base,
            whole: true,
            states,
            resync: false,
        })
    }

    /// The account heartbeat `id` carries for `round`, the host's entities being `now` (each
    /// with its status).
    pub fn account(&mut self, id: MsgId, now: Vec<(Entity, String)>, round: Round) -> Account {
        let now: HashMap<Gid, (Entity, String)> =
            now.into_iter().map(|(e, s)| (e.gid, (e, s))).collect();
        let mut changed: Vec<Gid> = now
            .iter()
            .filter(|(gid, state)| self.said.get(gid) != Some(state))
            .map(|(gid, _)| *gid)
            .collect();
        changed.sort();
        let mut left: Vec<Entity> = self
            .said
            .iter()
            .filter(|(gid, _)| !now.contains_key(gid))
            .map(|(_, (entity, _))| entity.clone())
            .collect();
        left.sort_by_key(|e| e.gid);
        self.said = now;
        let whole = match round {
            Round::Whole => true,
            Round::Regular => self.base.is_none() || self.rounds + 1 >= WHOLE_EVERY,
            Round::Change => self.base.is_none(),
        };
        let resync = std::mem::take(&mut self.resync);
        if whole {
            self.base = Some(id);
            self.rounds = 0;
            self.touched.clear();
            self.left.clear();
            let mut states: Vec<EntityState> = self.said.values().map(state).collect();
            states.sort_by_key(|s| s.entity.gid);
            return Account {
                base: id,
                whole: true,
                states,
                resync,
            };
        }
        self.touched.extend(changed.iter().copied());
        self.left.extend(left.iter().map(|e| (e.gid, e.clone())));
        let (told, gone): (Vec<Gid>, Vec<Entity>) = if round == Round::Regular {
            self.rounds += 1;
            let gone = self.left.values().cloned().collect();
            (self.touched.iter().copied().collect(), gone)
        } else {
            (changed, left)
        };
        let states = gone
            .into_iter()
            .map(|entity| EntityState {
                entity,
                status: GONE.into(),
            })
            .chain(told.iter().filter_map(|gid| self.said.get(gid)).map(state))
            .collect();
        Account {
            base: self.base.unwrap_or(id),
            whole: false,
            states,
            resync,
        }
    }
}

/// What of `account`, heard from `host`, may be taken: every state of an entity of `host` that
/// is what a gateway announces. The others are left out, each with why (so one bad state costs
/// only itself, as one bad heartbeat of an older host's did).
pub fn sift(host: &str, account: &mut Account) -> Vec<String> {
    let mut why = Vec::new();
    account.states.retain(|s| {
        let wrong = if s.entity.host != host {
            Some(format!(
                "an entity of host '{}' in the account of '{host}'",
                s.entity.host.escape_debug()
            ))
        } else {
            malformed_entity(&s.entity, &s.status)
        };
        match wrong {
            Some(wrong) => {
                why.push(wrong);
                false
            }
            None => true,
        }
    });
    why
}

/// The state of `(entity, status)`.
fn state((entity, status): &(Entity, String)) -> EntityState {
    EntityState {
        entity: entity.clone(),
        status: status.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::tests::pairs;

    /// A worker of `hosta`.
    fn entity(name: &str) -> Entity {
        crate::roster::tests::entity(name, "hosta")
    }

    /// A ledger that told `a` idle, in a whole account.
    fn told_idle(a: &Entity) -> Ledger {
        let mut ledger = Ledger::new();
        ledger.account(
            MsgId::mint(),
            vec![(a.clone(), "idle".into())],
            Round::Regular,
        );
        ledger
    }

    fn told(account: &Account) -> Vec<(String, String)> {
        let mut told: Vec<(String, String)> = account
            .states
            .iter()
            .map(|s| (s.entity.name.clone(), s.status.clone()))
            .collect();
        told.sort();
        told
    }

    #[test]
    fn the_first_heartbeat_is_whole_and_later_ones_carry_what_changed_since_the_whole_one() {
        let (a, b) = (entity("a"), entity("b"));
        let mut ledger = Ledger::new();
        let first = MsgId::mint();
        let whole = ledger.account(
            first,
            vec![(a.clone(), "idle".into()), (b.clone(), "idle".into())],
            Round::Regular,
        );
        assert!(whole.whole);
        assert_eq!(whole.base, first);
        assert_eq!(told(&whole), pairs(&[("a", "idle"), ("b", "idle")]));
        // Nothing changed: a change of nothing, built on the whole one.
        let quiet = ledger.account(
            MsgId::mint(),
            vec![(a.clone(), "idle".into()), (b.clone(), "idle".into())],
            Round::Regular,
        );
        assert!(!quiet.whole);
        assert_eq!(quiet.base, first);
        assert!(quiet.states.is_empty());
        // a goes busy: told; and told again next round although it did not change since (a
        // roster that missed the last heartbeat hears it from this one).
        let busy = vec![(a.clone(), "busy".into()), (b.clone(), "idle".into())];
        let once = ledger.account(MsgId::mint(), busy.clone(), Round::Regular);
        assert_eq!(told(&once), pairs(&[("a", "busy")]));
        let again = ledger.account(MsgId::mint(), busy, Round::Regular);
        assert_eq!(told(&again), pairs(&[("a", "busy")]));
        // b leaves: gone, from then on until the next whole account.
        let b_left = vec![(a.clone(), "busy".into())];
        let gone = ledger.account(MsgId::mint(), b_left.clone(), Round::Regular);
        assert_eq!(told(&gone), pairs(&[("a", "busy"), ("b", GONE)]));
        assert_eq!(gone.base, first);
    }

    #[test]
    fn every_twelfth_round_is_whole_and_forgets_what_changed_before_it() {
        let a = entity("a");
        let mut ledger = told_idle(&a);
        let busy = vec![(a.clone(), "busy".into())];
        for _ in 1..WHOLE_EVERY {
            let change = ledger.account(MsgId::mint(), busy.clone(), Round::Regular);
            assert!(!change.whole);
            assert_eq!(told(&change), pairs(&[("a", "busy")]));
        }
        let id = MsgId::mint();
        let whole = ledger.account(id, busy.clone(), Round::Regular);
        assert!(whole.whole);
        assert_eq!(whole.base, id);
        let after = ledger.account(MsgId::mint(), busy, Round::Regular);
        assert!(after.states.is_empty());
        assert_eq!(after.base, id);
    }

    #[test]
    fn a_join_or_a_leave_is_told_at_once_alone_and_again_in_the_next_round() {
        let (a, b, c) = (entity("a"), entity("b"), entity("c"));
        let mut ledger = Ledger::new();
        ledger.account(
            MsgId::mint(),
            vec![(a.clone(), "idle".into()), (b.clone(), "busy".into())],
            Round::Regular,
        );
        ledger.account(
            MsgId::mint(),
            vec![(a.clone(), "idle".into()), (b.clone(), "idle".into())],
            Round::Regular,
        );
        // c joins: the change alone (b's earlier change is not repeated).
        let now = vec![
            (a.clone(), "idle".into()),
            (b.clone(), "idle".into()),
            (c.clone(), "spawning".into()),
        ];
        let joined = ledger.account(MsgId::mint(), now.clone(), Round::Change);
        assert!(!joined.whole);
        assert_eq!(told(&joined), pairs(&[("c", "spawning")]));
        // a leaves: alone too.
        let left = ledger.account(MsgId::mint(), now[1..].to_vec(), Round::Change);
        assert_eq!(told(&left), pairs(&[("a", GONE)]));
        // The round's heartbeat repeats everything since the whole one.
        let round = ledger.account(MsgId::mint(), now[1..].to_vec(), Round::Regular);
        assert_eq!(
            told(&round),
            pairs(&[("a", GONE), ("b", "idle"), ("c", "spawning")])
        );
    }

    #[test]
    fn a_whole_account_on_demand_carries_the_asking_once() {
        let a = entity("a");
        let mut ledger = told_idle(&a);
        ledger.ask_resync();
        let id = MsgId::mint();
        let whole = ledger.account(id, vec![(a.clone(), "busy".into())], Round::Whole);
        assert!(whole.whole && whole.resync);
        assert_eq!(told(&whole), pairs(&[("a", "busy")]));
        let next = ledger.account(MsgId::mint(), vec![(a, "busy".into())], Round::Regular);
        assert!(!next.resync);
        assert!(next.states.is_empty());
        assert_eq!(next.base, id);
    }

    #[test]
    fn sifting_leaves_out_each_state_not_the_hosts_own_to_announce_and_keeps_the_rest() {
        let mut ledger = Ledger::new();
        let (mine, mut theirs, mut bad) = (entity("a"), entity("x"), entity("b"));
        theirs.host = "hostc\x1b[2J".into();
        bad.name = "b b".into();
        let mut account = ledger.account(
            MsgId::mint(),
            vec![
                (mine.clone(), "idle".into()),
                (theirs, "idle".into()),
                (bad, "idle".into()),
                (entity("c"), "dancing".into()),
            ],
            Round::Whole,
        );
        let why = sift("hosta", &mut account);
        assert_eq!(told(&account), pairs(&[("a", "idle")]));
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(why.iter().any(|w| w.contains("hostc\\u{1b}")), "{why:?}");
        assert!(why.iter().all(|w| !w.contains('\x1b')), "{why:?}");
    }

    #[test]
    fn a_snapshot_for_one_builds_on_the_whole_account_all_heard_and_changes_nothing() {
        let (a, b) = (entity("a"), entity("b"));
        let mut ledger = Ledger::new();
        assert_eq!(ledger.snapshot(), None);
        let id = MsgId::mint();
        ledger.account(id, vec![(a.clone(), "idle".into())], Round::Regular);
        ledger.account(
            MsgId::mint(),
            vec![(a.clone(), "busy".into()), (b.clone(), "idle".into())],
            Round::Change,
        );
        // What every gateway that heard it all holds: a busy, b idle.
        let snapshot = ledger.snapshot().unwrap();
        assert!(snapshot.whole && !snapshot.resync);
        assert_eq!(snapshot.base, id);
        assert_eq!(told(&snapshot), pairs(&[("a", "busy"), ("b", "idle")]));
        // a went back to idle, and b left, before the next round: the next change tells the
        // asker so, as it tells everyone.
        let change = ledger.account(
            MsgId::mint(),
            vec![(a.clone(), "idle".into())],
            Round::Regular,
        );
        assert_eq!(change.base, id);
        assert_eq!(told(&change), pairs(&[("a", "idle"), ("b", GONE)]));
    }

    #[test]
    fn a_closed_ledger_says_so() {
        let mut ledger = Ledger::new();
        assert!(!ledger.is_closed());
        ledger.close();
        assert!(ledger.is_closed());
    }

    #[test]
    fn a_change_before_any_whole_account_is_whole() {
        let a = entity("a");
        let mut ledger = Ledger::new();
        let id = MsgId::mint();
        let first = ledger.account(id, vec![(a, "spawning".into())], Round::Change);
        assert!(first.whole);
        assert_eq!(first.base, id);
    }

    #[test]
    fn an_account_reads_back_from_its_json() {
        let mut ledger = Ledger::new();
        let account = ledger.account(
            MsgId::mint(),
            vec![(entity("a"), "idle".into())],
            Round::Whole,
        );
        let json = serde_json::to_string(&account).unwrap();
        assert_eq!(serde_json::from_str::<Account>(&json).unwrap(), account);
        // One that does not say whether it asks, does not.
        let without: serde_json::Value = serde_json::json!({
            "base": account.base, "whole": true, "states": [],
        });
        assert!(!serde_json::from_value::<Account>(without).unwrap().resync);
    }
}
