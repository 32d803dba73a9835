//! The parameters of the fleet's MCP tools, as their JSON schemas show them to a model.

use fleet_core::FleetError;
use rmcp::schemars;
use serde::Deserialize;

/// `fleet_list`: every entry, or only those matching each filter given.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only entities in this broadcast group.
    #[serde(default)]
    pub group: Option<String>,
    /// Only entities in this status (spawning, idle, busy, asking, blocked, stopping, or
    /// unknown: a host that cannot be reached).
    #[serde(default)]
    pub status: Option<String>,
    /// Only entities of this host.
    #[serde(default)]
    pub host: Option<String>,
}

/// `fleet_spawn`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnParams {
    /// The worker profile to start (see the gateway's config; fleet_list shows profiles of
    /// running workers).
    pub profile: String,
    /// A name for the worker; `<profile>-<n>` when left out.
    #[serde(default)]
    pub name: Option<String>,
    /// The host to start it on; this gateway's host when left out.
    #[serde(default)]
    pub host: Option<String>,
    /// Its working directory; the profile's when left out.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra broadcast groups to put it in.
    #[serde(default)]
    pub groups: Option<Vec<String>>,
    /// Other leads that may send it tasks (and get their own answers): `name` for a lead of
    /// your own host (this gateway's), `name@host` for one of another host. They never see your
    /// tasks, its screen or its dialogs, and may not stop it. Your `[leads.NAME] share` in
    /// config adds to it.
    #[serde(default)]
    pub share: Option<Vec<String>>,
}

/// `fleet_send`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendParams {
    /// The recipient: a name (as fleet_list shows it), `name@host`, or a gid.
    #[serde(default)]
    pub to: Option<String>,
    /// A peer lead's coordination id (fleet_list shows your own), instead of `to`: leads only.
    /// The message is held in that lead's mailbox for its fleet_poll, never typed anywhere and
    /// never a task; the call returns at once (status pending) and never waits for an answer.
    #[serde(default)]
    pub coord_id: Option<String>,
    /// The turn id of a worker's question (or of a dialog on its screen), to answer it,
    /// instead of `to`.
    #[serde(default)]
    pub turn_id: Option<String>,
    /// The message: for a worker, the task exactly as it should be typed into its pane.
    /// Required, but with `choice`.
    #[serde(default)]
    pub message: Option<String>,
    /// With `turn_id` of a dialog (status blocked), instead of `message`: one of the choices it
    /// offers (`"1"`, `"y"`, `"enter"`, `"esc"`, or a menu option's name such as `"yes"` …).
    /// Only that choice's key is pressed (for a menu option: the arrows to it, then Enter).
    #[serde(default)]
    pub choice: Option<String>,
    /// Seconds to wait for the answer (default 60, at most 3600; 0 returns at once). An answer
    /// that comes later is held for fleet_poll.
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// Where a `fleet_send` goes, and what it carries.
#[derive(Debug, PartialEq, Eq)]
pub enum SendTarget {
    /// A message to an entity of the fleet, by name or gid.
    To(String, String),
    /// A message to a peer lead's mailbox, by coordination id.
    Coord(String, String),
    /// A worker's question, by turn id, and the message that answers it.
    Turn(String, String),
    /// A dialog on a worker's screen, by turn id, and the choice that answers it.
    Choice(String, String),
}

impl SendParams {
    /// Where the message goes: exactly one of `to`, `coord_id` and `turn_id`, with a
    /// `message` (or, with `turn_id` only, a `choice` instead); or `invalid_params` naming what
    /// is wrong.
    pub fn target(&mut self) -> Result<SendTarget, FleetError> {
        let target = self.recipient()?;
        match (self.message.take(), self.choice.take(), target) {
            (None, Some(choice), SendTarget::Turn(turn, _)) => Ok(SendTarget::Choice(turn, choice)),
            (Some(_), Some(_), _) => Err(FleetError::invalid(
                "give a message or a choice, not both (a choice answers a dialog)",
            )),
            (None, Some(_), _) => Err(FleetError::invalid(
                "a choice answers a dialog on a worker's screen: give it with that dialog's turn_id",
            )),
            (None, None, _) => Err(FleetError::invalid("message is required")),
            (Some(message), None, target) => Ok(match target {
                SendTarget::To(to, _) => SendTarget::To(to, message),
                SendTarget::Coord(id, _) => SendTarget::Coord(id, message),
                SendTarget::Turn(turn, _) | SendTarget::Choice(turn, _) => {
                    SendTarget::Turn(turn, message)
                }
            }),
        }
    }

    /// Exactly one of `to`, `coord_id` and `turn_id` (with nothing to carry yet).
    fn recipient(&mut self) -> Result<SendTarget, FleetError> {
        match (self.to.take(), self.coord_id.take(), self.turn_id.take()) {
            (Some(to), None, None) => Ok(SendTarget::To(to, String::new())),
            (None, Some(coord_id), None) => Ok(SendTarget::Coord(coord_id, String::new())),
            (None, None, Some(turn_id)) => Ok(SendTarget::Turn(turn_id, String::new())),
            (to, coord_id, turn_id) => {
                let given: Vec<&str> = [("to", to), ("coord_id", coord_id), ("turn_id", turn_id)]
                    .into_iter()
                    .filter_map(|(name, value)| value.map(|_| name))
                    .collect();
                let given = match given.as_slice() {
                    [] => "none".to_string(),
                    names => names.join(" and "),
                };
                Err(FleetError::invalid(format!(
                    "give exactly one of to, coord_id or turn_id (given: {given})"
                )))
            }
        }
    }
}

/// `fleet_reply`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyParams {
    /// The answer.
    pub message: String,
    /// The msg_id of the message being answered; your task in flight when left out.
    #[serde(default)]
    pub in_reply_to: Option<String>,
}

/// `fleet_ask`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskParams {
    /// The question for your lead.
    pub question: String,
    /// Seconds to wait for the answer (default 300, at most 3600).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// `fleet_poll`
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PollParams {
    /// Only messages from this sender (a name or gid).
    #[serde(default)]
    pub from: Option<String>,
    /// Seconds to wait for the first message (default 0: look and return; at most 3600).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// `fleet_stop`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopParams {
    /// The worker to stop: a name or gid.
    pub to: String,
}

/// `fleet_broadcast`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BroadcastParams {
    /// The message every worker (or every worker of the group) gets as a task.
    pub message: String,
    /// Only the workers of this broadcast group; every worker when left out.
    #[serde(default)]
    pub group: Option<String>,
}

/// `fleet_consult`
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsultParams {
    /// The brief: typed byte for byte into every architect, each in a fresh session.
    pub brief: String,
    /// Seconds to wait for the answers (default 600, at most 3600). A later answer is held for
    /// fleet_poll.
    #[serde(default)]
    pub wait_s: Option<u64>,
    /// The slots to consult, by name (as configured under [architects]); all when left out.
    #[serde(default)]
    pub slots: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(to: Option<&str>, coord_id: Option<&str>, turn_id: Option<&str>) -> SendParams {
        SendParams {
            to: to.map(String::from),
            coord_id: coord_id.map(String::from),
            turn_id: turn_id.map(String::from),
            message: Some("m".into()),
            choice: None,
            wait_s: None,
        }
    }

    #[test]
    fn a_choice_answers_only_a_turn_and_never_with_a_message() {
        let mut choice = SendParams {
            message: None,
            choice: Some("1".into()),
            ..params(None, None, Some("dialog-1"))
        };
        assert_eq!(
            choice.target().unwrap(),
            SendTarget::Choice("dialog-1".into(), "1".into())
        );
        for (p, says) in [
            (
                SendParams {
                    choice: Some("1".into()),
                    ..params(None, None, Some("t"))
                },
                "not both",
            ),
            (
                SendParams {
                    message: None,
                    choice: Some("1".into()),
                    ..params(Some("w"), None, None)
                },
                "give it with that dialog's turn_id",
            ),
            (
                SendParams {
                    message: None,
                    ..params(Some("w"), None, None)
                },
                "message is required",
            ),
        ] {
            let mut p = p;
            let err = p.target().unwrap_err();
            assert!(err.message.contains(says), "{err}");
        }
    }

    #[test]
    fn a_send_goes_to_exactly_one_of_to_coord_id_and_turn_id() {
        assert_eq!(
            params(Some("w"), None, None).target().unwrap(),
            SendTarget::To("w".into(), "m".into())
        );
        assert_eq!(
            params(None, Some("bob@b"), None).target().unwrap(),
            SendTarget::Coord("bob@b".into(), "m".into())
        );
        assert_eq!(
            params(None, None, Some("t")).target().unwrap(),
            SendTarget::Turn("t".into(), "m".into())
        );
        for (p, given) in [
            (params(Some("w"), Some("bob@b"), None), "to and coord_id"),
            (
                params(None, Some("bob@b"), Some("t")),
                "coord_id and turn_id",
            ),
            (
                params(Some("w"), Some("b"), Some("t")),
                "to and coord_id and turn_id",
            ),
            (params(None, None, None), "none"),
        ] {
            let mut p = p;
            let err = p.target().unwrap_err();
            assert_eq!(err.code, fleet_core::ErrorCode::InvalidParams);
            assert!(err.message.contains(&format!("(given: {given})")), "{err}");
        }
    }
}
