//! The remote roster: what this gateway knows of other hosts and their entities, merged from
//! their presence heartbeats, read `unreachable` when they go quiet (a partition looks like
//! that: the host is there, its broker link is not), forgotten when they stay quiet past what
//! the broker would keep for them, and capped so that a flood of forged heartbeats grows no
//! memory. Pure: the time of each heartbeat comes in as a value (a
//! monotonic instant for expiry, Unix ms for showing), and nothing here reads a clock.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bounds::{Full, RosterCaps, RosterCount, admit_remote_entity, admit_remote_host};
use crate::entity::validate_name;
use crate::presence::Account;
use crate::receipts::Standing;
use crate::{Entity, Gid, MsgId};

/// The status a heartbeat carries when its entity (or host) leaves.
pub const GONE: &str = "gone";

/// What a presence heartbeat carries (its body, JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    /// The entity; none for the host's own entry.
    pub entity: Option<Entity>,
    /// Its status ([`GONE`] when it leaves).
    pub status: String,
    /// For the host entry: the profiles it can spawn.
    #[serde(default)]
    pub profiles: Vec<String>,
    /// For the host entry: the model family (its maker's id, `anthropic`, `openai` …) of each of
    /// its profiles whose family it can name, by profile; a lead consulting an architect slot on
    /// that host learns whose model answered. An older host sends none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub families: BTreeMap<String, String>,
    /// For the host entry: the host's entities, announced with it (`fleet_core::presence`).
    /// An older host announces each entity by a heartbeat of its own, and sends none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<Account>,
}

/// A remote entity as the roster last heard of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteEntry {
    /// The entity, as its host announced it.
    pub entity: Entity,
    /// Its status, as its host announced it.
    pub status: String,
    /// When it was last heard of (for expiry).
    pub heard: Instant,
    /// When it was last heard of, Unix ms (for showing).
    pub heard_ms: i64,
    /// Since when (Unix ms) it has been unreachable: its host went quiet for the ttl. `None`
    /// while its host is heard.
    pub unreachable_since_ms: Option<i64>,
}

/// The status shown for an entity (or host) whose host went quiet.
pub const UNREACHABLE: &str = "unreachable";

impl RemoteEntry {
    /// Whether its host says it cannot take a task now (working, asking, stopped on a dialog,
    /// spawning, or its pane host cannot tell), so a brief for it waits on the broker and the
    /// receipt bound waits too.
    pub fn is_busy(&self) -> bool {
        matches!(
            self.status.as_str(),
            "busy" | "asking" | "blocked" | "spawning" | "unknown"
        )
    }

    /// Whether a brief for it waits on the broker now: it is busy, or its host cannot be heard
    /// (nothing takes the brief off its inbox meanwhile).
    pub fn waits(&self) -> bool {
        self.unreachable_since_ms.is_some() || self.is_busy()
    }

    /// Its status as shown: [`UNREACHABLE`] while its host is quiet, else what its host said.
    pub fn shown_status(&self) -> &str {
        if self.unreachable_since_ms.is_some() {
            UNREACHABLE
        } else {
            &self.status
        }
    }
}

/// A remote host as its gateway entry last told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteHost {
    /// The profiles it can spawn.
    pub profiles: Vec<String>,
    /// The model family of each profile whose family it named.
    pub families: BTreeMap<String, String>,
    /// When it was last heard of (for expiry).
    pub heard: Instant,
    /// When it was last heard of, Unix ms (for showing).
    pub heard_ms: i64,
    /// Since when (Unix ms) it has been quiet past the ttl; `None` while it is heard.
    pub unreachable_since_ms: Option<i64>,
    /// The whole account of its entities that this roster last heard.
    pub base: Option<MsgId>,
}

/// What a heartbeat did to the roster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// An entry was added or refreshed.
    Merged,
    /// Merged, but the account built on a whole one this roster did not hear: what the host
    /// said since is in, what it said in that one may be missing (ask for a whole account).
    Stale,
    /// An entry (or a host with all its entries) left.
    Left,
    /// Ignored: the roster is at a cap. `ignored` counts every such heartbeat so far.
    OverCap {
        /// The cap that was reached.
        full: Full,
        /// How many heartbeats the caps made the roster ignore, this one included.
        ignored: u64,
    },
    /// Ignored: a host announced an entity of another host.
    NotItsOwn {
        /// The host the entity claims.
        claimed: String,
    },
    /// Ignored: the heartbeat holds what no gateway announces (a name, status, group,
    /// profile, sandbox or profile role that is not one); why.
    Malformed(String),
}

/// The statuses a heartbeat may announce for an entity: a session's, or `unknown` (its pane
/// host cannot tell).
const ENTITY_STATUSES: [&str; 8] = [
    "spawning", "idle", "busy", "asking", "blocked", "stopping", GONE, "unknown",
];

/// Why `presence` is not a heartbeat a gateway sends, if it is not: every name in it (an
/// entity's, its profile's, groups', sandbox's and profile role's, the host's profiles') is a
/// valid name, an entity's status is one a gateway announces. What another host announced is
/// shown to leads and printed on operators' terminals; nothing else is taken.
pub fn malformed(presence: &Presence) -> Option<String> {
    let named = |what: &str, name: &str| validate_name(what, name).err().map(|e| e.message);
    if let Some(entity) = &presence.entity
        && let Some(why) = malformed_entity(entity, &presence.status)
    {
        return Some(why);
    }
    if let Some(account) = &presence.account {
        if presence.entity.is_some() {
            return Some("an entity's heartbeat carrying an account of its host".into());
        }
        if let Some(why) = account
            .states
            .iter()
            .find_map(|s| malformed_entity(&s.entity, &s.status))
        {
            return Some(why);
        }
    }
    if presence.profiles.len() > MAX_HOST_PROFILES {
        return Some(format!(
            "{} profiles, more than the {MAX_HOST_PROFILES} a host may announce",
            presence.profiles.len()
        ));
    }
    presence
        .profiles
        .iter()
        .find_map(|name| named("profile", name))
        .or_else(|| {
            presence.families.iter().find_map(|(profile, family)| {
                if !presence.profiles.contains(profile) {
                    return Some(format!(
                        "a model family for '{}', which is none of its profiles",
                        profile.escape_debug()
                    ));
                }
                named("model family", family)
            })
        })
}

/// Why `entity`, announced with `status`, is not what a gateway announces, if it is not.
pub fn malformed_entity(entity: &Entity, status: &str) -> Option<String> {
    let named = |what: &str, name: &str| validate_name(what, name).err().map(|e| e.message);
    if let Some(why) = named("entity name", &entity.name) {
        return Some(why);
    }
    if !ENTITY_STATUSES.contains(&status) {
        return Some(format!(
            "status '{}' is none of {}",
            status.escape_debug(),
            ENTITY_STATUSES.join(", ")
        ));
    }
    entity
        .profile
        .iter()
        .chain(&entity.groups)
        .chain(&entity.sandbox)
        .chain(&entity.profile_role)
        .find_map(|name| named("profile, group, sandbox or role", name))
}

/// The most profiles a host's heartbeat may announce (a config declares a handful).
pub const MAX_HOST_PROFILES: usize = 256;

/// The remote roster.
#[derive(Debug)]
pub struct Roster {
    /// The caps on what it keeps.
    caps: RosterCaps,
    /// How long an entry is heard without a heartbeat; past it, it is unreachable.
    ttl: Duration,
    /// How long an entry is kept without a heartbeat: past it, it is forgotten.
    forget: Duration,
    /// Remote entities by gid.
    entities: HashMap<Gid, RemoteEntry>,
    /// The gids of [`Roster::entities`] by name: a name is looked up, never searched for.
    names: HashMap<String, Vec<Gid>>,
    /// The gids of [`Roster::entities`] by host.
    by_host: HashMap<String, HashSet<Gid>>,
    /// Remote hosts by host id.
    hosts: HashMap<String, RemoteHost>,
    /// How many heartbeats the caps made it ignore.
    ignored: u64,
    /// Entities that left or went quiet, most recent last (at most [`MAX_DEPARTED`]): a
    /// message one sent before it left may still be on its way, and its sender must still be
    /// known for what it is.
    departed: VecDeque<Entity>,
    /// How many times each gid is in [`Roster::departed`]: one not there is looked up in no
    /// time.
    departed_count: HashMap<Gid, usize>,
}

/// The most departed entities remembered.
pub const MAX_DEPARTED: usize = 4096;

impl Roster {
    /// An empty roster under `caps`, whose entries read unreachable after `ttl` without a
    /// heartbeat and are forgotten after `forget` (at least `ttl`).
    pub fn new(caps: RosterCaps, ttl: Duration, forget: Duration) -> Self {
        Self {
            caps,
            ttl,
            forget: forget.max(ttl),
            entities: HashMap::new(),
            names: HashMap::new(),
            by_host: HashMap::new(),
            hosts: HashMap::new(),
            ignored: 0,
            departed: VecDeque::new(),
            departed_count: HashMap::new(),
        }
    }

    /// Keeps `entry`, in place of any entry of its gid.
    fn put(&mut self, entry: RemoteEntry) {
        let gid = entry.entity.gid;
        let (name, host) = (entry.entity.name.clone(), entry.entity.host.clone());
        if let Some(old) = self.entities.insert(gid, entry) {
            if old.entity.name != name {
                self.unname(&old.entity);
            }
            if old.entity.host != host {
                self.unhost(&old.entity);
            }
        }
        let gids = self.names.entry(name).or_default();
        if !gids.contains(&gid) {
            gids.push(gid);
        }
        self.by_host.entry(host).or_default().insert(gid);
    }

    /// Lets the entry of `gid` go, remembering it as departed.
    fn drop_entry(&mut self, gid: Gid) {
        if let Some(left) = self.entities.remove(&gid) {
            self.unname(&left.entity);
            self.unhost(&left.entity);
            self.depart(left.entity);
        }
    }

    /// Lets every entry `leaves` says go, remembering each as departed.
    fn drop_entries(&mut self, leaves: impl Fn(&RemoteEntry) -> bool) {
        let (left, kept) = std::mem::take(&mut self.entities)
            .into_iter()
            .partition::<HashMap<_, _>, _>(|(_, e)| leaves(e));
        self.entities = kept;
        for (_, entry) in left {
            self.unname(&entry.entity);
            self.unhost(&entry.entity);
            self.depart(entry.entity);
        }
    }

    /// Takes `entity` out of the host index.
    fn unhost(&mut self, entity: &Entity) {
        if let Some(gids) = self.by_host.get_mut(&entity.host) {
            gids.remove(&entity.gid);
            if gids.is_empty() {
                self.by_host.remove(&entity.host);
            }
        }
    }

    /// Takes `entity` out of the name index.
    fn unname(&mut self, entity: &Entity) {
        if let Some(gids) = self.names.get_mut(&entity.name) {
            gids.retain(|g| *g != entity.gid);
            if gids.is_empty() {
                self.names.remove(&entity.name);
            }
        }
    }

    /// The entries called `name`.
    pub fn named(&self, name: &str) -> impl Iterator<Item = &RemoteEntry> {
        self.names
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|gid| self.entities.get(gid))
    }

    /// Every name in the roster, once each.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// Remembers that `entity` left.
    fn depart(&mut self, entity: Entity) {
        if self.departed.len() >= MAX_DEPARTED
            && let Some(oldest) = self.departed.pop_front()
            && let Some(n) = self.departed_count.get_mut(&oldest.gid)
        {
            *n -= 1;
            if *n == 0 {
                self.departed_count.remove(&oldest.gid);
            }
        }
        *self.departed_count.entry(entity.gid).or_default() += 1;
        self.departed.push_back(entity);
    }

    /// An entity that left or went quiet, as its host last announced it (the most recent, if
    /// it left more than once).
    pub fn departed(&self, gid: Gid) -> Option<&Entity> {
        if !self.departed_count.contains_key(&gid) {
            return None;
        }
        self.departed.iter().rev().find(|e| e.gid == gid)
    }

    /// Merges a heartbeat `host` sent, heard at `now` (`now_ms` Unix ms). An entity of
    /// another host is ignored; a new entry over a cap is ignored (a known one is always
    /// refreshed: a cap never drops what was accepted); a `gone` host takes its entities along;
    /// a new entity of a host replaces the host's entry of the same name. A host entry carrying
    /// an account of the host's entities merges it ([`Roster::hear_account`]).
    pub fn hear(&mut self, host: &str, presence: Presence, now: Instant, now_ms: i64) -> Heard {
        if let Some(why) = malformed(&presence) {
            return Heard::Malformed(why);
        }
        let gone = presence.status == GONE;
        match presence.entity {
            Some(entity) if entity.host != host => Heard::NotItsOwn {
                claimed: entity.host,
            },
            Some(entity) if gone => {
                self.drop_entry(entity.gid);
                Heard::Left
            }
            Some(entity) => self.merge(host, entity, presence.status, (now, now_ms)),
            None if gone => {
                self.hosts.remove(host);
                self.drop_entries(|e| e.entity.host == host);
                Heard::Left
            }
            None => {
                if let Some(claimed) = presence
                    .account
                    .iter()
                    .flat_map(|a| &a.states)
                    .find_map(|s| (s.entity.host != host).then(|| s.entity.host.clone()))
                {
                    return Heard::NotItsOwn { claimed };
                }
                if let Err(full) = admit_remote_host(self.count(host), self.caps) {
                    return self.over_cap(full);
                }
                let base = self.hosts.get(host).and_then(|h| h.base);
                let entry = RemoteHost {
                    profiles: presence.profiles,
                    families: presence.families,
                    heard: now,
                    heard_ms: now_ms,
                    unreachable_since_ms: None,
                    base,
                };
                self.hosts.insert(host.to_string(), entry);
                match presence.account {
                    Some(account) => self.hear_account(host, account, (now, now_ms)),
                    None => Heard::Merged,
                }
            }
        }
    }

    /// Merges `entity` of `host`, announced `status` at `heard`.
    fn merge(
        &mut self,
        host: &str,
        entity: Entity,
        status: String,
        heard: (Instant, i64),
    ) -> Heard {
        // A gid another host announced stays that host's.
        if let Some(held) = self.entities.get(&entity.gid)
            && held.entity.host != host
        {
            return Heard::NotItsOwn {
                claimed: held.entity.host.clone(),
            };
        }
        // A host's live entities hold distinct names: another entry of this host under
        // this name is one that went without a word (its gateway crashed and reaped it
        // on restart), and this one takes its place.
        let superseded: Vec<Gid> = self
            .named(&entity.name)
            .filter(|e| e.entity.host == host && e.entity.gid != entity.gid)
            .map(|e| e.entity.gid)
            .collect();
        for gid in superseded {
            self.drop_entry(gid);
        }
        if !self.entities.contains_key(&entity.gid)
            && let Err(full) = admit_remote_entity(self.count(host), self.caps)
        {
            return self.over_cap(full);
        }
        self.put(RemoteEntry {
            entity,
            status,
            heard: heard.0,
            heard_ms: heard.1,
            unreachable_since_ms: None,
        });
        Heard::Merged
    }

    /// Merges the account `host` gave of its entities with its own heartbeat (heard at
    /// `heard`), whose entry is in: a whole one lets every entity of the host it does not name
    /// go; a change merges what it names. Every entity of the host is heard with it, unless it
    /// is [`Stale`]: a change built on a whole account this roster did not hear (then only what
    /// it names is heard, so an entity whose leaving was in the missed one goes quiet, and is
    /// forgotten, if no whole account comes).
    ///
    /// [`Stale`]: Heard::Stale
    fn hear_account(&mut self, host: &str, account: Account, heard: (Instant, i64)) -> Heard {
        let stale = {
            let Some(entry) = self.hosts.get_mut(host) else {
                return Heard::Merged;
            };
            let stale = !account.whole && entry.base != Some(account.base);
            if account.whole {
                entry.base = Some(account.base);
            }
            stale
        };
        if account.whole {
            let named: HashSet<Gid> = account.states.iter().map(|s| s.entity.gid).collect();
            let left: Vec<Gid> = self
                .by_host
                .get(host)
                .into_iter()
                .flatten()
                .filter(|gid| !named.contains(gid))
                .copied()
                .collect();
            for gid in left {
                self.drop_entry(gid);
            }
        }
        let mut over = None;
        for state in account.states {
            if state.status == GONE {
                if self
                    .entities
                    .get(&state.entity.gid)
                    .is_some_and(|e| e.entity.host == host)
                {
                    self.drop_entry(state.entity.gid);
                }
            } else if let over_cap @ Heard::OverCap { .. } =
                self.merge(host, state.entity, state.status, heard)
            {
                over = Some(over_cap);
            }
        }
        if stale {
            return Heard::Stale;
        }
        // The host's heartbeat is each of its entities'.
        for gid in self.by_host.get(host).into_iter().flatten() {
            if let Some(entry) = self.entities.get_mut(gid) {
                (entry.heard, entry.heard_ms) = heard;
                entry.unreachable_since_ms = None;
            }
        }
        over.unwrap_or(Heard::Merged)
    }

    fn over_cap(&mut self, full: Full) -> Heard {
        self.ignored += 1;
        Heard::OverCap {
            full,
            ignored: self.ignored,
        }
    }

    /// At `now` (`now_ms` Unix ms): marks every entry not heard of within the ttl
    /// unreachable (since now), and forgets every one not heard of within `forget`.
    pub fn expire(&mut self, now: Instant, now_ms: i64) {
        let (ttl, forget) = (self.ttl, self.forget);
        self.drop_entries(|e| now.saturating_duration_since(e.heard) >= forget);
        self.hosts
            .retain(|_, h| now.saturating_duration_since(h.heard) < forget);
        let quiet = |heard: Instant| now.saturating_duration_since(heard) >= ttl;
        for entry in self.entities.values_mut() {
            if quiet(entry.heard) && entry.unreachable_since_ms.is_none() {
                entry.unreachable_since_ms = Some(now_ms);
            }
        }
        for host in self.hosts.values_mut() {
            if quiet(host.heard) && host.unreachable_since_ms.is_none() {
                host.unreachable_since_ms = Some(now_ms);
            }
        }
    }

    /// What the roster holds, as a heartbeat from `host` finds it.
    fn count(&self, host: &str) -> RosterCount {
        let hosts = self.hosts.len()
            + self
                .by_host
                .keys()
                .filter(|h| !self.hosts.contains_key(*h))
                .count();
        RosterCount {
            hosts,
            host_known: self.hosts.contains_key(host) || self.by_host.contains_key(host),
            entities_of_host: self.by_host.get(host).map_or(0, HashSet::len),
        }
    }

    /// The remote entity `gid`.
    pub fn entity(&self, gid: Gid) -> Option<&RemoteEntry> {
        self.entities.get(&gid)
    }

    /// Every remote entity, in no order.
    pub fn entities(&self) -> impl Iterator<Item = &RemoteEntry> {
        self.entities.values()
    }

    /// Every remote host, heard or unreachable, in no order.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, &RemoteHost)> {
        self.hosts.iter().map(|(host, h)| (host.as_str(), h))
    }

    /// The remote hosts heard within the ttl, in no order.
    pub fn hosts_heard(&self) -> impl Iterator<Item = &str> {
        self.hosts()
            .filter(|(_, h)| h.unreachable_since_ms.is_none())
            .map(|(host, _)| host)
    }

    /// How remote entity `gid` stands at `now` for the bound of a brief sent to it: not heard
    /// (unreachable, or its heartbeat `overdue`: its host may be cut off already, and whether
    /// it took the brief is not known until it is heard), busy, or free. One the roster does not
    /// know (forgotten, or never announced) is free: nothing will say more of it.
    pub fn standing(&self, gid: Gid, now: Instant, overdue: Duration) -> Standing {
        match self.entities.get(&gid) {
            Some(e)
                if e.unreachable_since_ms.is_some()
                    || now.saturating_duration_since(e.heard) > overdue =>
            {
                Standing::Unheard
            }
            Some(e) if e.is_busy() => Standing::Busy,
            _ => Standing::Free,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Role;
    use crate::bounds::{REMOTE_ENTITIES_KEY, REMOTE_HOSTS_KEY};

    const TTL: Duration = Duration::from_secs(3);
    const FORGET: Duration = Duration::from_secs(60);
    const OVERDUE: Duration = Duration::from_secs(2);

    fn roster(hosts: usize, entities_per_host: usize) -> Roster {
        Roster::new(
            RosterCaps {
                hosts,
                entities_per_host,
            },
            TTL,
            FORGET,
        )
    }

    /// A worker of `host` called `name`.
    pub(crate) fn entity(name: &str, host: &str) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: host.into(),
            role: Role::Worker,
            profile: Some("sim".into()),
            sandbox: None,
            profile_role: None,
            groups: Vec::new(),
            parent: None,
        }
    }

    fn beat(entity: Option<&Entity>, status: &str) -> Presence {
        Presence {
            families: BTreeMap::new(),
            entity: entity.cloned(),
            status: status.into(),
            profiles: vec!["sim".into()],
            account: None,
        }
    }

    /// The host entry's heartbeat carrying an account of `states` built on `base`.
    fn account(base: MsgId, whole: bool, states: &[(&Entity, &str)]) -> Presence {
        Presence {
            account: Some(Account {
                base,
                whole,
                states: states
                    .iter()
                    .map(|(e, s)| crate::presence::EntityState {
                        entity: (*e).clone(),
                        status: s.to_string(),
                    })
                    .collect(),
                resync: false,
            }),
            ..beat(None, "up")
        }
    }

    fn statuses(roster: &Roster) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = roster
            .entities()
            .map(|e| (e.entity.name.clone(), e.shown_status().to_string()))
            .collect();
        all.sort();
        all
    }

    /// `of`, owned.
    pub(crate) fn pairs(of: &[(&str, &str)]) -> Vec<(String, String)> {
        of.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn a_hosts_account_merges_its_entities_and_a_whole_one_lets_the_unnamed_go() {
        let t0 = Instant::now();
        let mut roster = roster(4, 8);
        let (a, b, c) = (
            entity("a", "hostb"),
            entity("b", "hostb"),
            entity("c", "hostb"),
        );
        let other = entity("o", "hostc");
        roster.hear("hostc", beat(Some(&other), "idle"), t0, 0);
        let base = MsgId::mint();
        let whole = account(base, true, &[(&a, "idle"), (&b, "idle")]);
        assert_eq!(roster.hear("hostb", whole, t0, 1), Heard::Merged);
        assert_eq!(
            statuses(&roster),
            pairs(&[("a", "idle"), ("b", "idle"), ("o", "idle")])
        );
        // A change: a busy, c joined, b left.
        let change = account(base, false, &[(&b, GONE), (&a, "busy"), (&c, "spawning")]);
        assert_eq!(roster.hear("hostb", change, t0, 2), Heard::Merged);
        assert_eq!(
            statuses(&roster),
            pairs(&[("a", "busy"), ("c", "spawning"), ("o", "idle")])
        );
        assert_eq!(roster.departed(b.gid).map(|e| e.gid), Some(b.gid));
        // A whole one that names only c: a goes; the other host's entity stays.
        let again = MsgId::mint();
        let whole = account(again, true, &[(&c, "idle")]);
        assert_eq!(roster.hear("hostb", whole, t0, 3), Heard::Merged);
        assert_eq!(statuses(&roster), pairs(&[("c", "idle"), ("o", "idle")]));
        assert!(named(&roster, "a").is_empty());
        // The host leaving takes c along.
        assert_eq!(roster.hear("hostb", beat(None, GONE), t0, 4), Heard::Left);
        assert_eq!(statuses(&roster), pairs(&[("o", "idle")]));
    }

    #[test]
    fn a_hosts_heartbeat_is_each_of_its_entities_heartbeat() {
        let t0 = Instant::now();
        let mut roster = roster(4, 8);
        let a = entity("a", "hostb");
        let base = MsgId::mint();
        roster.hear("hostb", account(base, true, &[(&a, "idle")]), t0, 1);
        // Past the ttl with no word: unreachable.
        let later = t0 + TTL;
        roster.expire(later, 2);
        assert_eq!(statuses(&roster), pairs(&[("a", UNREACHABLE)]));
        // A change that does not name a: its host is heard, so is a.
        let heard = later + Duration::from_millis(1);
        assert_eq!(
            roster.hear("hostb", account(base, false, &[]), heard, 3),
            Heard::Merged
        );
        assert_eq!(statuses(&roster), pairs(&[("a", "idle")]));
        let entry = roster.entity(a.gid).unwrap();
        assert_eq!((entry.heard, entry.heard_ms), (heard, 3));
        assert_eq!(roster.standing(a.gid, heard, OVERDUE), Standing::Free);
    }

    #[test]
    fn a_change_built_on_a_whole_account_not_heard_is_merged_and_said_stale() {
        let t0 = Instant::now();
        let mut roster = roster(4, 8);
        let a = entity("a", "hostb");
        // A roster that never heard a whole account of hostb.
        let change = account(MsgId::mint(), false, &[(&a, "busy")]);
        assert_eq!(roster.hear("hostb", change, t0, 1), Heard::Stale);
        assert_eq!(statuses(&roster), pairs(&[("a", "busy")]));
        // The whole one comes; a change on it is not stale.
        let base = MsgId::mint();
        roster.hear("hostb", account(base, true, &[(&a, "idle")]), t0, 2);
        let change = account(base, false, &[(&a, "busy")]);
        assert_eq!(roster.hear("hostb", change, t0, 3), Heard::Merged);
        // hostb restarted (a new whole account) and this roster missed it.
        let missed = account(MsgId::mint(), false, &[]);
        assert_eq!(roster.hear("hostb", missed, t0, 4), Heard::Stale);
    }

    #[test]
    fn an_account_naming_another_hosts_entity_or_a_bad_status_is_ignored_whole() {
        let t0 = Instant::now();
        let mut roster = roster(4, 8);
        let (mine, theirs) = (entity("a", "hostb"), entity("x", "hostc"));
        let base = MsgId::mint();
        let foreign = account(base, true, &[(&mine, "idle"), (&theirs, "idle")]);
        assert_eq!(
            roster.hear("hostb", foreign, t0, 1),
            Heard::NotItsOwn {
                claimed: "hostc".into()
            }
        );
        assert!(roster.entities().next().is_none());
        assert!(roster.hosts().next().is_none(), "the host entry was taken");
        let bad = account(base, true, &[(&mine, "idle\x1b[2J")]);
        assert!(matches!(
            roster.hear("hostb", bad, t0, 1),
            Heard::Malformed(why) if why.contains("status")
        ));
        let mut renamed = mine.clone();
        renamed.name = "a b".into();
        let bad = account(base, true, &[(&renamed, "idle")]);
        assert!(matches!(
            roster.hear("hostb", bad, t0, 1),
            Heard::Malformed(_)
        ));
        let mut on_entity = account(base, true, &[]);
        on_entity.entity = Some(mine);
        on_entity.status = "idle".into();
        assert!(matches!(
            roster.hear("hostb", on_entity, t0, 1),
            Heard::Malformed(_)
        ));
        assert!(roster.entities().next().is_none());
    }

    #[test]
    fn an_account_over_the_cap_keeps_what_fits_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut roster = roster(4, 2);
        let f: Vec<Entity> = (1..=4).map(|i| entity(&format!("f{i}"), "hostf")).collect();
        let states: Vec<(&Entity, &str)> = f.iter().map(|e| (e, "idle")).collect();
        let Heard::OverCap { full, ignored } =
            roster.hear("hostf", account(MsgId::mint(), true, &states), t0, 1)
        else {
            panic!("four entities were kept under a cap of two");
        };
        assert_eq!((full.key, ignored), (REMOTE_ENTITIES_KEY, 2));
        assert_eq!(roster.entities().count(), 2);
        // Named again, all four: what was kept is refreshed and stays, the rest stays out.
        let mut kept: Vec<Gid> = roster.entities().map(|e| e.entity.gid).collect();
        kept.sort();
        let states: Vec<(&Entity, &str)> = f.iter().map(|e| (e, "busy")).collect();
        let later = t0 + Duration::from_secs(1);
        assert!(matches!(
            roster.hear("hostf", account(MsgId::mint(), true, &states), later, 2),
            Heard::OverCap { ignored: 4, .. }
        ));
        let mut still: Vec<Gid> = roster.entities().map(|e| e.entity.gid).collect();
        still.sort();
        assert_eq!(still, kept);
        assert!(
            roster
                .entities()
                .all(|e| e.status == "busy" && e.heard == later)
        );
        // One of them leaves: its place is taken by the next one named.
        let left = kept[0];
        let states: Vec<(&Entity, &str)> = f
            .iter()
            .filter(|e| e.gid != left)
            .map(|e| (e, "idle"))
            .collect();
        let base = MsgId::mint();
        roster.hear("hostf", account(base, true, &states), later, 3);
        assert_eq!(roster.entities().count(), 2);
        assert!(roster.entity(left).is_none());
        // A change on a whole account not heard is said stale, over the cap or not.
        assert_eq!(
            roster.hear("hostf", account(MsgId::mint(), false, &states), later, 4),
            Heard::Stale
        );
    }

    #[test]
    fn an_entity_stays_with_the_host_that_announced_it_first() {
        let t0 = Instant::now();
        let mut roster = roster(4, 8);
        let b = entity("b", "hostb");
        roster.hear(
            "hostb",
            account(MsgId::mint(), true, &[(&b, "idle")]),
            t0,
            1,
        );
        // hostc names b's gid as its own (with its own host): not taken, nor can it make b go.
        let mut taken = b.clone();
        taken.host = "hostc".into();
        taken.name = "c".into();
        roster.hear(
            "hostc",
            account(MsgId::mint(), true, &[(&taken, "busy")]),
            t0,
            2,
        );
        let gone = account(MsgId::mint(), false, &[(&taken, GONE)]);
        roster.hear("hostc", gone, t0, 3);
        let entry = roster.entity(b.gid).unwrap();
        assert_eq!(
            (
                entry.entity.host.as_str(),
                entry.entity.name.as_str(),
                entry.status.as_str()
            ),
            ("hostb", "b", "idle")
        );
    }

    fn names(roster: &Roster) -> Vec<String> {
        let mut names: Vec<String> = roster.entities().map(|e| e.entity.name.clone()).collect();
        names.sort();
        names
    }

    /// The gids the name index gives for `name`.
    fn named(roster: &Roster, name: &str) -> Vec<Gid> {
        roster.named(name).map(|e| e.entity.gid).collect()
    }

    #[test]
    fn names_are_looked_up_by_the_index_through_renames_departures_and_forgetting() {
        let t0 = Instant::now();
        let mut roster = roster(4, 4);
        let (w, elsewhere) = (entity("w", "hostb"), entity("w", "hostc"));
        roster.hear("hostb", beat(Some(&w), "idle"), t0, 1);
        roster.hear("hostc", beat(Some(&elsewhere), "idle"), t0, 1);
        let mut both = named(&roster, "w");
        both.sort();
        let mut expected = vec![w.gid, elsewhere.gid];
        expected.sort();
        assert_eq!(both, expected);
        // Announced under another name: found by that name only.
        let renamed = Entity {
            name: "w2".into(),
            ..w.clone()
        };
        roster.hear("hostb", beat(Some(&renamed), "idle"), t0, 2);
        assert_eq!(named(&roster, "w"), [elsewhere.gid]);
        assert_eq!(named(&roster, "w2"), [w.gid]);
        // A new entity of hostb under a name held there supersedes the old one.
        let successor = entity("w2", "hostb");
        roster.hear("hostb", beat(Some(&successor), "idle"), t0, 3);
        assert_eq!(named(&roster, "w2"), [successor.gid]);
        // Leaving and being forgotten take the name along.
        roster.hear("hostc", beat(Some(&elsewhere), GONE), t0, 4);
        assert!(named(&roster, "w").is_empty());
        roster.expire(t0 + FORGET, 5);
        assert!(named(&roster, "w2").is_empty());
        assert_eq!(roster.names().count(), 0);
    }

    #[test]
    fn heartbeats_merge_refresh_and_leave() {
        let t0 = Instant::now();
        let mut roster = roster(4, 4);
        let w = entity("w", "hostb");
        assert_eq!(roster.hear("hostb", beat(None, "up"), t0, 1), Heard::Merged);
        assert_eq!(
            roster.hear("hostb", beat(Some(&w), "idle"), t0, 1),
            Heard::Merged
        );
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            roster.hear("hostb", beat(Some(&w), "busy"), later, 2),
            Heard::Merged
        );
        let entry = roster.entity(w.gid).unwrap();
        assert_eq!(
            (entry.status.as_str(), entry.heard, entry.heard_ms),
            ("busy", later, 2)
        );
        assert_eq!(roster.standing(w.gid, later, OVERDUE), Standing::Busy);
        // A worker whose pane host cannot tell is not free either: its brief waits, and so does
        // its sender's receipt bound.
        roster.hear("hostb", beat(Some(&w), "unknown"), later, 2);
        assert_eq!(roster.standing(w.gid, later, OVERDUE), Standing::Busy);
        roster.hear("hostb", beat(Some(&w), "idle"), later, 2);
        assert_eq!(roster.standing(w.gid, later, OVERDUE), Standing::Free);
        assert_eq!(
            roster.standing(Gid::mint(), later, OVERDUE),
            Standing::Free,
            "one it does not know"
        );
        assert_eq!(
            roster.hear("hostb", beat(Some(&w), GONE), later, 2),
            Heard::Left
        );
        assert!(roster.entity(w.gid).is_none());
        assert_eq!(roster.hosts().count(), 1);
    }

    #[test]
    fn a_new_entity_replaces_its_hosts_entry_of_the_same_name_and_no_other() {
        let t0 = Instant::now();
        let mut heard = roster(4, 4);
        let (old, elsewhere) = (entity("w1", "hostb"), entity("w1", "hostc"));
        heard.hear("hostb", beat(Some(&old), "busy"), t0, 1);
        heard.hear("hostc", beat(Some(&elsewhere), "idle"), t0, 1);
        // hostb crashed and came back: a new w1, and no word of the old one.
        let new = entity("w1", "hostb");
        assert_eq!(
            heard.hear("hostb", beat(Some(&new), "idle"), t0, 2),
            Heard::Merged
        );
        assert!(heard.entity(old.gid).is_none());
        assert_eq!(heard.departed(old.gid), Some(&old));
        assert!(heard.entity(new.gid).is_some());
        // Another host's w1 is another entity.
        assert!(heard.entity(elsewhere.gid).is_some());
        assert_eq!(names(&heard), ["w1", "w1"]);
        // A host at its cap may still bring back a name it held.
        let mut full = roster(4, 1);
        full.hear("hostb", beat(Some(&old), "idle"), t0, 1);
        assert_eq!(
            full.hear("hostb", beat(Some(&new), "idle"), t0, 2),
            Heard::Merged
        );
    }

    #[test]
    fn a_heartbeat_holding_what_no_gateway_announces_is_ignored() {
        let t0 = Instant::now();
        let mut roster = roster(4, 4);
        let mut hostile = entity("w\u{1b}]0;x\u{7}", "hostb");
        assert!(matches!(
            roster.hear("hostb", beat(Some(&hostile), "idle"), t0, 1),
            Heard::Malformed(why) if why.contains("entity name")
        ));
        hostile.name = "w".into();
        assert!(matches!(
            roster.hear("hostb", beat(Some(&hostile), "idle\u{1b}[2J"), t0, 1),
            Heard::Malformed(why) if why.contains("none of spawning")
        ));
        hostile.groups = vec!["core team".into()];
        assert!(matches!(
            roster.hear("hostb", beat(Some(&hostile), "idle"), t0, 1),
            Heard::Malformed(_)
        ));
        hostile.groups = Vec::new();
        let too_long = "x".repeat(crate::entity::MAX_NAME_LEN + 1);
        for (sandbox, role) in [
            (Some("bwrap\u{1b}[2J"), None),
            (Some(""), None),
            (None, Some("backend\r\nINFO forged")),
            (None, Some(too_long.as_str())),
        ] {
            hostile.sandbox = sandbox.map(str::to_string);
            hostile.profile_role = role.map(str::to_string);
            assert!(
                matches!(
                    roster.hear("hostb", beat(Some(&hostile), "idle"), t0, 1),
                    Heard::Malformed(why) if why.contains("sandbox or role")
                ),
                "{sandbox:?} {role:?}"
            );
        }
        let mut host = beat(None, "up");
        host.profiles = vec!["sim\r\n".into()];
        assert!(matches!(
            roster.hear("hostb", host, t0, 1),
            Heard::Malformed(_)
        ));
        // A model family that is no name, or one told of a profile the host does not offer; too
        // many profiles.
        for (profile, family) in [("sim", "open\u{1b}[2Jai"), ("other", "openai")] {
            let mut host = beat(None, "up");
            host.profiles = vec!["sim".into()];
            host.families = [(profile.to_string(), family.to_string())].into();
            assert!(
                matches!(roster.hear("hostb", host, t0, 1), Heard::Malformed(_)),
                "{profile:?} {family:?}"
            );
        }
        let mut host = beat(None, "up");
        host.profiles = (0..=MAX_HOST_PROFILES).map(|i| format!("p{i}")).collect();
        assert!(matches!(
            roster.hear("hostb", host, t0, 1),
            Heard::Malformed(_)
        ));
        assert_eq!(roster.entities().count(), 0);
        assert_eq!(roster.hosts().count(), 0);
        // Every status a gateway announces passes: every session status among them; and so
        // does a sandboxed worker with a role.
        let mut w = entity("w", "hostb");
        w.sandbox = Some("bwrap".into());
        w.profile_role = Some("backend".into());
        for status in ENTITY_STATUSES {
            assert_eq!(malformed(&beat(Some(&w), status)), None, "{status}");
        }
        for status in crate::WorkerStatus::ALL {
            assert!(ENTITY_STATUSES.contains(&status.as_str()), "{status}");
        }
    }

    #[test]
    fn a_host_that_leaves_takes_its_entities_along() {
        let t0 = Instant::now();
        let mut roster = roster(4, 4);
        let (b1, c1) = (entity("b1", "hostb"), entity("c1", "hostc"));
        roster.hear("hostb", beat(None, "up"), t0, 0);
        roster.hear("hostb", beat(Some(&b1), "idle"), t0, 0);
        roster.hear("hostc", beat(Some(&c1), "idle"), t0, 0);
        assert_eq!(roster.hear("hostb", beat(None, GONE), t0, 0), Heard::Left);
        assert_eq!(names(&roster), ["c1"]);
        assert_eq!(roster.hosts().count(), 0);
        // Gone, but still known for what it was.
        assert_eq!(roster.departed(b1.gid), Some(&b1));
        assert_eq!(roster.departed(c1.gid), None);
    }

    #[test]
    fn what_left_or_went_quiet_is_remembered_up_to_a_bound() {
        let t0 = Instant::now();
        let mut roster = roster(4, 4);
        let (left, quiet) = (entity("left", "hostb"), entity("quiet", "hostb"));
        roster.hear("hostb", beat(Some(&left), "idle"), t0, 0);
        roster.hear("hostb", beat(Some(&quiet), "idle"), t0, 0);
        roster.hear("hostb", beat(Some(&left), GONE), t0, 0);
        roster.expire(t0 + Duration::from_secs(3600), 0);
        assert!(roster.entities().next().is_none());
        assert_eq!(roster.departed(left.gid), Some(&left));
        assert_eq!(roster.departed(quiet.gid), Some(&quiet));
        for i in 0..MAX_DEPARTED {
            let e = entity(&format!("e{i}"), "hostb");
            roster.hear("hostb", beat(Some(&e), "idle"), t0, 0);
            roster.hear("hostb", beat(Some(&e), GONE), t0, 0);
        }
        assert_eq!(roster.departed(left.gid), None, "the oldest went first");
    }

    #[test]
    fn a_host_may_not_announce_another_hosts_entity() {
        let mut roster = roster(4, 4);
        let c1 = entity("c1", "hostc");
        assert_eq!(
            roster.hear("hostb", beat(Some(&c1), "idle"), Instant::now(), 0),
            Heard::NotItsOwn {
                claimed: "hostc".into()
            }
        );
        assert!(names(&roster).is_empty());
    }

    #[test]
    fn a_quiet_entry_is_unreachable_after_the_ttl_and_forgotten_after_forget() {
        let t0 = Instant::now();
        let mut roster = roster(4, 4);
        let (old, fresh) = (entity("old", "hostb"), entity("fresh", "hostb"));
        roster.hear("hostb", beat(None, "up"), t0, 0);
        roster.hear("hostb", beat(Some(&old), "idle"), t0, 0);
        roster.hear(
            "hostb",
            beat(Some(&fresh), "idle"),
            t0 + Duration::from_secs(2),
            0,
        );
        let shown = |roster: &Roster, e: &Entity| {
            roster
                .entity(e.gid)
                .map(|r| (r.shown_status().to_string(), r.unreachable_since_ms))
        };
        // A heartbeat overdue: not heard, for a brief's bound (its host may be cut off), though
        // it is not unreachable yet.
        assert_eq!(
            roster.standing(old.gid, t0 + OVERDUE, OVERDUE),
            Standing::Free
        );
        let late = t0 + OVERDUE + Duration::from_millis(1);
        assert_eq!(roster.standing(old.gid, late, OVERDUE), Standing::Unheard);
        roster.expire(t0 + TTL - Duration::from_millis(1), 10);
        assert_eq!(shown(&roster, &old), Some(("idle".into(), None)));
        // Quiet for the ttl: unreachable since then, kept, and a brief for it waits, however
        // long the wait counts as overdue.
        roster.expire(t0 + TTL, 20);
        assert_eq!(shown(&roster, &old), Some((UNREACHABLE.into(), Some(20))));
        assert_eq!(shown(&roster, &fresh), Some(("idle".into(), None)));
        assert_eq!(
            roster.standing(old.gid, t0 + TTL, TTL * 10),
            Standing::Unheard
        );
        assert_eq!(roster.hosts().count(), 1);
        assert_eq!(
            roster.hosts_heard().count(),
            0,
            "the host entry went quiet too"
        );
        // The since stays when it was first found quiet.
        roster.expire(t0 + TTL * 2, 30);
        assert_eq!(shown(&roster, &old), Some((UNREACHABLE.into(), Some(20))));
        // A heartbeat brings it back at once.
        let back = t0 + TTL * 3;
        roster.hear("hostb", beat(None, "up"), back, 40);
        roster.hear("hostb", beat(Some(&old), "busy"), back, 40);
        assert_eq!(shown(&roster, &old), Some(("busy".into(), None)));
        assert_eq!(roster.hosts_heard().collect::<Vec<_>>(), ["hostb"]);
        // Quiet past `forget`: forgotten, and remembered as departed.
        roster.expire(back + FORGET, 50);
        assert!(names(&roster).is_empty());
        assert_eq!(roster.hosts().count(), 0);
        assert_eq!(roster.departed(old.gid), Some(&old));
        // A clock that went backwards expires nothing.
        let mut again = self::roster(4, 4);
        again.hear("hostb", beat(Some(&fresh), "idle"), back, 0);
        again.expire(t0, 60);
        assert_eq!(shown(&again, &fresh), Some(("idle".into(), None)));
    }

    #[test]
    fn the_caps_ignore_new_entries_and_count_every_ignored_heartbeat() {
        let t0 = Instant::now();
        let mut roster = roster(2, 2);
        let f: Vec<Entity> = (1..=3).map(|i| entity(&format!("f{i}"), "hostf")).collect();
        for e in &f[..2] {
            assert_eq!(
                roster.hear("hostf", beat(Some(e), "idle"), t0, 0),
                Heard::Merged
            );
        }
        let Heard::OverCap { full, ignored } =
            roster.hear("hostf", beat(Some(&f[2]), "idle"), t0, 0)
        else {
            panic!("a third entity was kept");
        };
        assert_eq!((full.key, full.count, ignored), (REMOTE_ENTITIES_KEY, 2, 1));
        // A kept entry is still refreshed at the cap.
        assert_eq!(
            roster.hear("hostf", beat(Some(&f[0]), "busy"), t0, 0),
            Heard::Merged
        );
        // hostf counts as a host by its entities; one more host is the cap.
        assert_eq!(roster.hear("hostg", beat(None, "up"), t0, 0), Heard::Merged);
        let h1 = entity("h1", "hosth");
        for presence in [beat(None, "up"), beat(Some(&h1), "idle")] {
            assert!(matches!(
                roster.hear("hosth", presence, t0, 0),
                Heard::OverCap { full, .. } if full.key == REMOTE_HOSTS_KEY
            ));
        }
        assert!(matches!(
            roster.hear("hostf", beat(Some(&f[2]), "idle"), t0, 0),
            Heard::OverCap { ignored: 4, .. }
        ));
        assert_eq!(names(&roster), ["f1", "f2"]);
    }

    #[test]
    fn a_heartbeat_body_reads_without_profiles() {
        let presence: Presence =
            serde_json::from_str(r#"{"entity": null, "status": "up"}"#).unwrap();
        assert_eq!(presence.profiles, Vec::<String>::new());
        assert!(presence.families.is_empty());
        // A host's families are kept as it named them; none are sent when there are none.
        let mut roster = roster(2, 2);
        let mut host = beat(None, "up");
        host.profiles = vec!["claude".into(), "gpt".into()];
        host.families = [("claude".to_string(), "anthropic".to_string())].into();
        roster.hear("hostb", host, Instant::now(), 1);
        let (_, heard) = roster.hosts().next().unwrap();
        assert_eq!(heard.families["claude"], "anthropic");
        let body = serde_json::to_string(&beat(None, "up")).unwrap();
        assert!(!body.contains("families"), "{body}");
    }

    #[test]
    fn a_heartbeat_body_reads_without_a_sandbox_or_a_profile_role() {
        // An older host's heartbeat: its entity has neither.
        let entity = entity("w", "hostb");
        let mut body = serde_json::to_value(beat(Some(&entity), "idle")).unwrap();
        let fields = body["entity"].as_object_mut().unwrap();
        assert!(fields.remove("sandbox").is_some());
        assert!(fields.remove("profile_role").is_some());
        let presence: Presence = serde_json::from_value(body).unwrap();
        let heard = presence.entity.unwrap();
        assert_eq!((heard.sandbox, heard.profile_role), (None, None));
        assert_eq!(heard.name, "w");
        // A newer one's reads them.
        let boxed = Entity {
            sandbox: Some("bwrap".into()),
            profile_role: Some("backend".into()),
            ..entity
        };
        let body = serde_json::to_vec(&beat(Some(&boxed), "idle")).unwrap();
        let presence: Presence = serde_json::from_slice(&body).unwrap();
        assert_eq!(presence.entity, Some(boxed));
    }
}
