//! The routing decision: is a recipient local, remote, or unknown?
//!
//! Same-host traffic takes the local plane and never touches a broker; a remote recipient is
//! published by its gid; an unknown one is a clear error. The decision is made here, once, for
//! every send, so a second delivery path slots in beside the first instead of replacing it.

use crate::entity::Entity;
use crate::error::{ErrorCode, FleetError};
use crate::ids::Gid;

/// Where a message to a recipient goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// The recipient lives on this gateway's host.
    Local(Entity),
    /// The recipient lives on another host.
    Remote(Entity),
}

impl Route {
    /// The recipient, wherever it lives.
    pub fn entity(&self) -> &Entity {
        match self {
            Route::Local(entity) | Route::Remote(entity) => entity,
        }
    }
}

/// What routing looks up, each by an index (never by walking the whole roster): the live
/// entities of this host and those the remote roster knows.
pub trait Directory {
    /// The entity of `gid`.
    fn by_gid(&self, gid: Gid) -> Option<Entity>;
    /// The entities called `name`, this host's first.
    fn named(&self, name: &str) -> Vec<Entity>;
    /// Every name known, for the error that lists them (an unknown recipient only).
    fn names(&self) -> Vec<String>;
}

/// Resolves `to` (a gid, a name, or `name@host`) in `directory` as seen from `local_host`.
/// A bare name prefers the local entity; a bare name held only by several remote entities is
/// ambiguous and asks for `name@host`.
pub fn resolve(
    directory: &impl Directory,
    local_host: &str,
    to: &str,
) -> Result<Route, FleetError> {
    let to = to.trim();
    let found = if let Ok(gid) = to.parse::<Gid>() {
        directory.by_gid(gid)
    } else if let Some((name, host)) = to.split_once('@') {
        directory.named(name).into_iter().find(|e| e.host == host)
    } else {
        let named = directory.named(to);
        match named.iter().find(|e| e.host == local_host) {
            Some(local) => Some(local.clone()),
            None if named.len() > 1 => {
                return Err(FleetError::invalid(format!(
                    "the name '{to}' is held on several hosts: address it as name@host or by gid"
                )));
            }
            None => named.into_iter().next(),
        }
    };
    match found {
        Some(entity) if entity.host == local_host => Ok(Route::Local(entity)),
        Some(entity) => Ok(Route::Remote(entity)),
        None => Err(unknown_recipient(directory.names(), to)),
    }
}

fn unknown_recipient(mut names: Vec<String>, to: &str) -> FleetError {
    names.sort_unstable();
    names.dedup();
    let known = if names.is_empty() {
        "nobody".to_string()
    } else {
        names.join(", ")
    };
    FleetError::new(
        ErrorCode::UnknownRecipient,
        format!("no entity is named or has the id '{to}' (known: {known}); see fleet_list"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::Role;

    /// A roster as a plain list, looked up by walking it.
    struct Listed(Vec<Entity>);

    impl Directory for Listed {
        fn by_gid(&self, gid: Gid) -> Option<Entity> {
            self.0.iter().find(|e| e.gid == gid).cloned()
        }
        fn named(&self, name: &str) -> Vec<Entity> {
            self.0.iter().filter(|e| e.name == name).cloned().collect()
        }
        fn names(&self) -> Vec<String> {
            self.0.iter().map(|e| e.name.clone()).collect()
        }
    }

    fn resolve(roster: &[Entity], local_host: &str, to: &str) -> Result<Route, FleetError> {
        super::resolve(&Listed(roster.to_vec()), local_host, to)
    }

    fn entity(name: &str, host: &str) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: host.into(),
            role: Role::Worker,
            profile: None,
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent: None,
        }
    }

    #[test]
    fn local_by_name_and_gid() {
        let roster = vec![entity("w1", "a"), entity("w2", "a")];
        assert_eq!(
            resolve(&roster, "a", "w2").unwrap(),
            Route::Local(roster[1].clone())
        );
        let by_gid = roster[0].gid.to_string();
        assert_eq!(
            resolve(&roster, "a", &by_gid).unwrap(),
            Route::Local(roster[0].clone())
        );
    }

    #[test]
    fn remote_and_host_qualified() {
        let roster = vec![entity("w1", "a"), entity("w1", "b"), entity("w9", "b")];
        assert_eq!(
            resolve(&roster, "a", "w1").unwrap(),
            Route::Local(roster[0].clone())
        );
        assert_eq!(
            resolve(&roster, "a", "w1@b").unwrap(),
            Route::Remote(roster[1].clone())
        );
        assert_eq!(
            resolve(&roster, "a", "w9").unwrap(),
            Route::Remote(roster[2].clone())
        );
    }

    #[test]
    fn ambiguous_remote_names_ask_for_a_host() {
        let roster = vec![entity("w1", "b"), entity("w1", "c")];
        let err = resolve(&roster, "a", "w1").unwrap_err();
        assert!(err.message.contains("name@host"), "{err}");
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let roster = vec![entity("w2", "a"), entity("w1", "a")];
        let err = resolve(&roster, "a", "ghost").unwrap_err();
        assert_eq!(err.code, ErrorCode::UnknownRecipient);
        assert!(
            err.message.contains("'ghost'") && err.message.contains("w1, w2"),
            "{err}"
        );
    }
}
