//! Choosing the pane host: `[mux] kind`, or — when unset — the multiplexer fleetd itself runs
//! inside (herdr by `HERDR_SOCKET_PATH`, tmux by `TMUX`), else tmux. tmux always means a
//! private server of the gateway's own; herdr means a workspace of the fleet's own in the
//! chosen herdr server.

use std::path::PathBuf;

use crate::config::{DEFAULT_PANES_PER_SERVER, MuxConfig, MuxKind};
use crate::state::StateDir;

/// The pane host to drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MuxChoice {
    /// Private tmux servers, by the first one's socket name.
    Tmux {
        /// `tmux -L` name of the first server (the others' derive from it).
        socket: String,
        /// The panes a server holds before new ones go to another.
        per_server: usize,
    },
    /// A herdr server.
    Herdr {
        /// Its socket.
        socket: PathBuf,
        /// The fleet's workspace label.
        workspace: String,
    },
}

/// Picks the host from `config` and the environment (`env` reads a variable); returns it and a
/// sentence saying why, for the start-up log.
pub fn choose(
    config: &MuxConfig,
    env: impl Fn(&str) -> Option<String>,
    state: &StateDir,
) -> Result<(MuxChoice, String), String> {
    let inside_herdr = env("HERDR_SOCKET_PATH").filter(|s| !s.is_empty());
    let inside_tmux = env("TMUX").filter(|s| !s.is_empty()).is_some();
    let (kind, why) = match (config.kind, &inside_herdr) {
        (Some(kind), _) => (kind, "as configured (mux.kind)".to_string()),
        (None, Some(_)) => (
            MuxKind::Herdr,
            "fleetd runs inside herdr (HERDR_SOCKET_PATH is set) and mux.kind is unset".to_string(),
        ),
        (None, None) if inside_tmux => (
            MuxKind::Tmux,
            "fleetd runs inside tmux (TMUX is set) and mux.kind is unset; workers go to a private tmux server".to_string(),
        ),
        (None, None) => (MuxKind::Tmux, "the default".to_string()),
    };
    let choice = match kind {
        MuxKind::Tmux => MuxChoice::Tmux {
            socket: config
                .socket
                .clone()
                .unwrap_or_else(|| state.tmux_socket_name()),
            per_server: config.panes_per_server.unwrap_or(DEFAULT_PANES_PER_SERVER),
        },
        MuxKind::Herdr if config.panes_per_server.is_some() => {
            return Err(format!(
                "mux.panes_per_server spreads panes over tmux servers, and fleetd would use herdr: {why}; set kind = \"tmux\" or remove it"
            ));
        }
        MuxKind::Herdr => {
            let socket = if let Some(socket) = &config.socket {
                PathBuf::from(socket)
            } else if let Some(session) = &config.session {
                let base = env("XDG_CONFIG_HOME")
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .or_else(|| env("HOME").map(|home| PathBuf::from(home).join(".config")))
                    .ok_or("mux.session needs XDG_CONFIG_HOME or HOME to find herdr's sessions")?;
                base.join("herdr/sessions").join(session).join("herdr.sock")
            } else if let Some(socket) = inside_herdr {
                PathBuf::from(socket)
            } else {
                return Err(
                    "mux.kind = \"herdr\" needs mux.socket or mux.session (or fleetd running inside herdr)"
                        .into(),
                );
            };
            MuxChoice::Herdr {
                socket,
                workspace: config.workspace.clone(),
            }
        }
    };
    Ok((choice, why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| vars.get(key).cloned()
    }

    fn state() -> StateDir {
        StateDir::resolve(Some(std::path::Path::new("/tmp/fleet-state")), None).unwrap()
    }

    #[test]
    fn tmux_by_default_and_inside_tmux() {
        let (choice, why) = choose(&MuxConfig::default(), env(&[]), &state()).unwrap();
        assert!(
            matches!(choice, MuxChoice::Tmux { socket, per_server } if socket.starts_with("fleetd-") && per_server == DEFAULT_PANES_PER_SERVER)
        );
        assert_eq!(why, "the default");
        let (_, why) = choose(
            &MuxConfig::default(),
            env(&[("TMUX", "/tmp/tmux-0/default,1,0")]),
            &state(),
        )
        .unwrap();
        assert!(why.contains("inside tmux"), "{why}");
    }

    #[test]
    fn herdr_when_fleetd_runs_inside_it() {
        let (choice, why) = choose(
            &MuxConfig::default(),
            env(&[("HERDR_SOCKET_PATH", "/run/h.sock"), ("TMUX", "x")]),
            &state(),
        )
        .unwrap();
        assert_eq!(
            choice,
            MuxChoice::Herdr {
                socket: "/run/h.sock".into(),
                workspace: "fleet".into()
            }
        );
        assert!(why.contains("inside herdr"), "{why}");
    }

    #[test]
    fn herdr_by_socket_or_session() {
        let mut config = MuxConfig {
            kind: Some(MuxKind::Herdr),
            session: Some("work".into()),
            ..MuxConfig::default()
        };
        let (choice, _) = choose(&config, env(&[("XDG_CONFIG_HOME", "/cfg")]), &state()).unwrap();
        assert!(
            matches!(choice, MuxChoice::Herdr { socket, .. } if socket == std::path::Path::new("/cfg/herdr/sessions/work/herdr.sock"))
        );
        config.socket = Some("/explicit.sock".into());
        let (choice, why) = choose(&config, env(&[]), &state()).unwrap();
        assert!(
            matches!(choice, MuxChoice::Herdr { socket, .. } if socket == std::path::Path::new("/explicit.sock"))
        );
        assert!(why.contains("configured"));
        let bare = MuxConfig {
            kind: Some(MuxKind::Herdr),
            ..MuxConfig::default()
        };
        let err = choose(&bare, env(&[]), &state()).unwrap_err();
        assert!(err.contains("mux.socket or mux.session"), "{err}");
        let spread = MuxConfig {
            panes_per_server: Some(8),
            ..MuxConfig::default()
        };
        let err = choose(
            &spread,
            env(&[("HERDR_SOCKET_PATH", "/run/h.sock")]),
            &state(),
        )
        .unwrap_err();
        assert!(
            err.contains("panes_per_server") && err.contains("inside herdr"),
            "{err}"
        );
    }
}
