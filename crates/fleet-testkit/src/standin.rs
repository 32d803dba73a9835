//! A stand-in for a herdr server, for tests: herdr itself cannot be built here (see the
//! project's herdr notes), so this serves the same socket protocol, following the behaviour
//! recorded from herdr 0.8.0 — one answer per connection, herdr's error shapes (an empty id for
//! an unreadable request), a subscription that streams events, panes that vanish when their
//! program exits, herdr's way of reading a request (a look at the new connection and, when the
//! line is not there yet, a 100 ms nap before the next), optional extra ~100 ms stalls — with
//! the panes themselves in a private tmux server.
//!
//! It is a stand-in, not herdr: agent detection is whatever a test reports with a source other
//! than `fleetd` (as if herdr had recognised an agent); as in herdr, the latest report shows.
//! It does not derive herdr's `done` (a finished turn nobody looked at): idle stays idle.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fleet_core::dialog::Key;
use fleet_mux::tmux::Tmux;
use fleet_mux::{PaneHost, PaneId, PaneLife, PaneSpec};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Mutex, broadcast};

/// How often the stand-in looks for panes whose program exited.
const EXIT_POLL: Duration = Duration::from_millis(100);
/// herdr's stall: it polls a new connection for its request line every 100 ms.
const STALL: Duration = Duration::from_millis(100);

/// One pane of the stand-in.
struct Pane {
    tmux: PaneId,
    workspace: String,
    tab: String,
    label: String,
    /// Reports as (source, agent, state), oldest first, one per source.
    reports: Vec<(String, String, String)>,
}

impl Pane {
    /// The agent shown: the latest report wins, whichever its source (as herdr does).
    fn agent(&self) -> Option<(&str, &str)> {
        self.reports
            .last()
            .map(|(_, agent, state)| (agent.as_str(), state.as_str()))
    }

    fn info(&self, id: &str) -> Value {
        let mut info = json!({
            "pane_id": id, "workspace_id": self.workspace, "tab_id": self.tab,
            "label": self.label, "focused": false, "agent_status": "unknown", "revision": 0,
        });
        if let Some((agent, state)) = self.agent() {
            info["agent"] = json!(agent);
            info["agent_status"] = json!(state);
        }
        info
    }
}

#[derive(Default)]
struct State {
    workspaces: BTreeMap<String, String>,
    panes: BTreeMap<String, Pane>,
    next_workspace: usize,
    next_pane: usize,
    next_tab: usize,
}

/// A running stand-in.
pub struct StandIn {
    tmux: Tmux,
    state: Mutex<State>,
    events: broadcast::Sender<String>,
    requests: AtomicUsize,
    stall_every: Option<usize>,
}

type Answer = Result<Value, (&'static str, String)>;

fn event(name: &str, data: Value) -> String {
    json!({"event": name, "data": data}).to_string()
}

impl StandIn {
    /// Serves on `socket` until `server.stop` or the returned future is dropped; panes live in
    /// the private tmux server `tmux_name` (staging pastes in `scratch`). With `stall_every`,
    /// every n-th answer comes ~100 ms late.
    pub async fn serve(
        socket: PathBuf,
        tmux_name: String,
        scratch: PathBuf,
        stall_every: Option<usize>,
    ) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        let (events, _) = broadcast::channel(1024);
        let standin = Arc::new(StandIn {
            tmux: Tmux::private(tmux_name, scratch),
            state: Mutex::new(State::default()),
            events,
            requests: AtomicUsize::new(0),
            stall_every,
        });
        let watcher = {
            let standin = Arc::clone(&standin);
            tokio::spawn(async move { standin.watch_exits().await })
        };
        let (stop_tx, mut stop_rx) = tokio::sync::mpsc::channel::<()>(1);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, _) = accepted?;
                    let (standin, stop) = (Arc::clone(&standin), stop_tx.clone());
                    tokio::spawn(async move { standin.connection(stream, stop).await });
                }
                _ = stop_rx.recv() => break,
            }
        }
        watcher.abort();
        let _ = standin.tmux.kill_server().await;
        let _ = std::fs::remove_file(&socket);
        Ok(())
    }

    async fn watch_exits(&self) {
        loop {
            tokio::time::sleep(EXIT_POLL).await;
            let Ok(live) = self.tmux.panes().await else {
                continue;
            };
            let mut state = self.state.lock().await;
            let gone: Vec<String> = state
                .panes
                .iter()
                .filter(|(_, p)| live.get(&p.tmux).is_none_or(|s| s.life != PaneLife::Alive))
                .map(|(id, _)| id.clone())
                .collect();
            for id in gone {
                if let Some(pane) = state.panes.remove(&id) {
                    let _ = self.tmux.close(&pane.tmux).await;
                    let _ = self.events.send(event(
                        "pane_exited",
                        json!({"type": "pane_exited", "pane_id": id, "workspace_id": pane.workspace}),
                    ));
                }
            }
        }
    }

    async fn connection(self: Arc<Self>, stream: UnixStream, stop: tokio::sync::mpsc::Sender<()>) {
        // As herdr does: look for the request once; when nothing has arrived yet, nap.
        let mut first = [0u8; 1];
        let looked = match stream.try_read(&mut first) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(STALL).await;
                0
            }
            Err(_) => return,
        };
        let (read, mut write) = stream.into_split();
        let mut bytes = first[..looked].to_vec();
        if BufReader::new(read)
            .read_until(b'\n', &mut bytes)
            .await
            .unwrap_or(0)
            == 0
            && looked == 0
        {
            return;
        }
        let line = String::from_utf8_lossy(&bytes);
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        if self
            .stall_every
            .is_some_and(|every| every > 0 && n.is_multiple_of(every))
        {
            tokio::time::sleep(STALL).await;
        }
        let request: Value = match serde_json::from_str(&line) {
            Ok(request) => request,
            Err(e) => {
                let answer = json!({"id": "", "error": {"code": "invalid_request", "message": format!("invalid request: {e}")}});
                let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
                return;
            }
        };
        let id = request["id"].as_str().unwrap_or_default().to_string();
        let method = request["method"].as_str().unwrap_or_default().to_string();
        if method == "events.subscribe" {
            let mut events = self.events.subscribe();
            let started = json!({"id": id, "result": {"type": "subscription_started"}});
            if write
                .write_all(format!("{started}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            while let Ok(event) = events.recv().await {
                if write
                    .write_all(format!("{event}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
            return;
        }
        let answer = match self.dispatch(&method, &request["params"]).await {
            Ok(result) => json!({"id": id, "result": result}),
            Err((code, message)) => {
                let id = if code == "invalid_request" {
                    String::new()
                } else {
                    id
                };
                json!({"id": id, "error": {"code": code, "message": message}})
            }
        };
        let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
        if method == "server.stop" {
            let _ = stop.send(()).await;
        }
    }

    async fn pane(&self, params: &Value) -> Result<(String, PaneId), (&'static str, String)> {
        let id = params["pane_id"].as_str().unwrap_or_default().to_string();
        let state = self.state.lock().await;
        match state.panes.get(&id) {
            Some(pane) => Ok((id, pane.tmux.clone())),
            None => Err(("pane_not_found", format!("pane {id} not found"))),
        }
    }

    async fn dispatch(&self, method: &str, params: &Value) -> Answer {
        let failed = |e: fleet_mux::MuxError| ("internal", e.to_string());
        match method {
            "ping" => Ok(
                json!({"type": "pong", "version": "0.8.0-standin", "protocol": 20, "capabilities": {}}),
            ),
            "server.stop" => Ok(json!({"type": "ok"})),
            "workspace.create" => {
                let mut state = self.state.lock().await;
                state.next_workspace += 1;
                let id = format!("w{}", state.next_workspace);
                let label = params["label"].as_str().unwrap_or_default().to_string();
                state.workspaces.insert(id.clone(), label.clone());
                Ok(json!({"type": "workspace_created",
                    "workspace": {"workspace_id": id, "label": label, "pane_count": 0, "agent_status": "unknown"},
                    "tab": {"tab_id": format!("{id}:t0"), "workspace_id": id}}))
            }
            "layout.apply" => {
                let workspace = params["workspace_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if !self.state.lock().await.workspaces.contains_key(&workspace) {
                    return Err((
                        "workspace_not_found",
                        format!("workspace {workspace} not found"),
                    ));
                }
                let root = &params["root"];
                if root["type"] != "pane" {
                    return Err((
                        "invalid_request",
                        "the stand-in applies one-pane layouts only".into(),
                    ));
                }
                let strings = |v: &Value| -> Vec<String> {
                    v.as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|s| s.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let env: BTreeMap<String, String> = root["env"]
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                let label = root["label"].as_str().unwrap_or_default().to_string();
                let (id, tab) = {
                    let mut state = self.state.lock().await;
                    state.next_pane += 1;
                    state.next_tab += 1;
                    (
                        format!("{workspace}:p{}", state.next_pane),
                        format!("{workspace}:t{}", state.next_tab),
                    )
                };
                let tmux = self
                    .tmux
                    .spawn(&PaneSpec {
                        label: format!("{}-{}", id.replace(':', "-"), label.replace(':', "-")),
                        argv: strings(&root["command"]),
                        env,
                        cwd: PathBuf::from(root["cwd"].as_str().unwrap_or("/")),
                    })
                    .await
                    .map_err(failed)?;
                let pane = Pane {
                    tmux,
                    workspace: workspace.clone(),
                    tab: tab.clone(),
                    label: label.clone(),
                    reports: Vec::new(),
                };
                let _ = self.events.send(event(
                    "pane_created",
                    json!({"type": "pane_created", "pane": pane.info(&id)}),
                ));
                self.state.lock().await.panes.insert(id.clone(), pane);
                Ok(
                    json!({"type": "layout_apply", "layout": {"workspace_id": workspace, "tab_id": tab,
                    "root": {"type": "pane", "pane_id": id, "label": label, "cwd": root["cwd"], "command": root["command"]}}}),
                )
            }
            "pane.send_input" | "pane.send_keys" => {
                let (_, tmux) = self.pane(params).await?;
                if let Some(text) = params["text"].as_str() {
                    self.tmux.paste(&tmux, text).await.map_err(failed)?;
                }
                for key in params["keys"].as_array().cloned().unwrap_or_default() {
                    // The safe set fleetd presses, and the arrows it moves a menu's cursor
                    // with; herdr names them as fleetd does.
                    match key
                        .as_str()
                        .map(|k| (k, Key::parse(k).or_else(|| arrow(k))))
                    {
                        Some((_, Some(key))) => {
                            self.tmux.press(&tmux, key).await.map_err(failed)?;
                        }
                        Some((other, None)) => {
                            return Err((
                                "invalid_request",
                                format!("the stand-in knows only fleetd's safe keys, not {other}"),
                            ));
                        }
                        None => {}
                    }
                }
                Ok(json!({"type": "ok"}))
            }
            "pane.read" => {
                let (id, tmux) = self.pane(params).await?;
                let source = params["source"].as_str().unwrap_or("visible");
                let format = params["format"].as_str().unwrap_or("text");
                let text = match (source, format) {
                    ("visible", "ansi") => self.tmux.styled(&tmux).await.map_err(failed)?,
                    ("visible", _) => self.tmux.snapshot(&tmux).await.map_err(failed)?.text,
                    _ => {
                        let lines = params["lines"].as_u64().unwrap_or(1000) as usize;
                        self.tmux.history(&tmux, lines).await.map_err(failed)?
                    }
                };
                Ok(
                    json!({"type": "pane_read", "read": {"pane_id": id, "source": source, "format": format, "text": text, "revision": 0, "truncated": false}}),
                )
            }
            "pane.get" => {
                let (id, _) = self.pane(params).await?;
                let state = self.state.lock().await;
                let info = state.panes.get(&id).map(|p| p.info(&id));
                Ok(json!({"type": "pane_info", "pane": info}))
            }
            "pane.process_info" => {
                let (id, tmux) = self.pane(params).await?;
                let pid = self.tmux.pid(&tmux).await.map_err(failed)?;
                Ok(json!({"type": "pane_process_info", "process_info": {
                    "pane_id": id, "shell_pid": pid, "foreground_process_group_id": pid,
                    "foreground_processes": []}}))
            }
            "pane.list" => {
                let state = self.state.lock().await;
                let panes: Vec<Value> = state.panes.iter().map(|(id, p)| p.info(id)).collect();
                Ok(json!({"type": "pane_list", "panes": panes}))
            }
            "pane.report_agent" => {
                let state_name = params["state"].as_str().unwrap_or_default().to_string();
                if !["idle", "working", "blocked", "unknown"].contains(&state_name.as_str()) {
                    return Err((
                        "invalid_request",
                        format!(
                            "invalid request: unknown variant `{state_name}`, expected one of `idle`, `working`, `blocked`, `unknown`"
                        ),
                    ));
                }
                let (id, _) = self.pane(params).await?;
                let source = params["source"].as_str().unwrap_or_default().to_string();
                let agent = params["agent"].as_str().unwrap_or_default().to_string();
                let mut state = self.state.lock().await;
                if let Some(pane) = state.panes.get_mut(&id) {
                    pane.reports.retain(|(s, _, _)| *s != source);
                    pane.reports
                        .push((source, agent.clone(), state_name.clone()));
                    let _ = self.events.send(event("pane.agent_status_changed",
                        json!({"pane_id": id, "agent": agent, "agent_status": state_name, "workspace_id": pane.workspace})));
                }
                Ok(json!({"type": "ok"}))
            }
            "pane.release_agent" => {
                let (id, _) = self.pane(params).await?;
                let source = params["source"].as_str().unwrap_or_default();
                if let Some(pane) = self.state.lock().await.panes.get_mut(&id) {
                    pane.reports.retain(|(s, _, _)| s != source);
                }
                Ok(json!({"type": "ok"}))
            }
            "pane.close" => {
                let (id, tmux) = self.pane(params).await?;
                self.tmux.close(&tmux).await.map_err(failed)?;
                if let Some(pane) = self.state.lock().await.panes.remove(&id) {
                    let _ = self.events.send(event("pane_closed",
                        json!({"type": "pane_closed", "pane_id": id, "workspace_id": pane.workspace})));
                }
                Ok(json!({"type": "ok"}))
            }
            // As herdr: a method it does not know is a request it cannot read.
            other => Err((
                "invalid_request",
                format!(
                    "invalid request: unknown variant `{other}` (the stand-in does not serve it)"
                ),
            )),
        }
    }
}

/// The arrow herdr names `name`.
fn arrow(name: &str) -> Option<Key> {
    [Key::Up, Key::Down, Key::Left, Key::Right]
        .into_iter()
        .find(|k| k.name() == name)
}
