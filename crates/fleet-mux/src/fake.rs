//! An in-memory pane host for tests of what drives panes (the delivery pump, the readiness
//! gate, dialogs and stalls) without a multiplexer or a program: each pane is a screen and an
//! input line. A paste shows on the input line at once, Enter takes the line (it moves up into
//! the pane's history and the input line is empty again), and a test sets whatever else the
//! screen shows (a dialog, say), reads what was typed, ends a program, or tells what the host
//! sees of the agent. Only with the `fake` feature.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use fleet_core::dialog::Key;

use crate::{AgentState, MuxError, PaneHost, PaneId, PaneLife, PaneSpec, PaneState, Snapshot};

/// What was done to a fake pane, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Typed {
    /// Text pasted.
    Paste(String),
    /// Enter pressed.
    Enter,
    /// A key of the safe set pressed.
    Press(Key),
}

/// One fake pane.
#[derive(Debug)]
struct Pane {
    /// Lines that went up from the input line.
    history: Vec<String>,
    /// What the program shows above its input line (a dialog, a test's text).
    shown: String,
    /// The input line.
    input: String,
    typed: Vec<Typed>,
    life: PaneLife,
    /// Closed by fleetd: gone from the host, its record kept for the test to read.
    closed: bool,
    agent: Option<(String, AgentState)>,
    /// Every state fleetd reported of the program, in turn.
    reported: Vec<AgentState>,
}

impl Pane {
    fn screen(&self) -> String {
        let mut lines: Vec<&str> = self.history.iter().map(String::as_str).collect();
        if !self.shown.is_empty() {
            lines.push(&self.shown);
        }
        let input = format!("> {}", self.input);
        lines.push(&input);
        lines.join("\n")
    }
}

/// The in-memory pane host.
#[derive(Debug, Default)]
pub struct FakePanes {
    panes: Mutex<BTreeMap<PaneId, Pane>>,
    next: Mutex<u64>,
    /// Reports never answer (a host that takes its time over them).
    reports_stalled: std::sync::atomic::AtomicBool,
    /// How many reports to come fail.
    reports_failing: std::sync::atomic::AtomicUsize,
}

impl FakePanes {
    /// A host with no panes.
    pub fn new() -> FakePanes {
        FakePanes::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<PaneId, Pane>> {
        self.panes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens a pane as if a program were started in it (what a test needs without a spawn).
    pub fn open(&self) -> PaneId {
        let id = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            PaneId(format!("%{next}"))
        };
        self.lock().insert(
            id.clone(),
            Pane {
                history: Vec::new(),
                shown: String::new(),
                input: String::new(),
                typed: Vec::new(),
                life: PaneLife::Alive,
                closed: false,
                agent: None,
                reported: Vec::new(),
            },
        );
        id
    }

    /// Everything typed into `pane` so far.
    pub fn typed(&self, pane: &PaneId) -> Vec<Typed> {
        self.lock()
            .get(pane)
            .map(|p| p.typed.clone())
            .unwrap_or_default()
    }

    /// What was pasted into `pane` and then taken by Enter, in order.
    pub fn submitted(&self, pane: &PaneId) -> Vec<String> {
        let typed = self.typed(pane);
        let mut pending: Option<String> = None;
        let mut taken = Vec::new();
        for t in typed {
            match t {
                Typed::Paste(text) => pending = Some(pending.unwrap_or_default() + &text),
                Typed::Enter => taken.extend(pending.take()),
                Typed::Press(_) => {}
            }
        }
        taken
    }

    /// Makes `pane` show `text` above its input line (empty: nothing).
    pub fn show(&self, pane: &PaneId, text: &str) {
        if let Some(p) = self.lock().get_mut(pane) {
            p.shown = text.to_string();
        }
    }

    /// Ends the program in `pane` with `status`.
    pub fn exit(&self, pane: &PaneId, status: Option<i32>) {
        if let Some(p) = self.lock().get_mut(pane) {
            p.life = PaneLife::Exited(status);
        }
    }

    /// Tells what the host sees of the agent in `pane`.
    pub fn set_agent(&self, pane: &PaneId, agent: Option<(String, AgentState)>) {
        if let Some(p) = self.lock().get_mut(pane) {
            p.agent = agent;
        }
    }

    /// From now on, a report is never answered.
    pub fn stall_reports(&self) {
        self.reports_stalled
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The next `count` reports fail (a host that is not there for a while).
    pub fn fail_reports(&self, count: usize) {
        self.reports_failing
            .store(count, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many of the reports [`FakePanes::fail_reports`] made fail are still to come.
    pub fn reports_to_fail(&self) -> usize {
        self.reports_failing
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What fleetd last reported of the program in `pane`.
    pub fn reported(&self, pane: &PaneId) -> Option<AgentState> {
        self.lock()
            .get(pane)
            .and_then(|p| p.reported.last().copied())
    }

    /// Every state fleetd reported of the program in `pane` (that the host took), in turn.
    pub fn reports(&self, pane: &PaneId) -> Vec<AgentState> {
        self.lock()
            .get(pane)
            .map(|p| p.reported.clone())
            .unwrap_or_default()
    }

    /// Whether fleetd closed `pane`.
    pub fn closed(&self, pane: &PaneId) -> bool {
        self.lock().get(pane).is_some_and(|p| p.closed)
    }

    fn with_live<T>(&self, pane: &PaneId, f: impl FnOnce(&mut Pane) -> T) -> Result<T, MuxError> {
        match self.lock().get_mut(pane) {
            Some(p) if p.life == PaneLife::Alive && !p.closed => Ok(f(p)),
            _ => Err(MuxError::NoPane(pane.clone())),
        }
    }
}

#[async_trait]
impl PaneHost for FakePanes {
    async fn spawn(&self, _: &PaneSpec) -> Result<PaneId, MuxError> {
        Ok(self.open())
    }

    async fn leave_mode(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.with_live(pane, |_| ())
    }

    async fn paste(&self, pane: &PaneId, text: &str) -> Result<(), MuxError> {
        self.with_live(pane, |p| {
            p.input.push_str(text);
            p.typed.push(Typed::Paste(text.to_string()));
        })
    }

    async fn enter(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.with_live(pane, |p| {
            let line = std::mem::take(&mut p.input);
            if !line.is_empty() {
                p.history.push(format!("> {line}"));
            }
            p.typed.push(Typed::Enter);
        })
    }

    async fn press(&self, pane: &PaneId, key: Key) -> Result<(), MuxError> {
        self.with_live(pane, |p| p.typed.push(Typed::Press(key)))
    }

    async fn snapshot(&self, pane: &PaneId) -> Result<Snapshot, MuxError> {
        self.with_live(pane, |p| {
            let text = p.screen();
            let row = u32::try_from(text.lines().count().saturating_sub(1)).unwrap_or(u32::MAX);
            let column = u32::try_from(p.input.chars().count() + 2).unwrap_or(u32::MAX);
            Snapshot {
                cursor: Some((column, row)),
                in_mode: false,
                text,
            }
        })
    }

    async fn styled(&self, pane: &PaneId) -> Result<String, MuxError> {
        self.with_live(pane, |p| p.screen())
    }

    async fn history(&self, pane: &PaneId, lines: usize) -> Result<String, MuxError> {
        match self.lock().get(pane).filter(|p| !p.closed) {
            Some(p) => {
                let screen = p.screen();
                let all: Vec<&str> = screen.lines().collect();
                Ok(all[all.len().saturating_sub(lines)..].join("\n"))
            }
            None => Err(MuxError::NoPane(pane.clone())),
        }
    }

    async fn panes(&self) -> Result<BTreeMap<PaneId, PaneState>, MuxError> {
        Ok(self
            .lock()
            .iter()
            .filter(|(_, p)| !p.closed)
            .map(|(id, p)| {
                (
                    id.clone(),
                    PaneState {
                        life: p.life,
                        agent: p.agent.clone(),
                    },
                )
            })
            .collect())
    }

    async fn report(&self, pane: &PaneId, state: AgentState) -> Result<(), MuxError> {
        if self
            .reports_stalled
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            std::future::pending::<()>().await;
        }
        let failing = &self.reports_failing;
        let failed = failing.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |left| left.checked_sub(1),
        );
        if failed.is_ok() {
            return Err(MuxError::Unreachable(
                "the fake host, failing reports".into(),
            ));
        }
        if let Some(p) = self.lock().get_mut(pane) {
            p.reported.push(state);
        }
        Ok(())
    }

    /// This process's own pid: a program that runs, whose start time can be read.
    async fn pid(&self, pane: &PaneId) -> Result<u32, MuxError> {
        match self.lock().get(pane) {
            Some(p) if !p.closed && p.life == PaneLife::Alive => Ok(std::process::id()),
            _ => Err(MuxError::NoPane(pane.clone())),
        }
    }

    async fn close(&self, pane: &PaneId) -> Result<(), MuxError> {
        if let Some(p) = self.lock().get_mut(pane) {
            p.closed = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PaneSpec {
        PaneSpec {
            label: "w1".into(),
            argv: vec!["agent".into()],
            env: BTreeMap::new(),
            cwd: std::env::temp_dir(),
        }
    }

    #[tokio::test]
    async fn a_paste_shows_on_the_input_line_and_enter_takes_it() {
        let host = FakePanes::new();
        let pane = host.spawn(&spec()).await.unwrap();
        host.paste(&pane, "do it").await.unwrap();
        let pasted = host.snapshot(&pane).await.unwrap();
        assert!(pasted.text.ends_with("> do it"), "{}", pasted.text);
        host.enter(&pane).await.unwrap();
        let taken = host.snapshot(&pane).await.unwrap();
        assert_eq!(taken.text, "> do it\n> ");
        assert_ne!(pasted, taken);
        assert_eq!(host.submitted(&pane), ["do it"]);
        host.show(&pane, "Do you want to proceed?\n❯ 1. Yes");
        assert!(host.snapshot(&pane).await.unwrap().text.contains("proceed"));
        host.press(&pane, Key::Enter).await.unwrap();
        assert_eq!(host.typed(&pane).last(), Some(&Typed::Press(Key::Enter)));
    }

    #[tokio::test]
    async fn an_exited_program_takes_no_keys_and_shows_in_the_list() {
        let host = FakePanes::new();
        let pane = host.spawn(&spec()).await.unwrap();
        host.exit(&pane, Some(1));
        assert!(matches!(
            host.paste(&pane, "x").await,
            Err(MuxError::NoPane(_))
        ));
        assert_eq!(
            host.panes().await.unwrap()[&pane].life,
            PaneLife::Exited(Some(1))
        );
        host.close(&pane).await.unwrap();
        assert!(host.panes().await.unwrap().is_empty());
        assert!(host.closed(&pane));
    }
}
