//! Ownership: whose a worker is, and what each principal may do with it and see of it.
//!
//! Every worker and architect has an owner, the lead that spawned it (on this host or, through
//! the control plane, on another). By default only the owner tasks it, answers its dialogs,
//! stops it and sees its text: its screen, its dialog's prompt, its stall and crash tails.
//! Sharing is explicit: a worker spawned with `share` (or under a lead's `share` default) may
//! be tasked by the leads listed, who get their own answers and nothing of the owner's. An
//! operator sees names, states, counts and timings, and stops when it is not read-only; a
//! worker's own token sees the roster's names and states. A lead of another host is held to
//! the same rule, and further to what this host's `[federation.allow]` grants its host.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::entity::{Entity, Role, validate_name};
use crate::error::FleetError;
use crate::ids::Gid;

/// The most leads one worker may be shared with.
pub const MAX_SHARED: usize = 64;

/// A lead as a share list or an allow table names it: `name` (a lead of the worker's host) or
/// `name@host`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeadRef {
    /// The lead's name.
    pub name: String,
    /// Its host.
    pub host: String,
}

impl LeadRef {
    /// Parses `name` (a lead of `here`) or `name@host`, each part a valid name.
    pub fn parse(text: &str, here: &str) -> Result<Self, FleetError> {
        let (name, host) = text.split_once('@').unwrap_or((text, here));
        validate_name("shared lead", name)?;
        validate_name("shared lead's host", host)?;
        Ok(Self {
            name: name.to_string(),
            host: host.to_string(),
        })
    }

    /// Whether `lead` is the lead this names.
    pub fn is(&self, lead: &Entity) -> bool {
        lead.role == Role::Lead && lead.name == self.name && lead.host == self.host
    }
}

impl fmt::Display for LeadRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.host)
    }
}

/// Parses a share list given on host `here`: each a lead, none twice, at most [`MAX_SHARED`].
pub fn parse_shares<'a>(
    texts: impl IntoIterator<Item = &'a str>,
    here: &str,
) -> Result<Vec<LeadRef>, FleetError> {
    let mut leads: Vec<LeadRef> = Vec::new();
    for text in texts {
        let lead = LeadRef::parse(text, here)?;
        if !leads.contains(&lead) {
            leads.push(lead);
        }
    }
    if leads.len() > MAX_SHARED {
        return Err(FleetError::invalid(format!(
            "a worker may be shared with {MAX_SHARED} leads at most, not {}",
            leads.len()
        )));
    }
    Ok(leads)
}

/// Whose a pane-bound entity is: its owner and the leads it is shared with.
#[derive(Clone, Copy, Debug)]
pub struct Owned<'a> {
    /// The lead that spawned it.
    pub owner: Option<Gid>,
    /// The leads it is shared with.
    pub shared: &'a [LeadRef],
}

/// How a lead stands to a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It spawned it.
    Owner,
    /// The worker is shared with it.
    Shared,
    /// Neither.
    Stranger,
}

/// How `lead` stands to a worker owned as `owned`.
pub fn standing(lead: &Entity, owned: Owned<'_>) -> Standing {
    if lead.role != Role::Lead {
        Standing::Stranger
    } else if owned.owner == Some(lead.gid) {
        Standing::Owner
    } else if owned.shared.iter().any(|r| r.is(lead)) {
        Standing::Shared
    } else {
        Standing::Stranger
    }
}

/// Who asks.
#[derive(Clone, Copy, Debug)]
pub enum Principal<'a> {
    /// A lead, of this host or (through its gateway) of another.
    Lead(&'a Entity),
    /// An operator of this gateway (`[operators.NAME]`).
    Operator {
        /// Its name.
        name: &'a str,
        /// It may stop workers (it is not read-only).
        may_stop: bool,
    },
    /// A worker or architect, by its own token.
    Pane(&'a Entity),
}

/// What is asked of, or about, a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send it a task (or a broadcast's copy, typed into its pane).
    Task,
    /// Answer the dialog its program stopped on (a key pressed into its pane).
    AnswerDialog,
    /// Stop it.
    Stop,
    /// See its text: its screen, its dialog's prompt, its stall and crash tails.
    SeeText,
    /// See its name, status, counts and timings.
    SeeState,
}

impl Action {
    /// What it is, for a refusal.
    fn doing(self) -> &'static str {
        match self {
            Action::Task => "send it a task",
            Action::AnswerDialog => "answer its dialog",
            Action::Stop => "stop it",
            Action::SeeText => "see its screen, its dialog or its stall and crash text",
            Action::SeeState => "see it",
        }
    }
}

/// Whether `who` may do `action` to a worker owned as `owned`: the table of the tenancy rule.
pub fn may(who: Principal<'_>, action: Action, owned: Owned<'_>) -> bool {
    match who {
        Principal::Lead(lead) => match (standing(lead, owned), action) {
            (Standing::Owner, _) => true,
            (Standing::Shared, Action::Task | Action::SeeState) => true,
            (Standing::Shared | Standing::Stranger, _) => action == Action::SeeState,
        },
        Principal::Operator { may_stop, .. } => {
            action == Action::SeeState || (may_stop && action == Action::Stop)
        }
        Principal::Pane(_) => action == Action::SeeState,
    }
}

/// Fails with `forbidden` unless `who` may do `action` to `worker`, owned as `owned`. The
/// refusal names neither the owner nor anything of its work.
pub fn check(
    who: Principal<'_>,
    action: Action,
    worker: &Entity,
    owned: Owned<'_>,
) -> Result<(), FleetError> {
    if may(who, action, owned) {
        return Ok(());
    }
    let (whom, why) = match who {
        Principal::Lead(lead) => (
            format!("lead '{}'", lead.name),
            match standing(lead, owned) {
                Standing::Shared => format!(
                    "it is shared with you to send tasks to; only the lead that spawned it may {}",
                    action.doing()
                ),
                _ => format!(
                    "it is another lead's {} and not shared with you: only the lead that spawned it may (fleet_spawn's share lists the leads that may send it tasks)",
                    worker.role
                ),
            },
        ),
        Principal::Operator { name, may_stop } => (
            format!("operator '{name}'"),
            if may_stop {
                "an operator sees names, states and timings and may stop workers, never their text"
                    .to_string()
            } else {
                "a read-only operator sees names, states and timings only".to_string()
            },
        ),
        Principal::Pane(entity) => (
            format!("{} '{}'", entity.role, entity.name),
            "a worker sees the roster's names and states only".to_string(),
        ),
    };
    Err(FleetError::forbidden(format!(
        "{whom} may not {} ('{}'): {why}",
        action.doing(),
        worker.name
    )))
}

/// What `[federation.allow]` grants a host's leads (or one lead of it) here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostAllow {
    /// The profiles its leads may spawn here (none: no spawn; `"*"`: any).
    #[serde(default)]
    pub spawn: Vec<String>,
    /// Its leads may send tasks to the workers here they own or that are shared with them.
    #[serde(default)]
    pub send: bool,
    /// Its leads may stop the workers here they own.
    #[serde(default)]
    pub stop: bool,
}

/// What a lead of another host asks of this one.
#[derive(Clone, Copy, Debug)]
pub enum RemoteAction<'a> {
    /// Spawn a worker from `profile`.
    Spawn {
        /// The profile.
        profile: &'a str,
    },
    /// Send a task to a worker here (or have a broadcast's copy typed into one).
    Task,
    /// Stop a worker here.
    Stop,
}

/// This host's `[federation.allow]`: entries keyed by a host id, or by `lead@host` for one lead
/// of it (which then stands alone: the host's entry does not add to it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowTable(pub BTreeMap<String, HostAllow>);

impl AllowTable {
    /// The entry for `lead` (of another host) and its key: its own, else its host's.
    pub fn entry(&self, lead: &Entity) -> Option<(&str, &HostAllow)> {
        let own = format!("{}@{}", lead.name, lead.host);
        self.0
            .get_key_value(&own)
            .or_else(|| self.0.get_key_value(&lead.host))
            .map(|(key, allow)| (key.as_str(), allow))
    }

    /// Fails, naming the config key to set, unless `lead` (of another host) may do `action`
    /// here. The ownership rule still applies on top (a task only to its own or shared
    /// workers, a stop only of its own).
    pub fn check(&self, lead: &Entity, action: RemoteAction<'_>) -> Result<(), String> {
        let Some((key, allow)) = self.entry(lead) else {
            return Err(format!(
                "this host admits no lead of host '{}' to spawn, send tasks or stop: no [federation.allow] entry names '{}' or '{}@{}'",
                lead.host, lead.host, lead.name, lead.host
            ));
        };
        let granted = match action {
            RemoteAction::Spawn { profile } => allow.spawn.iter().any(|p| p == profile || p == "*"),
            RemoteAction::Task => allow.send,
            RemoteAction::Stop => allow.stop,
        };
        if granted {
            return Ok(());
        }
        Err(match action {
            RemoteAction::Spawn { profile } => format!(
                "lead '{}@{}' may not spawn profile '{profile}' here: [federation.allow.\"{key}\"] spawn does not list it",
                lead.name, lead.host
            ),
            RemoteAction::Task => format!(
                "lead '{}@{}' may not send tasks here: [federation.allow.\"{key}\"] send is not true",
                lead.name, lead.host
            ),
            RemoteAction::Stop => format!(
                "lead '{}@{}' may not stop workers here: [federation.allow.\"{key}\"] stop is not true",
                lead.name, lead.host
            ),
        })
    }
}

/// How a reason quotes a screen: what comes after is the screen's text.
pub const SCREEN_QUOTE: &str = "; its screen ends:\n";
/// What stands in for a screen's text in a reason shown to anyone but the owner.
pub const SCREEN_WITHHELD: &str = "; its screen is its owner's";

/// A reason made of `public` (fleetd's own words) and, for the owner only, the `screen` it
/// quotes.
pub fn quoting(public: &str, screen: &str, to_owner: bool) -> String {
    if to_owner {
        format!("{public}{SCREEN_QUOTE}{screen}")
    } else {
        format!("{public}{SCREEN_WITHHELD}")
    }
}

/// `reason` cut into fleetd's own words and the screen it quotes, if it quotes one.
pub fn parts(reason: &str) -> (&str, Option<&str>) {
    match reason.split_once(SCREEN_QUOTE) {
        Some((public, screen)) => (public, Some(screen)),
        None => (reason, None),
    }
}

/// A reason of `public` words that quotes `screen`, if any, for the owner only.
pub fn told(public: &str, screen: Option<&str>, to_owner: bool) -> String {
    match screen {
        Some(screen) => quoting(public, screen, to_owner),
        None => public.to_string(),
    }
}

/// `reason` as anyone but the worker's owner may see it: a screen it quotes is withheld.
pub fn redacted(reason: &str) -> Cow<'_, str> {
    match reason.split_once(SCREEN_QUOTE) {
        Some((public, _)) => Cow::Owned(format!("{public}{SCREEN_WITHHELD}")),
        None => Cow::Borrowed(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(name: &str, host: &str, role: Role) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: host.into(),
            role,
            profile: None,
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent: None,
        }
    }

    /// The rule as a table: principal × relationship × action.
    #[test]
    fn the_tenancy_table() {
        let alice = entity("alice", "a", Role::Lead);
        let bob = entity("bob", "a", Role::Lead);
        let carol = entity("carol", "b", Role::Lead);
        let mallory = entity("mallory", "a", Role::Lead);
        let mut w2 = entity("w2", "a", Role::Worker);
        w2.parent = Some(alice.gid);
        let shared = [
            LeadRef::parse("bob", "a").unwrap(),
            LeadRef::parse("carol@b", "a").unwrap(),
        ];
        let owned = Owned {
            owner: Some(alice.gid),
            shared: &shared,
        };
        use Action::*;
        let all = [Task, AnswerDialog, Stop, SeeText, SeeState];
        let rows: Vec<(&str, Principal<'_>, Vec<Action>)> = vec![
            ("owner", Principal::Lead(&alice), all.to_vec()),
            ("shared lead", Principal::Lead(&bob), vec![Task, SeeState]),
            (
                "shared lead of another host",
                Principal::Lead(&carol),
                vec![Task, SeeState],
            ),
            ("other lead", Principal::Lead(&mallory), vec![SeeState]),
            (
                "read-only operator",
                Principal::Operator {
                    name: "prom",
                    may_stop: false,
                },
                vec![SeeState],
            ),
            (
                "stop operator",
                Principal::Operator {
                    name: "ops",
                    may_stop: true,
                },
                vec![Stop, SeeState],
            ),
            ("a worker's token", Principal::Pane(&w2), vec![SeeState]),
        ];
        for (who, principal, allowed) in rows {
            for action in all {
                assert_eq!(
                    may(principal, action, owned),
                    allowed.contains(&action),
                    "{who} {action:?}"
                );
            }
        }
    }

    #[test]
    fn a_share_names_a_lead_on_its_host_and_a_worker_never_stands_as_a_lead() {
        let carol = entity("carol", "b", Role::Lead);
        let carol_here = entity("carol", "a", Role::Lead);
        let shared = [LeadRef::parse("carol@b", "a").unwrap()];
        let owned = Owned {
            owner: None,
            shared: &shared,
        };
        assert_eq!(standing(&carol, owned), Standing::Shared);
        // The same name on another host is another lead.
        assert_eq!(standing(&carol_here, owned), Standing::Stranger);
        // A worker named like a shared lead is no lead.
        let impostor = entity("carol", "b", Role::Worker);
        assert_eq!(standing(&impostor, owned), Standing::Stranger);
        assert_eq!(LeadRef::parse("bob", "a").unwrap().to_string(), "bob@a");
        for bad in ["", "@a", "bob@", "b ob", "bob@a@b", "-x"] {
            assert!(LeadRef::parse(bad, "a").is_err(), "{bad}");
        }
    }

    #[test]
    fn a_refusal_names_neither_the_owner_nor_its_work() {
        let alice = entity("alice", "a", Role::Lead);
        let bob = entity("bob", "a", Role::Lead);
        let mut w = entity("w1", "a", Role::Worker);
        w.parent = Some(alice.gid);
        let owned = Owned {
            owner: Some(alice.gid),
            shared: &[],
        };
        let err = check(Principal::Lead(&bob), Action::Stop, &w, owned).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::Forbidden);
        assert!(err.message.contains("'w1'"), "{err}");
        assert!(!err.message.contains("alice"), "{err}");
        let op = Principal::Operator {
            name: "prom",
            may_stop: false,
        };
        assert!(check(op, Action::Stop, &w, owned).is_err());
        assert!(check(Principal::Lead(&alice), Action::SeeText, &w, owned).is_ok());
    }

    #[test]
    fn another_hosts_lead_gets_what_its_entry_grants_and_nothing_without_one() {
        let carol = entity("carol", "b", Role::Lead);
        let dave = entity("dave", "b", Role::Lead);
        let mut table = AllowTable::default();
        let err = table.check(&carol, RemoteAction::Task).unwrap_err();
        assert!(err.contains("[federation.allow]"), "{err}");
        table.0.insert(
            "b".into(),
            HostAllow {
                spawn: vec!["coder".into()],
                send: true,
                stop: false,
            },
        );
        assert!(
            table
                .check(&carol, RemoteAction::Spawn { profile: "coder" })
                .is_ok()
        );
        let err = table
            .check(&carol, RemoteAction::Spawn { profile: "root" })
            .unwrap_err();
        assert!(err.contains("[federation.allow.\"b\"] spawn"), "{err}");
        assert!(table.check(&carol, RemoteAction::Task).is_ok());
        assert!(table.check(&carol, RemoteAction::Stop).is_err());
        table.0.get_mut("b").unwrap().spawn = vec!["*".into()];
        assert!(
            table
                .check(&carol, RemoteAction::Spawn { profile: "root" })
                .is_ok()
        );
        // A lead's own entry stands alone.
        table.0.insert("dave@b".into(), HostAllow::default());
        assert!(table.check(&dave, RemoteAction::Task).is_err());
        assert!(table.check(&carol, RemoteAction::Task).is_ok());
    }

    #[test]
    fn a_screen_a_reason_quotes_is_its_owners() {
        let full = quoting("'w' has stalled for 30 s", "password=hunter2", true);
        assert!(full.ends_with("password=hunter2"), "{full}");
        let shown = redacted(&full);
        assert_eq!(shown, "'w' has stalled for 30 s; its screen is its owner's");
        assert_eq!(
            quoting("'w' has stalled for 30 s", "password=hunter2", false),
            shown
        );
        assert_eq!(redacted("the recipient is gone"), "the recipient is gone");
        // A reason built on another (a session that ended because its fresh one did not
        // start) keeps its quote where the owner alone reads it.
        let (public, screen) = parts(&full);
        assert_eq!(screen, Some("password=hunter2"));
        let gone = format!("'w' is gone ({public})");
        assert!(told(&gone, screen, true).ends_with("password=hunter2"));
        assert_eq!(
            told(&gone, screen, false),
            format!("'w' is gone ('w' has stalled for 30 s){SCREEN_WITHHELD}")
        );
        assert_eq!(told("plain", None, false), "plain");
    }
}
