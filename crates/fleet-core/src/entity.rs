//! Entities: the message-addressable members of a fleet, their roles and their names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::FleetError;
use crate::ids::Gid;

/// The longest name an entity may have; names show up in panes, logs and tool results.
pub const MAX_NAME_LEN: usize = 64;

/// What an entity may do and how it is reached.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Human-driven, declared in config, reached by MCP pull (and a nudge into its pane).
    Lead,
    /// An advisory architect: spawned into a pane like a worker, but may not spawn or stop.
    Architect,
    /// A worker agent spawned into a pane; tasks are typed into it.
    #[default]
    Worker,
}

impl Role {
    /// The role's name on the wire and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Lead => "lead",
            Role::Architect => "architect",
            Role::Worker => "worker",
        }
    }

    /// Whether this role lives in a pane (worker, architect: its tasks are typed in) or is a
    /// lead (reached by MCP pull only).
    pub fn is_pane_bound(self) -> bool {
        !matches!(self, Role::Lead)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = FleetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lead" => Ok(Role::Lead),
            "architect" => Ok(Role::Architect),
            "worker" => Ok(Role::Worker),
            other => Err(FleetError::invalid(format!(
                "unknown role '{other}' (expected lead, architect or worker)"
            ))),
        }
    }
}

/// A member of the fleet as the roster knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entity {
    /// Global id; the routing key everywhere.
    pub gid: Gid,
    /// Human name, unique among live entities of a gateway.
    pub name: String,
    /// The host id of the gateway that owns the entity.
    pub host: String,
    /// What the entity may do.
    pub role: Role,
    /// The profile it was spawned from (none for leads).
    pub profile: Option<String>,
    /// The sandbox runtime its profile ran it in, by its program's name ([`sandbox_name`]:
    /// `bwrap`, `podman`, `docker`); none when it runs unsandboxed (and for leads). Recorded
    /// when it is spawned; a heartbeat of a host that announces none reads none.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// The role its profile declares for its workers (`role = "backend"`), if any: what it is
    /// for, not what it may do (that is [`Entity::role`]).
    #[serde(default)]
    pub profile_role: Option<String>,
    /// Broadcast groups it belongs to.
    pub groups: Vec<String>,
    /// The lead that spawned it: a worker may send only to this lead.
    pub parent: Option<Gid>,
}

/// Checks that `name` can name an entity, a profile or a group: 1–64 characters of ASCII
/// letters, digits, `-`, `_` and `.`, not starting with `-` or `.`.
pub fn validate_name(what: &str, name: &str) -> Result<(), FleetError> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ok_start = !name.starts_with(['-', '.']);
    if name.is_empty() || name.len() > MAX_NAME_LEN || !ok_chars || !ok_start {
        return Err(FleetError::invalid(format!(
            "{what} '{name}' is not a valid name: use 1-{MAX_NAME_LEN} letters, digits, '-', '_' or '.', not starting with '-' or '.'"
        )));
    }
    Ok(())
}

/// How a sandbox runtime whose program is `program` (the first word of a sandbox profile's
/// `runtime`: `bwrap`, `/usr/bin/podman`) is shown: the program's file name, as a valid name
/// ([`validate_name`]) so that every host takes it as it takes a profile's name: a character
/// no name holds reads `_`, a leading `-` or `.` too, and it is cut at [`MAX_NAME_LEN`]. None
/// for a program that names no file (empty, or a path ending in `/`).
pub fn sandbox_name(program: &str) -> Option<String> {
    let file = program.rsplit('/').next().filter(|f| !f.is_empty())?;
    let shown: String = file
        .chars()
        .take(MAX_NAME_LEN)
        .enumerate()
        .map(|(i, c)| match c {
            '-' | '.' if i == 0 => '_',
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => c,
            _ => '_',
        })
        .collect();
    Some(shown)
}

/// Checks that `name` can name a worker, whose name is also its pane's name in the multiplexer:
/// a valid name ([`validate_name`]) that maps onto a tmux session name one to one. tmux turns `.`
/// (and `:`) in a session name into `_`, so `w.1` would collide with `w_1`; and fleetd's own
/// control session is `_fleetd`, so no worker name starts with `_`.
pub fn validate_worker_name(name: &str) -> Result<(), FleetError> {
    validate_name("worker name", name)?;
    if name.contains('.') || name.starts_with('_') {
        return Err(FleetError::invalid(format!(
            "worker name '{name}' cannot name a pane: a worker's name is its tmux session's, where '.' turns into '_' (so 'w.1' and 'w_1' would be one session) and names starting with '_' are fleetd's own; use letters, digits, '-' and '_', starting with a letter or digit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_names_map_onto_pane_names_one_to_one() {
        for ok in ["w1", "w_1", "backend-2", "A9"] {
            assert!(validate_worker_name(ok).is_ok(), "{ok}");
        }
        for bad in ["w.1", "_fleetd", "_x", "-x", ".x", "a:b", "", "a b"] {
            let err = validate_worker_name(bad).unwrap_err();
            assert_eq!(err.code, crate::ErrorCode::InvalidParams, "{bad}");
            assert!(err.message.contains(&format!("'{bad}'")), "{err}");
        }
        let err = validate_worker_name("w.1").unwrap_err();
        assert!(err.message.contains("'w.1' and 'w_1'"), "{err}");
    }

    #[test]
    fn a_sandbox_is_shown_by_its_programs_file_name_as_a_valid_name() {
        for (program, shown) in [
            ("bwrap", Some("bwrap")),
            ("/usr/bin/podman", Some("podman")),
            ("./bin/docker", Some("docker")),
            ("my runtime", Some("my_runtime")),
            ("-x", Some("_x")),
            ("..", Some("_.")),
            ("sandb\u{1b}[2Jox", Some("sandb__2Jox")),
            ("\u{e9}t\u{e9}", Some("_t_")),
            ("", None),
            ("/opt/", None),
        ] {
            assert_eq!(sandbox_name(program).as_deref(), shown, "{program:?}");
            if let Some(shown) = shown {
                assert!(validate_name("sandbox", shown).is_ok(), "{shown}");
            }
        }
        let long = sandbox_name(&"x".repeat(200)).unwrap();
        assert_eq!(long.len(), MAX_NAME_LEN);
        assert!(validate_name("sandbox", &long).is_ok());
    }

    #[test]
    fn roles_round_trip() {
        for role in [Role::Lead, Role::Architect, Role::Worker] {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!("boss".parse::<Role>().is_err());
    }

    #[test]
    fn only_leads_are_pulled() {
        assert!(!Role::Lead.is_pane_bound());
        assert!(Role::Worker.is_pane_bound());
        assert!(Role::Architect.is_pane_bound());
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("worker", "w-1.a_b").is_ok());
        for bad in ["", "-x", ".x", "a b", "é", &"x".repeat(65)] {
            let err = validate_name("worker", bad).unwrap_err();
            assert!(err.to_string().contains("worker"), "{err}");
        }
    }
}
