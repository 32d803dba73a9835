//! What a `fleet_send` does, decided before anything moves: whether it may go at all (not to
//! oneself; a worker only to its own lead; a lead only to its own workers and those shared with
//! it; inert text for a pane; one line for a profile that takes one; a pane host that answers),
//! which trace it joins, and what is known of its fate without asking the store. The gateway
//! gathers the facts under its lock, asks [`plan_send`], and acts on the plan.

use crate::authz::check_send;
use crate::delivery::Placement;
use crate::error::{ErrorCode, FleetError};
use crate::ownership::{Action, LeadRef, Owned, Principal, check};
use crate::typed::{first_line_end, multi_line_refusal, typeable};
use crate::{Entity, Gid, Role, TraceId};

/// What the gateway knows of a send when it is asked.
#[derive(Clone, Debug)]
pub struct SendFacts<'a> {
    /// Who sends.
    pub caller: &'a Entity,
    /// To whom, as the route resolved it.
    pub recipient: &'a Entity,
    /// The recipient lives on another host.
    pub remote: bool,
    /// The message's text.
    pub text: &'a str,
    /// The recipient's session on this host, when it has one.
    pub session: Option<SessionFacts>,
    /// Why this host's pane host cannot be reached, while it cannot.
    pub host_down: Option<&'a str>,
    /// The trace of the caller's own task in flight (a worker sending in its task's name).
    pub caller_trace: Option<TraceId>,
}

/// What of the recipient's session here decides a send.
#[derive(Clone, Debug)]
pub struct SessionFacts {
    /// The lead that spawned it.
    pub owner: Option<Gid>,
    /// The leads it is shared with.
    pub shared: Vec<LeadRef>,
    /// Its profile takes a task of one line only.
    pub single_line: bool,
}

/// What a send that may go does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendPlan {
    /// The trace it joins: the caller's task's; `None` for a new one.
    pub trace: Option<TraceId>,
    /// A brief to a pane-bound entity on another host, whose receipt is awaited.
    pub brief: bool,
    /// A message to a lead on another host: held for it there, nothing of it kept here.
    pub held_elsewhere: bool,
}

impl SendPlan {
    /// Whether its message is known to be held for its recipient without asking the store,
    /// once it was placed as `placement` by a send that does not wait (`waits` false).
    pub fn known_held(&self, placement: Placement, waits: bool) -> bool {
        self.held_elsewhere || (placement == Placement::Hold && !waits)
    }
}

/// Decides a send from `facts`: its plan, or why it may not go (nothing was queued then).
pub fn plan_send(facts: &SendFacts<'_>) -> Result<SendPlan, FleetError> {
    let (caller, recipient) = (facts.caller, facts.recipient);
    if recipient.gid == caller.gid {
        return Err(FleetError::invalid("you cannot send a message to yourself"));
    }
    check_send(caller, recipient)?;
    let pane_bound = recipient.role.is_pane_bound();
    if pane_bound {
        // Typed into its pane (here or on its host): inert text only.
        typeable(facts.text).map_err(|found| found.refusal())?;
        // Its owner's, or shared with the caller (another host's worker: its host judges).
        if let Some(session) = &facts.session {
            if caller.role == Role::Lead {
                let owned = Owned {
                    owner: session.owner,
                    shared: &session.shared,
                };
                check(Principal::Lead(caller), Action::Task, recipient, owned)?;
            }
            if session.single_line
                && let Some(offset) = first_line_end(facts.text)
            {
                return Err(multi_line_refusal(&recipient.name, offset));
            }
        }
    }
    if !facts.remote
        && pane_bound
        && let Some(down) = facts.host_down
    {
        return Err(FleetError::new(
            ErrorCode::PaneHost,
            format!(
                "'{}' cannot be reached: {down}; nothing was queued, and messages held for you are kept",
                recipient.name
            ),
        ));
    }
    Ok(SendPlan {
        trace: facts.caller_trace,
        brief: facts.remote && pane_bound,
        held_elsewhere: facts.remote && !pane_bound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(name: &str, host: &str, role: Role, parent: Option<Gid>) -> Entity {
        Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: host.into(),
            role,
            profile: None,
            sandbox: None,
            profile_role: None,
            groups: vec![],
            parent,
        }
    }

    struct World {
        alice: Entity,
        bob: Entity,
        w1: Entity,
        remote: Entity,
        shared: Vec<LeadRef>,
    }

    fn world() -> World {
        let alice = entity("alice", "a", Role::Lead, None);
        let bob = entity("bob", "a", Role::Lead, None);
        let w1 = entity("w1", "a", Role::Worker, Some(alice.gid));
        let remote = entity("w9", "b", Role::Worker, Some(alice.gid));
        World {
            alice,
            bob,
            w1,
            remote,
            shared: vec![],
        }
    }

    fn facts<'a>(w: &'a World, caller: &'a Entity, recipient: &'a Entity) -> SendFacts<'a> {
        SendFacts {
            caller,
            recipient,
            remote: recipient.host != caller.host,
            text: "a task",
            session: (recipient.host == "a" && recipient.role.is_pane_bound()).then(|| {
                SessionFacts {
                    owner: recipient.parent,
                    shared: w.shared.clone(),
                    single_line: false,
                }
            }),
            host_down: None,
            caller_trace: None,
        }
    }

    #[test]
    fn a_lead_tasks_its_own_worker_in_a_new_trace() {
        let w = world();
        let plan = plan_send(&facts(&w, &w.alice, &w.w1)).unwrap();
        assert_eq!(
            plan,
            SendPlan {
                trace: None,
                brief: false,
                held_elsewhere: false
            }
        );
        // Typed in here: the store knows whether it is held, unless a send that does not wait
        // left it held.
        assert!(!plan.known_held(Placement::Queue, false));
        assert!(plan.known_held(Placement::Hold, false));
        assert!(!plan.known_held(Placement::Hold, true));
    }

    #[test]
    fn nobody_sends_to_itself() {
        let w = world();
        let err = plan_send(&facts(&w, &w.alice, &w.alice)).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams);
    }

    #[test]
    fn another_leads_worker_takes_no_task_unless_shared_with_the_sender() {
        let mut w = world();
        let err = plan_send(&facts(&w, &w.bob, &w.w1)).unwrap_err();
        assert_eq!(err.code, ErrorCode::Forbidden);
        assert!(!err.message.contains("alice"), "{err:?}");
        w.shared = vec![LeadRef {
            name: "bob".into(),
            host: "a".into(),
        }];
        assert!(plan_send(&facts(&w, &w.bob, &w.w1)).is_ok());
    }

    #[test]
    fn a_worker_sends_only_to_its_own_lead_and_in_its_tasks_trace() {
        let w = world();
        let trace = TraceId::mint();
        let mut up = facts(&w, &w.w1, &w.alice);
        up.caller_trace = Some(trace);
        assert_eq!(plan_send(&up).unwrap().trace, Some(trace));
        let err = plan_send(&facts(&w, &w.w1, &w.bob)).unwrap_err();
        assert_eq!(err.code, ErrorCode::Forbidden);
    }

    #[test]
    fn a_pane_gets_inert_text_and_a_single_line_profile_one_line() {
        let w = world();
        let mut f = facts(&w, &w.alice, &w.w1);
        f.text = "stop\u{1b}[201~now";
        assert!(plan_send(&f).is_err());
        f.text = "first\nsecond";
        assert!(plan_send(&f).is_ok());
        f.session = f.session.map(|s| SessionFacts {
            single_line: true,
            ..s
        });
        let err = plan_send(&f).unwrap_err();
        assert!(err.message.contains("w1"), "{err:?}");
        // A lead is no pane: its messages may hold anything printable.
        let mut to_lead = facts(&w, &w.w1, &w.alice);
        to_lead.text = "first\nsecond";
        assert!(plan_send(&to_lead).is_ok());
    }

    #[test]
    fn a_pane_host_that_cannot_be_reached_refuses_a_local_task_but_not_a_remote_one() {
        let w = world();
        let mut f = facts(&w, &w.alice, &w.w1);
        f.host_down = Some("tmux is gone");
        let err = plan_send(&f).unwrap_err();
        assert_eq!(err.code, ErrorCode::PaneHost);
        assert!(err.message.contains("tmux is gone"), "{err:?}");
        let mut far = facts(&w, &w.alice, &w.remote);
        far.host_down = Some("tmux is gone");
        let plan = plan_send(&far).unwrap();
        assert!(plan.brief && !plan.held_elsewhere);
        // A lead on another host holds it there.
        let carol = entity("carol", "b", Role::Lead, None);
        let plan = plan_send(&facts(&w, &w.alice, &carol)).unwrap();
        assert!(!plan.brief && plan.held_elsewhere);
        assert!(plan.known_held(Placement::Remote, true));
    }
}
