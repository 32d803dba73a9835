//! The worker session state machine:
//! `spawning (⇄ blocked) → idle ⇄ busy (⇄ asking, ⇄ blocked) → stopping → gone`.
//!
//! Delivery is gated on it: a brief is typed into a pane only while its worker is `idle`, and
//! only one task is in flight per worker.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::FleetError;

/// Where a pane-bound entity is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStatus {
    /// Its pane is up; it has not yet called in.
    Spawning,
    /// Ready for a task.
    Idle,
    /// A task is in flight.
    Busy,
    /// Paused mid-turn on a question to its lead.
    Asking,
    /// Its program stopped on a dialog (a permission prompt mid-turn, or a notice while it
    /// started): it waits for a key.
    Blocked,
    /// Being stopped; takes no new tasks.
    Stopping,
    /// Its pane is closed or its program exited.
    Gone,
}

/// What happens to a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// Its first authenticated call (or its ready marker) arrived.
    Ready,
    /// A task was handed to it.
    TaskStarted,
    /// It answered its task.
    TurnDone,
    /// It asked its lead mid-turn.
    Asked,
    /// Its ask was answered, timed out or refused.
    AskEnded,
    /// Its program shows a dialog and waits for a key.
    DialogShown,
    /// The dialog went away (answered, or by the program itself).
    DialogGone,
    /// The dialog its program showed while starting went away: it goes on starting.
    StartDialogGone,
    /// An idle session is replaced by a fresh one (same worker, new process).
    Recycle,
    /// A stop was requested.
    Stop,
    /// Its pane went away (program exited, pane closed, ready timeout).
    Exited,
}

impl WorkerStatus {
    /// Every status, in life order.
    pub const ALL: [WorkerStatus; 7] = [
        WorkerStatus::Spawning,
        WorkerStatus::Idle,
        WorkerStatus::Busy,
        WorkerStatus::Asking,
        WorkerStatus::Blocked,
        WorkerStatus::Stopping,
        WorkerStatus::Gone,
    ];

    /// The status's name on the wire and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerStatus::Spawning => "spawning",
            WorkerStatus::Idle => "idle",
            WorkerStatus::Busy => "busy",
            WorkerStatus::Asking => "asking",
            WorkerStatus::Blocked => "blocked",
            WorkerStatus::Stopping => "stopping",
            WorkerStatus::Gone => "gone",
        }
    }

    /// The status after `event`, or an error naming the impossible transition.
    pub fn on(self, event: SessionEvent) -> Result<WorkerStatus, FleetError> {
        use SessionEvent as E;
        use WorkerStatus as S;
        let next = match (self, event) {
            (S::Gone, _) => None,
            (_, E::Exited) => Some(S::Gone),
            (S::Stopping, _) => None,
            (_, E::Stop) => Some(S::Stopping),
            (S::Spawning, E::Ready) => Some(S::Idle),
            (S::Idle, E::Recycle) => Some(S::Spawning),
            (S::Idle, E::TaskStarted) => Some(S::Busy),
            (S::Busy, E::TurnDone) => Some(S::Idle),
            (S::Busy, E::Asked) => Some(S::Asking),
            (S::Asking, E::AskEnded) => Some(S::Busy),
            (S::Asking, E::TurnDone) => Some(S::Idle),
            (S::Busy | S::Spawning, E::DialogShown) => Some(S::Blocked),
            (S::Blocked, E::DialogGone) => Some(S::Busy),
            (S::Blocked, E::StartDialogGone) => Some(S::Spawning),
            (S::Blocked, E::TurnDone) => Some(S::Idle),
            _ => None,
        };
        next.ok_or_else(|| {
            FleetError::internal(format!("a session that is {self} cannot take {event:?}"))
        })
    }

    /// Whether a brief may be typed into the pane now.
    pub fn takes_tasks(self) -> bool {
        self == WorkerStatus::Idle
    }

    /// Whether the session still exists for messaging (it may queue tasks).
    pub fn is_live(self) -> bool {
        !matches!(self, WorkerStatus::Stopping | WorkerStatus::Gone)
    }
}

impl fmt::Display for WorkerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkerStatus {
    type Err = FleetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkerStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| FleetError::internal(format!("unknown session status '{s}'")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SessionEvent as E;
    use WorkerStatus as S;

    #[test]
    fn a_normal_life() {
        let mut status = S::Spawning;
        for (event, expected) in [
            (E::Ready, S::Idle),
            (E::TaskStarted, S::Busy),
            (E::Asked, S::Asking),
            (E::AskEnded, S::Busy),
            (E::TurnDone, S::Idle),
            (E::Stop, S::Stopping),
            (E::Exited, S::Gone),
        ] {
            status = status.on(event).unwrap();
            assert_eq!(status, expected);
        }
    }

    #[test]
    fn only_an_idle_session_is_recycled_and_it_must_become_ready_again() {
        assert_eq!(S::Idle.on(E::Recycle).unwrap(), S::Spawning);
        assert_eq!(S::Spawning.on(E::Ready).unwrap(), S::Idle);
        for busy in [
            S::Busy,
            S::Asking,
            S::Blocked,
            S::Spawning,
            S::Stopping,
            S::Gone,
        ] {
            assert!(busy.on(E::Recycle).is_err(), "{busy}");
        }
    }

    #[test]
    fn a_dialog_pauses_a_busy_session_until_it_goes_or_the_turn_ends() {
        assert_eq!(S::Busy.on(E::DialogShown).unwrap(), S::Blocked);
        assert_eq!(S::Blocked.on(E::DialogGone).unwrap(), S::Busy);
        assert_eq!(S::Blocked.on(E::TurnDone).unwrap(), S::Idle);
        assert_eq!(S::Blocked.on(E::Exited).unwrap(), S::Gone);
        assert_eq!(S::Blocked.on(E::Stop).unwrap(), S::Stopping);
        // Only a session at work (or starting) shows a dialog that matters; a blocked one takes
        // no task.
        for other in [S::Idle, S::Asking, S::Blocked] {
            assert!(other.on(E::DialogShown).is_err(), "{other}");
        }
        assert!(S::Blocked.on(E::TaskStarted).is_err());
        assert!(!S::Blocked.takes_tasks());
    }

    #[test]
    fn a_dialog_while_starting_pauses_the_start_until_it_goes() {
        assert_eq!(S::Spawning.on(E::DialogShown).unwrap(), S::Blocked);
        // Gone, the session starts on (it is not ready for that): it turns idle once ready.
        assert_eq!(S::Blocked.on(E::StartDialogGone).unwrap(), S::Spawning);
        assert!(
            S::Blocked.on(E::Ready).is_err(),
            "ready only once the dialog is gone"
        );
        assert_eq!(S::Spawning.on(E::Ready).unwrap(), S::Idle);
        for other in [S::Idle, S::Busy, S::Asking, S::Spawning] {
            assert!(other.on(E::StartDialogGone).is_err(), "{other}");
        }
    }

    #[test]
    fn one_task_at_a_time() {
        assert!(S::Busy.on(E::TaskStarted).is_err());
        assert!(S::Spawning.on(E::TaskStarted).is_err());
        assert!(S::Idle.takes_tasks());
        assert!(!S::Busy.takes_tasks());
    }

    #[test]
    fn gone_is_final_and_stopping_takes_nothing_new() {
        for event in [E::Ready, E::TaskStarted, E::Stop, E::Exited] {
            assert!(S::Gone.on(event).is_err());
        }
        assert!(S::Stopping.on(E::TaskStarted).is_err());
        assert_eq!(S::Stopping.on(E::Exited).unwrap(), S::Gone);
        assert_eq!(S::Busy.on(E::Exited).unwrap(), S::Gone);
    }

    #[test]
    fn statuses_round_trip() {
        for status in WorkerStatus::ALL {
            assert_eq!(status.as_str().parse::<S>().unwrap(), status);
        }
    }
}
