//! Authorisation: which role may call which tool, and to whom a pane-bound entity may send.
//! Identity comes from the caller's token, never from an argument, so these rules take the
//! caller as the daemon resolved it.

use std::fmt;

use crate::entity::{Entity, Role};
use crate::error::FleetError;

/// The fleet's MCP tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tool {
    /// `fleet_list`
    List,
    /// `fleet_spawn`
    Spawn,
    /// `fleet_send`
    Send,
    /// `fleet_reply`
    Reply,
    /// `fleet_ask`
    Ask,
    /// `fleet_poll`
    Poll,
    /// `fleet_broadcast`
    Broadcast,
    /// `fleet_stop`
    Stop,
    /// `fleet_consult`
    Consult,
}

impl Tool {
    /// The tool's MCP name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::List => "fleet_list",
            Tool::Spawn => "fleet_spawn",
            Tool::Send => "fleet_send",
            Tool::Reply => "fleet_reply",
            Tool::Ask => "fleet_ask",
            Tool::Poll => "fleet_poll",
            Tool::Broadcast => "fleet_broadcast",
            Tool::Stop => "fleet_stop",
            Tool::Consult => "fleet_consult",
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `role` may call `tool` at all (DESIGN §1).
pub fn permits(role: Role, tool: Tool) -> bool {
    match role {
        Role::Lead => true,
        Role::Architect | Role::Worker => matches!(
            tool,
            Tool::List | Tool::Send | Tool::Reply | Tool::Ask | Tool::Poll
        ),
    }
}

/// Fails with `forbidden` unless `caller` may call `tool`.
pub fn check_tool(caller: &Entity, tool: Tool) -> Result<(), FleetError> {
    if permits(caller.role, tool) {
        Ok(())
    } else {
        Err(FleetError::forbidden(format!(
            "{} '{}' may not call {tool}: only a lead may",
            caller.role, caller.name
        )))
    }
}

/// Fails with `forbidden` unless `caller` may send a message to `recipient`: a lead may send to
/// anyone; a worker or architect only to the lead that spawned it.
pub fn check_send(caller: &Entity, recipient: &Entity) -> Result<(), FleetError> {
    match caller.role {
        Role::Lead => Ok(()),
        Role::Architect | Role::Worker if caller.parent == Some(recipient.gid) => Ok(()),
        Role::Architect | Role::Worker => Err(FleetError::forbidden(format!(
            "{} '{}' may send only to the lead that spawned it, not to '{}'",
            caller.role, caller.name, recipient.name
        ))),
    }
}

/// Fails with `forbidden` unless `caller` may coordinate with the leads of other fleets
/// (`fleet_send{coord_id}`): leads only, whose coordination it is.
pub fn check_coordinate(caller: &Entity) -> Result<(), FleetError> {
    match caller.role {
        Role::Lead => Ok(()),
        Role::Architect | Role::Worker => Err(FleetError::forbidden(format!(
            "{} '{}' may not send to a coordination id: coordination between leads is for leads only",
            caller.role, caller.name
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Gid;

    fn entity(name: &str, role: Role, parent: Option<Gid>) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: "h".into(),
            role,
            profile: None,
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent,
        }
    }

    #[test]
    fn leads_may_do_everything() {
        for tool in [
            Tool::List,
            Tool::Spawn,
            Tool::Stop,
            Tool::Broadcast,
            Tool::Consult,
        ] {
            assert!(permits(Role::Lead, tool));
        }
    }

    #[test]
    fn workers_may_not_spawn_stop_or_broadcast() {
        let worker = entity("w", Role::Worker, None);
        for tool in [Tool::Spawn, Tool::Stop, Tool::Broadcast, Tool::Consult] {
            let err = check_tool(&worker, tool).unwrap_err();
            assert!(err.to_string().starts_with("forbidden:"), "{err}");
        }
        for tool in [Tool::List, Tool::Send, Tool::Reply, Tool::Ask, Tool::Poll] {
            assert!(check_tool(&worker, tool).is_ok());
        }
    }

    #[test]
    fn workers_send_only_to_their_lead() {
        let lead = entity("alice", Role::Lead, None);
        let other = entity("bob", Role::Lead, None);
        let worker = entity("w", Role::Worker, Some(lead.gid));
        let peer = entity("w2", Role::Worker, Some(lead.gid));
        assert!(check_send(&worker, &lead).is_ok());
        assert!(check_send(&worker, &other).is_err());
        assert!(check_send(&worker, &peer).is_err());
        assert!(check_send(&lead, &worker).is_ok());
    }

    #[test]
    fn only_leads_coordinate() {
        let lead = entity("alice", Role::Lead, None);
        assert!(check_coordinate(&lead).is_ok());
        for role in [Role::Worker, Role::Architect] {
            let err = check_coordinate(&entity("w", role, Some(lead.gid))).unwrap_err();
            assert!(err.to_string().starts_with("forbidden:"), "{err}");
        }
    }
}
