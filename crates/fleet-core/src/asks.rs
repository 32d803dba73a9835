//! The rules of mid-turn asks (U2 on one host): whom a worker's question goes to, when it may
//! be asked at all, which lead call surfaces it, and what an answer finds. A dialog on a
//! worker's screen (its program waits for a key) is asked the same way, with the choices it
//! offers: its answer is one of them.
//!
//! Asks are live only: the table holds the open ones (each with `A`, the handle its answer
//! travels back through, the asking call) and remembers the recently finished ones, so a late
//! answer hears `too_late` rather than "unknown turn".

use std::collections::VecDeque;

use serde::Serialize;

use crate::dialog::{Choice, Dialog};
use crate::error::{ErrorCode, FleetError};
use crate::ids::{Gid, MsgId};

/// How many finished asks are remembered.
pub const OVER_KEPT: usize = 256;

/// A question as the lead sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Question {
    /// Answer it with `fleet_send{turn_id, message}`.
    pub turn_id: String,
    /// The asking worker's gid.
    pub from: Gid,
    /// Its name.
    pub from_name: String,
    /// Its host.
    pub host: String,
    /// The question (for a dialog: its text, as the worker's screen shows it).
    pub question: String,
    /// For a dialog: the choices it offers; answer with one (`fleet_send{turn_id, choice}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choices: Option<Vec<Choice>>,
    /// The task it is working on, if any.
    pub in_task: Option<MsgId>,
    /// When it asked (Unix ms).
    pub asked_ms: i64,
}

impl Question {
    /// The dialog it stands for, when it is one (an ask with choices).
    pub fn dialog(&self) -> Option<Dialog> {
        self.choices.as_ref().map(|choices| Dialog {
            prompt: self.question.clone(),
            choices: choices.clone(),
            cursor: None,
            in_colour: false,
        })
    }
}

/// Whom a worker asks: the sender of its task in flight, else the lead that spawned it.
pub fn whom_to_ask(task_from: Option<Gid>, parent: Option<Gid>) -> Result<Gid, FleetError> {
    task_from
        .or(parent)
        .ok_or_else(|| FleetError::invalid("you have no task in flight and no lead to ask"))
}

/// Whether a lead whose open calls listen as `listening` (per call, one worker's gid or `None`
/// for anyone) is waiting for a question from `worker` now.
pub fn listens_for(listening: &[Option<Gid>], worker: Gid) -> bool {
    listening.iter().any(|l| l.is_none_or(|g| g == worker))
}

/// An ask waiting for its answer.
struct Open<A> {
    question: Question,
    /// The lead it is for.
    to: Gid,
    /// Whether a lead's call has handed it out.
    surfaced: bool,
    /// Where the answer goes.
    answer: A,
}

/// Open asks, oldest first, and the recently finished ones.
pub struct AskTable<A> {
    open: Vec<Open<A>>,
    /// (turn id, the lead it was for, how it ended).
    over: VecDeque<(String, Gid, &'static str)>,
}

impl<A> Default for AskTable<A> {
    fn default() -> Self {
        Self {
            open: Vec::new(),
            over: VecDeque::new(),
        }
    }
}

impl<A> AskTable<A> {
    /// Opens `question` for the lead `to`; its answer goes to `answer`.
    pub fn open(&mut self, question: Question, to: Gid, answer: A) {
        self.open.push(Open {
            question,
            to,
            surfaced: false,
            answer,
        });
    }

    /// Hands out the oldest ask for `lead` not yet handed out (from `from` only, if given).
    pub fn surface(&mut self, lead: Gid, from: Option<Gid>) -> Option<Question> {
        let ask = self
            .open
            .iter_mut()
            .find(|a| a.to == lead && !a.surfaced && from.is_none_or(|f| a.question.from == f))?;
        ask.surfaced = true;
        Some(ask.question.clone())
    }

    /// Hands out the ask `turn_id` for `lead`, if it is open for `lead` (a call answers with
    /// it itself, as a spawn its start dialog): no later call hands it out again.
    pub fn hand_out(&mut self, turn_id: &str, lead: Gid) -> Option<Question> {
        let ask = self
            .open
            .iter_mut()
            .find(|a| a.to == lead && a.question.turn_id == turn_id)?;
        ask.surfaced = true;
        Some(ask.question.clone())
    }

    /// Ends the ask `turn_id` (if still open), remembering `how`; returns it and its handle.
    pub fn close(&mut self, turn_id: &str, how: &'static str) -> Option<(Question, A)> {
        let at = self
            .open
            .iter()
            .position(|a| a.question.turn_id == turn_id)?;
        let ask = self.open.remove(at);
        self.over.push_back((turn_id.to_string(), ask.to, how));
        while self.over.len() > OVER_KEPT {
            self.over.pop_front();
        }
        Some((ask.question, ask.answer))
    }

    /// Ends the ask `turn_id` if worker `from` asked it (it stopped waiting), dropping its
    /// handle: whether it was open.
    pub fn abandon(&mut self, turn_id: &str, from: Gid) -> bool {
        let asked_by = self
            .open
            .iter()
            .any(|a| a.question.turn_id == turn_id && a.question.from == from);
        asked_by && self.close(turn_id, "the worker stopped waiting").is_some()
    }

    /// Ends every open ask of worker `gid` (its session ended), dropping their handles: each
    /// asking call returns.
    pub fn close_from(&mut self, gid: Gid) {
        let turns: Vec<String> = self
            .open
            .iter()
            .filter(|a| a.question.from == gid)
            .map(|a| a.question.turn_id.clone())
            .collect();
        for turn in turns {
            self.close(&turn, "its worker's session ended");
        }
    }

    /// Whether the ask `turn_id` is open.
    pub fn is_open(&self, turn_id: &str) -> bool {
        self.open.iter().any(|a| a.question.turn_id == turn_id)
    }

    /// The turn of the open dialog `worker` shows, if one is asked now.
    pub fn dialog_from(&self, worker: Gid) -> Option<String> {
        self.open
            .iter()
            .find(|a| a.question.from == worker && a.question.choices.is_some())
            .map(|a| a.question.turn_id.clone())
    }

    /// The ask `turn_id` that `lead` may answer now; or why not — asked of someone else
    /// (`forbidden`), over already (`too_late`, saying how), or unknown.
    pub fn for_answer(&self, turn_id: &str, lead: Gid) -> Result<&Question, FleetError> {
        match self.open.iter().find(|a| a.question.turn_id == turn_id) {
            Some(ask) if ask.to != lead => Err(FleetError::new(
                ErrorCode::Forbidden,
                format!("the question {turn_id} was not asked of you"),
            )),
            Some(ask) => Ok(&ask.question),
            None => Err(match self.over.iter().find(|(t, _, _)| t == turn_id) {
                Some((_, to, how)) if *to == lead => FleetError::new(
                    ErrorCode::TooLate,
                    format!(
                        "the question {turn_id} is over ({how}); your answer was not delivered"
                    ),
                ),
                _ => FleetError::invalid(format!(
                    "no question with turn_id '{turn_id}' is waiting for your answer"
                )),
            }),
        }
    }

    /// Takes the ask `turn_id` for `lead`'s answer: its question and handle; or why not, as
    /// [`AskTable::for_answer`] says.
    pub fn take_for_answer(
        &mut self,
        turn_id: &str,
        lead: Gid,
    ) -> Result<(Question, A), FleetError> {
        self.for_answer(turn_id, lead)?;
        self.close(turn_id, "it was answered")
            .ok_or_else(|| FleetError::internal("an open ask vanished"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(turn: &str, from: Gid, asked_ms: i64) -> Question {
        Question {
            turn_id: turn.into(),
            from,
            from_name: "w1".into(),
            host: "h1".into(),
            question: "which branch?".into(),
            choices: None,
            in_task: None,
            asked_ms,
        }
    }

    #[test]
    fn only_its_asker_abandons_an_ask_and_a_later_answer_is_too_late() {
        let (lead, worker, other) = (Gid::mint(), Gid::mint(), Gid::mint());
        let mut table = AskTable::default();
        table.open(question("t1", worker, 1), lead, ());
        assert!(!table.abandon("t1", other), "another worker's abandon");
        assert!(!table.abandon("t9", worker), "an unknown turn");
        assert!(table.abandon("t1", worker));
        assert!(!table.abandon("t1", worker), "once");
        let err = table.take_for_answer("t1", lead).unwrap_err();
        assert_eq!(err.code, ErrorCode::TooLate);
        assert!(err.message.contains("stopped waiting"), "{err}");
    }

    #[test]
    fn a_worker_asks_its_tasks_sender_else_its_parent() {
        let (sender, parent) = (Gid::mint(), Gid::mint());
        assert_eq!(whom_to_ask(Some(sender), Some(parent)).unwrap(), sender);
        assert_eq!(whom_to_ask(None, Some(parent)).unwrap(), parent);
        assert_eq!(
            whom_to_ask(None, None).unwrap_err().code,
            ErrorCode::InvalidParams
        );
    }

    #[test]
    fn only_a_call_listening_for_the_worker_or_anyone_waits_for_it() {
        let (w1, w2) = (Gid::mint(), Gid::mint());
        assert!(!listens_for(&[], w1));
        assert!(listens_for(&[None], w1));
        assert!(listens_for(&[Some(w2), Some(w1)], w1));
        assert!(!listens_for(&[Some(w2)], w1));
    }

    #[test]
    fn asks_surface_once_oldest_first_and_by_worker() {
        let (lead, w1, w2) = (Gid::mint(), Gid::mint(), Gid::mint());
        let mut table = AskTable::default();
        table.open(question("t1", w1, 1), lead, ());
        table.open(question("t2", w2, 2), lead, ());
        assert_eq!(table.surface(lead, Some(w2)).unwrap().turn_id, "t2");
        assert_eq!(table.surface(lead, None).unwrap().turn_id, "t1");
        assert_eq!(table.surface(lead, None), None);
        assert_eq!(table.surface(Gid::mint(), None), None);
        // One a call handed out itself is not handed out again; only its lead's call hands it.
        table.open(question("t3", w1, 3), lead, ());
        assert_eq!(table.hand_out("t3", Gid::mint()), None);
        assert_eq!(table.hand_out("t3", lead).unwrap().turn_id, "t3");
        assert_eq!(table.surface(lead, None), None);
    }

    #[test]
    fn an_answer_finds_its_ask_once_then_hears_too_late() {
        let (lead, other, w1) = (Gid::mint(), Gid::mint(), Gid::mint());
        let mut table = AskTable::default();
        table.open(question("t1", w1, 1), lead, "handle");
        let err = table.take_for_answer("t1", other).unwrap_err();
        assert_eq!(err.code, ErrorCode::Forbidden);
        let (asked, handle) = table.take_for_answer("t1", lead).unwrap();
        assert_eq!((asked.turn_id.as_str(), handle), ("t1", "handle"));
        let late = table.take_for_answer("t1", lead).unwrap_err();
        assert_eq!(late.code, ErrorCode::TooLate);
        assert!(late.message.contains("it was answered"), "{late}");
        // Someone else's finished ask is just unknown to this lead.
        assert_eq!(
            table.take_for_answer("t1", other).unwrap_err().code,
            ErrorCode::InvalidParams
        );
        assert_eq!(
            table.take_for_answer("t9", lead).unwrap_err().code,
            ErrorCode::InvalidParams
        );
    }

    #[test]
    fn looking_at_an_ask_for_an_answer_does_not_take_it() {
        let (lead, other, w1) = (Gid::mint(), Gid::mint(), Gid::mint());
        let mut table = AskTable::default();
        table.open(question("t1", w1, 1), lead, ());
        assert_eq!(table.dialog_from(w1), None, "a question is no dialog");
        let dialog = Question {
            choices: Some(vec![Choice {
                choice: "1".into(),
                label: "Yes".into(),
            }]),
            ..question("d1", w1, 2)
        };
        assert_eq!(question("t9", w1, 1).dialog(), None);
        let shown = dialog.dialog().unwrap();
        assert_eq!(
            (shown.prompt.as_str(), shown.offered().as_str()),
            ("which branch?", "1")
        );
        table.open(dialog, lead, ());
        assert_eq!(table.dialog_from(w1).as_deref(), Some("d1"));
        assert!(table.is_open("d1"));
        assert_eq!(table.for_answer("d1", lead).unwrap().turn_id, "d1");
        assert_eq!(
            table.for_answer("d1", other).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert!(table.take_for_answer("d1", lead).is_ok());
        assert_eq!(
            table.for_answer("d1", lead).unwrap_err().code,
            ErrorCode::TooLate
        );
        assert!(!table.is_open("d1"));
        assert_eq!(table.dialog_from(w1), None);
    }

    #[test]
    fn a_worker_gone_ends_its_asks_and_the_memory_is_bounded() {
        let (lead, w1, w2) = (Gid::mint(), Gid::mint(), Gid::mint());
        let mut table = AskTable::default();
        table.open(question("t1", w1, 1), lead, ());
        table.open(question("t2", w2, 2), lead, ());
        table.close_from(w1);
        let err = table.take_for_answer("t1", lead).unwrap_err();
        assert!(err.message.contains("its worker's session ended"), "{err}");
        assert!(table.take_for_answer("t2", lead).is_ok());
        for i in 0..OVER_KEPT + 10 {
            let turn = format!("x{i}");
            table.open(question(&turn, w2, 3), lead, ());
            table.close(&turn, "the worker stopped waiting");
        }
        assert!(table.over.len() <= OVER_KEPT);
        assert_eq!(
            table.take_for_answer("x0", lead).unwrap_err().code,
            ErrorCode::InvalidParams
        );
    }
}
