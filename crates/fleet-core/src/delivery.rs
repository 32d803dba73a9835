//! The delivery rules of the local plane: where a message starts its life, and when a
//! pane-bound entity may take its next task. The gateway gathers the facts under its lock,
//! asks here, and acts on the answer.

use crate::entity::Role;
use crate::message::Kind;
use crate::session::WorkerStatus;

/// Who a message is for, as this gateway knows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipient {
    /// A lead of this gateway (reached by MCP pull).
    Lead,
    /// A pane-bound entity of this gateway (worker, architect); `live` until its session ended.
    Pane {
        /// Whether its session is still live.
        live: bool,
    },
    /// Nobody here: another host's, as far as this gateway can tell.
    Elsewhere,
}

/// Where a message starts its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Held for an MCP pull (or a blocked call).
    Hold,
    /// Queued for the recipient's pump, to be typed into its pane.
    Queue,
    /// Failed at once: its recipient is gone.
    Dead,
    /// Published to its recipient's inbox on the broker; its own gateway places it there.
    Remote,
}

/// Where a message of `kind` for `recipient` goes (`federated`: this gateway has a broker).
/// To a lead, held for its pull; to a pane-bound entity, a task is queued to be typed in and
/// anything else (an answer to its own send, a notice) is held for its poll or blocked call,
/// never typed in as if it were a task; to nobody here, the broker if there is one.
pub fn place(kind: Kind, recipient: Recipient, federated: bool) -> Placement {
    match recipient {
        Recipient::Lead => Placement::Hold,
        Recipient::Pane { live: false } => Placement::Dead,
        Recipient::Pane { live: true } if kind == Kind::Send => Placement::Queue,
        Recipient::Pane { live: true } => Placement::Hold,
        Recipient::Elsewhere if federated => Placement::Remote,
        Recipient::Elsewhere => Placement::Dead,
    }
}

/// Whether a message for another host is its gateway's to carry through a broker outage
/// (kept durably, published once the link allows, its sender done at once) rather than
/// refused at once: everything but a task for a pane-bound entity (`to_pane`; an entity of
/// unknown role counts as one). A reply, a report to a lead, a notice or a receipt is handed
/// over by someone who cannot wait on the link and has nothing else to do with it; a task is
/// its lead's to send again or elsewhere, and its receipt bound starts when it is published.
pub fn carried(kind: Kind, to_pane: bool) -> bool {
    kind != Kind::Send || !to_pane
}

/// Who would take a pane-bound entity's next task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taker {
    /// Its pump, to type it in: only while no poll of its own is open to take it instead.
    Pump,
    /// Its own open `fleet_poll`.
    Poll,
    /// A brief from another host, waiting on the broker until one of the two would take it.
    Broker,
}

/// What decides whether a pane-bound entity takes a task now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskGate {
    /// Its session's status.
    pub status: WorkerStatus,
    /// It took as many tasks as its profile's `context_cap` allows (recycled before the next).
    pub cap_reached: bool,
    /// Its `fleet_poll` calls now open.
    pub polls_open: usize,
    /// The pane host recognises the agent in its pane and says it is working or blocked on a
    /// human, whatever fleetd's own status says.
    pub agent_busy: bool,
    /// The pane host cannot be reached.
    pub host_down: bool,
    /// Briefs from another host queued for it whose acknowledgement to the broker is not yet
    /// seen: nothing of its queue is handed over meanwhile (a brief goes near the pane only
    /// once the broker cannot give it again).
    pub arriving: usize,
}

/// Whether `taker` may hand the entity its next task now: the one rule for the pump, a poll
/// and a brief waiting on the broker. Only an idle session under its cap, on a pane host that
/// answers; the pump also yields to an open poll. An agent busy by the pane host's account
/// gets no task typed in, but one in its own `fleet_poll` is busy with exactly that call: a
/// poll (or a brief from afar, on its way to that poll) still hands it the task.
pub fn may_take_task(gate: &TaskGate, taker: Taker) -> bool {
    let polling = taker != Taker::Pump && gate.polls_open > 0;
    gate.status == WorkerStatus::Idle
        && !gate.cap_reached
        && (!gate.agent_busy || polling)
        && !gate.host_down
        && (taker != Taker::Pump || gate.polls_open == 0)
        && (taker == Taker::Broker || gate.arriving == 0)
}

/// What the sender of a brief that expired while it waited for its worker is told (on the
/// broker, unacknowledged, or in the worker's queue here).
pub const WAITED_TOO_LONG: &str =
    "it expired (expiresAt) while it waited for its worker to be free; it was not typed in";

/// How a pane-bound entity's queued task reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Typed into its pane as a prompt.
    Type,
    /// Left queued for its own `fleet_poll`; a nudge typed into its pane says it is there.
    Nudge,
}

/// How the next queued task reaches an entity of `role` that was `briefed` already (took a
/// task, in this session or one before a recycle): a worker gets every task typed; an
/// architect only its brief, the first, and pulls what comes later (DESIGN §1: a follow-up is
/// held for it, with the nudge).
pub fn handover(role: Role, briefed: bool) -> Handover {
    match role {
        Role::Architect if briefed => Handover::Nudge,
        Role::Architect | Role::Worker | Role::Lead => Handover::Type,
    }
}

/// The status other hosts hear for a pane-bound entity: its own, except that an idle one whose
/// agent the pane host sees busy is announced `busy` — a brief for it waits on the broker
/// unless its own poll is open (see [`may_take_task`]), and its sender's receipt bound waits
/// with it.
pub fn announced(gate: &TaskGate) -> WorkerStatus {
    if gate.status == WorkerStatus::Idle && gate.agent_busy {
        WorkerStatus::Busy
    } else {
        gate.status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_but_a_task_for_a_worker_is_carried_through_an_outage() {
        assert!(!carried(Kind::Send, true), "a task for a worker");
        assert!(carried(Kind::Send, false), "a worker's report to its lead");
        for kind in [Kind::Reply, Kind::Failed, Kind::Injected] {
            assert!(carried(kind, true), "{kind}");
            assert!(carried(kind, false), "{kind}");
        }
    }

    #[test]
    fn leads_hold_workers_queue_tasks_and_hold_the_rest() {
        for kind in Kind::ALL {
            assert_eq!(place(kind, Recipient::Lead, false), Placement::Hold);
            assert_eq!(
                place(kind, Recipient::Pane { live: false }, true),
                Placement::Dead
            );
        }
        let live = Recipient::Pane { live: true };
        assert_eq!(place(Kind::Send, live, false), Placement::Queue);
        for kind in [Kind::Reply, Kind::Failed, Kind::Answer] {
            assert_eq!(place(kind, live, false), Placement::Hold, "{kind}");
        }
    }

    #[test]
    fn nobody_here_goes_to_the_broker_or_nowhere() {
        assert_eq!(
            place(Kind::Send, Recipient::Elsewhere, true),
            Placement::Remote
        );
        assert_eq!(
            place(Kind::Reply, Recipient::Elsewhere, false),
            Placement::Dead
        );
    }

    fn idle() -> TaskGate {
        TaskGate {
            status: WorkerStatus::Idle,
            cap_reached: false,
            polls_open: 0,
            agent_busy: false,
            host_down: false,
            arriving: 0,
        }
    }

    #[test]
    fn an_idle_worker_takes_a_task_from_anyone() {
        for taker in [Taker::Pump, Taker::Poll, Taker::Broker] {
            assert!(may_take_task(&idle(), taker), "{taker:?}");
        }
    }

    #[test]
    fn every_taker_refuses_a_worker_that_is_not_free() {
        let not_free = [
            TaskGate {
                status: WorkerStatus::Busy,
                ..idle()
            },
            TaskGate {
                status: WorkerStatus::Spawning,
                ..idle()
            },
            TaskGate {
                cap_reached: true,
                ..idle()
            },
            TaskGate {
                host_down: true,
                ..idle()
            },
        ];
        for gate in not_free {
            for taker in [Taker::Pump, Taker::Poll, Taker::Broker] {
                assert!(!may_take_task(&gate, taker), "{gate:?} {taker:?}");
            }
        }
    }

    #[test]
    fn nothing_is_handed_over_while_a_brief_from_afar_waits_for_its_acknowledgement() {
        let arriving = TaskGate {
            arriving: 1,
            polls_open: 1,
            ..idle()
        };
        assert!(!may_take_task(&arriving, Taker::Pump));
        assert!(!may_take_task(&arriving, Taker::Poll));
        // Another brief may be kept behind it meanwhile.
        assert!(may_take_task(&arriving, Taker::Broker));
    }

    #[test]
    fn an_agent_the_pane_host_sees_busy_is_typed_nothing_but_its_own_poll_takes_a_task() {
        // The pane host sees the agent working (herdr): fleetd's idle is not enough to type.
        let working = TaskGate {
            agent_busy: true,
            ..idle()
        };
        for taker in [Taker::Pump, Taker::Poll, Taker::Broker] {
            assert!(!may_take_task(&working, taker), "{taker:?}");
        }
        // It is working on its own fleet_poll: that poll (and a brief from afar) hands it over.
        let polling = TaskGate {
            polls_open: 1,
            ..working
        };
        assert!(may_take_task(&polling, Taker::Poll));
        assert!(may_take_task(&polling, Taker::Broker));
        assert!(!may_take_task(&polling, Taker::Pump));
        let stopping = TaskGate {
            status: WorkerStatus::Busy,
            ..polling
        };
        assert!(!may_take_task(&stopping, Taker::Poll));
    }

    #[test]
    fn an_architect_gets_its_brief_typed_and_pulls_what_comes_later() {
        assert_eq!(handover(Role::Architect, false), Handover::Type);
        assert_eq!(handover(Role::Architect, true), Handover::Nudge);
        for briefed in [false, true] {
            assert_eq!(handover(Role::Worker, briefed), Handover::Type);
        }
    }

    #[test]
    fn an_idle_worker_the_pane_host_sees_busy_is_announced_busy() {
        assert_eq!(announced(&idle()), WorkerStatus::Idle);
        let working = TaskGate {
            agent_busy: true,
            ..idle()
        };
        assert_eq!(announced(&working), WorkerStatus::Busy);
        let asking = TaskGate {
            status: WorkerStatus::Asking,
            agent_busy: true,
            ..idle()
        };
        assert_eq!(announced(&asking), WorkerStatus::Asking);
    }

    #[test]
    fn the_pump_yields_to_an_open_poll() {
        let polling = TaskGate {
            polls_open: 1,
            ..idle()
        };
        assert!(!may_take_task(&polling, Taker::Pump));
        assert!(may_take_task(&polling, Taker::Poll));
        assert!(may_take_task(&polling, Taker::Broker));
    }
}
