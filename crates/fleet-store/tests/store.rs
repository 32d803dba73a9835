//! The SQLite store against a real database file in a temp dir.

// A test may unwrap: a panic is how it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_core::bounds::{Full, HELD_KEY, admit_waiting};
use fleet_core::clock::now_ms;
use fleet_core::{Entity, Gid, Kind, Message, MsgId, MsgState, Role, TraceId, WorkerStatus};
use fleet_store::{
    Answer, AwaitedReceipt, EntityRecord, Inserted, MessageFilter, SentRecord, SqliteStore, Store,
    StoreError,
};
use fleet_testkit::fleet::change_log_of_schema_12;

fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(&dir.path().join("fleet.db")).unwrap()
}

fn message(from: Gid, to: Gid, state: MsgState, body: &str) -> Message {
    Message {
        msg_id: MsgId::mint(),
        trace_id: TraceId::mint(),
        kind: Kind::Send,
        from,
        to,
        in_reply_to: None,
        body: body.into(),
        state,
        created_ms: 1,
        expires_ms: None,
    }
}

/// A lead and a worker, with a task queued for the worker, one being typed into it, and a
/// reply held for the lead.
fn mixed_traffic(store: &SqliteStore) -> (Gid, Gid) {
    let (lead, w) = (Gid::mint(), Gid::mint());
    for m in [
        message(lead, w, MsgState::Queued, "q"),
        message(lead, w, MsgState::Injecting, "i"),
        message(w, lead, MsgState::Held, "h"),
    ] {
        store.insert_message(&m).unwrap();
    }
    (lead, w)
}

fn worker(name: &str, parent: Gid) -> EntityRecord {
    EntityRecord {
        entity: Entity {
            gid: Gid::mint(),
            name: name.into(),
            host: "h".into(),
            role: Role::Worker,
            profile: Some("sim".into()),
            sandbox: None,
            profile_role: None,
            groups: vec!["core".into()],
            parent: Some(parent),
        },
        status: WorkerStatus::Spawning,
        pane: None,
        created_ms: 5,
    }
}

#[test]
fn a_leads_gid_is_fixed_at_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(&dir).ensure_lead("alice", "h", &[]).unwrap();
    let store = open(&dir);
    assert_eq!(
        store.ensure_lead("alice", "h", &["core".into()]).unwrap(),
        first
    );
    assert_ne!(store.ensure_lead("bob", "h", &[]).unwrap(), first);
    let alice = store.entity(first).unwrap().unwrap();
    assert_eq!(alice.entity.groups, vec!["core".to_string()]);
    assert_eq!(alice.entity.role, Role::Lead);
}

#[test]
fn rotating_a_token_revokes_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let gid = store.ensure_lead("alice", "h", &[]).unwrap();
    store.put_token(gid, &[1; 32], false).unwrap();
    assert_eq!(store.gid_for_token(&[1; 32]).unwrap(), Some(gid));
    store.put_token(gid, &[2; 32], true).unwrap();
    assert_eq!(store.gid_for_token(&[1; 32]).unwrap(), None);
    assert_eq!(store.gid_for_token(&[2; 32]).unwrap(), Some(gid));
    store.revoke_tokens(gid).unwrap();
    assert_eq!(store.gid_for_token(&[2; 32]).unwrap(), None);
}

/// The serving gateway keeps the tokens it resolved; `fleetd token --rotate` is another
/// process with the store open on the same file. What it rotates or revokes is refused by the
/// gateway's next lookup, cached or not.
#[test]
fn a_token_another_process_rotates_or_revokes_stops_resolving_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gateway, cli) = (open(&dir), open(&dir));
    let gid = cli.ensure_lead("alice", "h", &[]).unwrap();
    cli.put_token(gid, &[1; 32], true).unwrap();
    for _ in 0..3 {
        assert_eq!(gateway.gid_for_token(&[1; 32]).unwrap(), Some(gid));
    }
    cli.put_token(gid, &[2; 32], true).unwrap();
    assert_eq!(gateway.gid_for_token(&[1; 32]).unwrap(), None);
    assert_eq!(gateway.gid_for_token(&[2; 32]).unwrap(), Some(gid));
    assert_eq!(gateway.gid_for_token(&[2; 32]).unwrap(), Some(gid));
    cli.revoke_tokens(gid).unwrap();
    assert_eq!(gateway.gid_for_token(&[2; 32]).unwrap(), None);
    // And the other way: what the gateway revokes, the other process stops resolving too.
    gateway.put_token(gid, &[3; 32], true).unwrap();
    assert_eq!(cli.gid_for_token(&[3; 32]).unwrap(), Some(gid));
    gateway.revoke_tokens(gid).unwrap();
    assert_eq!(cli.gid_for_token(&[3; 32]).unwrap(), None);
}

#[test]
fn live_names_are_unique_until_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let lead = store.ensure_lead("alice", "h", &[]).unwrap();
    let first = worker("w1", lead);
    store.insert_entity(&first).unwrap();
    assert!(matches!(
        store.insert_entity(&worker("w1", lead)),
        Err(StoreError::NameTaken(name)) if name == "w1"
    ));
    assert!(matches!(
        store.insert_entity(&worker("alice", lead)),
        Err(StoreError::NameTaken(_))
    ));
    store
        .set_session(first.entity.gid, WorkerStatus::Idle, Some("%3"))
        .unwrap();
    let back = store.entity(first.entity.gid).unwrap().unwrap();
    assert_eq!(
        (back.status, back.pane.as_deref()),
        (WorkerStatus::Idle, Some("%3"))
    );
    store
        .set_session(first.entity.gid, WorkerStatus::Gone, None)
        .unwrap();
    let second = worker("w1", lead);
    store.insert_entity(&second).unwrap();
    let latest = store.latest_named("w1").unwrap().unwrap();
    assert_eq!(latest.entity.gid, second.entity.gid);
    assert!(store.latest_named("nobody").unwrap().is_none());
    let live: Vec<String> = store
        .live_entities()
        .unwrap()
        .into_iter()
        .map(|r| r.entity.name)
        .collect();
    assert_eq!(live, vec!["alice", "w1"]);
}

#[test]
fn a_message_id_is_accepted_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let m = message(Gid::mint(), Gid::mint(), MsgState::Held, "hi");
    assert!(store.insert_message(&m).unwrap());
    assert!(!store.insert_message(&m).unwrap());
    assert_eq!(store.held_count(m.to).unwrap(), 1);
}

#[test]
fn messages_waiting_for_one_recipient_stop_at_the_cap_and_what_is_there_stays() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let cap = 3;
    let admit = |m: &Message, waiting: usize| admit_waiting(m.kind, waiting, cap);
    // Held and queued both wait: two held and one queued fill the cap, one at a time.
    let first = message(w, lead, MsgState::Held, "one");
    for m in [
        first.clone(),
        message(w, lead, MsgState::Held, "two"),
        message(w, lead, MsgState::Queued, "three"),
    ] {
        assert_eq!(
            store.insert_messages_within(&[m], &admit).unwrap(),
            [Ok(Inserted::New)]
        );
    }
    // One more is refused, naming the count and the cap, and nothing of it is stored.
    let over = message(w, lead, MsgState::Held, "four");
    let refused = store
        .insert_messages_within(std::slice::from_ref(&over), &admit)
        .unwrap();
    assert_eq!(
        refused,
        [Err(Full {
            count: 3,
            cap: 3,
            key: HELD_KEY
        })]
    );
    assert!(store.message(over.msg_id).unwrap().is_none());
    // A redelivery of what was accepted is a duplicate, not a refusal; a record that does not
    // wait (a failed one) is not counted; another recipient has a cap of its own.
    assert_eq!(
        store.insert_messages_within(&[first], &admit).unwrap(),
        [Ok(Inserted::Seen)]
    );
    let failed = message(lead, w, MsgState::Failed("gone".into()), "x");
    let failed_to_lead = Message {
        to: lead,
        ..failed.clone()
    };
    assert_eq!(
        store
            .insert_messages_within(&[failed_to_lead], &admit)
            .unwrap(),
        [Ok(Inserted::New)]
    );
    assert_eq!(
        store
            .insert_messages_within(&[message(lead, w, MsgState::Queued, "t")], &admit)
            .unwrap(),
        [Ok(Inserted::New)]
    );
    // A notice has its reserve.
    let notice = Message {
        kind: Kind::Failed,
        ..message(w, lead, MsgState::Held, "not delivered")
    };
    assert_eq!(
        store.insert_messages_within(&[notice], &admit).unwrap(),
        [Ok(Inserted::New)]
    );
    // Four wait now (the notice among them); taking two frees one place, and in one call
    // those accepted earlier count.
    assert_eq!(store.take_held(lead, None, 2).unwrap().len(), 2);
    let batch = [
        message(w, lead, MsgState::Held, "five"),
        message(w, lead, MsgState::Held, "six"),
    ];
    let outcomes = store.insert_messages_within(&batch, &admit).unwrap();
    assert_eq!(outcomes[0], Ok(Inserted::New));
    assert!(outcomes[1].is_err(), "{outcomes:?}");
    assert_eq!(store.held_count(lead).unwrap(), 2);
}

#[test]
fn a_task_taken_as_it_is_accepted_never_goes_ahead_of_one_queued_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let cap = 2;
    let admit = |m: &Message, waiting: usize| admit_waiting(m.kind, waiting, cap);
    // Nothing queued: it goes in taken, and counts for no cap.
    let first = message(lead, w, MsgState::Injecting, "first");
    assert_eq!(
        store
            .insert_messages_within(std::slice::from_ref(&first), &admit)
            .unwrap(),
        [Ok(Inserted::New)]
    );
    assert_eq!(
        store.message(first.msg_id).unwrap().unwrap().state,
        MsgState::Injecting
    );
    assert!(store.dequeue(w, &MsgState::Injecting).unwrap().is_none());
    // Offered again, it is a duplicate, whatever state it is offered in.
    assert_eq!(
        store
            .insert_messages_within(std::slice::from_ref(&first), &admit)
            .unwrap(),
        [Ok(Inserted::Seen)]
    );
    // Something queued: offered taken, it is queued behind it instead, within the cap.
    let queued = message(lead, w, MsgState::Queued, "queued");
    let second = message(lead, w, MsgState::Injecting, "second");
    let third = message(lead, w, MsgState::Injecting, "third");
    let outcomes = store
        .insert_messages_within(&[queued.clone(), second.clone(), third.clone()], &admit)
        .unwrap();
    assert_eq!(outcomes[..2], [Ok(Inserted::New), Ok(Inserted::Queued)]);
    assert!(outcomes[2].is_err(), "past the cap: {outcomes:?}");
    assert!(store.message(third.msg_id).unwrap().is_none());
    assert_eq!(
        store.message(second.msg_id).unwrap().unwrap().state,
        MsgState::Queued
    );
    let order: Vec<String> = std::iter::from_fn(|| store.dequeue(w, &MsgState::Injecting).unwrap())
        .map(|m| m.body)
        .collect();
    assert_eq!(order, ["queued", "second"]);
    // Another recipient's queue is not its own.
    let elsewhere = message(lead, Gid::mint(), MsgState::Injecting, "elsewhere");
    store
        .insert_message(&message(lead, w, MsgState::Queued, "w's"))
        .unwrap();
    assert_eq!(
        store.insert_messages_within(&[elsewhere], &admit).unwrap(),
        [Ok(Inserted::New)]
    );
}

#[test]
fn messages_stored_together_keep_their_order_and_duplicates_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (from, to) = (Gid::mint(), Gid::mint());
    let seen = message(from, to, MsgState::Held, "seen before");
    store.insert_message(&seen).unwrap();
    let (a, b) = (
        message(from, to, MsgState::Held, "a"),
        message(from, to, MsgState::Held, "b"),
    );
    let fresh = store
        .insert_messages(&[a.clone(), seen.clone(), b.clone(), a.clone()])
        .unwrap();
    assert_eq!(fresh, [true, false, true, false]);
    let bodies: Vec<String> = store
        .take_held(to, None, 10)
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(bodies, ["seen before", "a", "b"]);
}

#[test]
fn queued_briefs_leave_in_order_and_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let first = message(lead, w, MsgState::Queued, "one");
    let second = message(lead, w, MsgState::Queued, "two");
    store.insert_message(&first).unwrap();
    store.insert_message(&second).unwrap();
    assert_eq!(store.waiting_count(w).unwrap(), 2);
    let taken = store.dequeue(w, &MsgState::Injecting).unwrap().unwrap();
    assert_eq!(taken.body, "one");
    assert_eq!(store.waiting_count(w).unwrap(), 1);
    assert_eq!(taken.state, MsgState::Injecting);
    store.transition(first.msg_id, &MsgState::Injected).unwrap();
    let err = store
        .transition(first.msg_id, &MsgState::Queued)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot go from injected to queued"),
        "{err}"
    );
    assert_eq!(
        store.dequeue(w, &MsgState::Held).unwrap().unwrap().body,
        "two"
    );
    assert!(store.dequeue(w, &MsgState::Injecting).unwrap().is_none());
    // Taken for a poll, the second waits there, held, until the poll drains it.
    assert_eq!(store.waiting_count(w).unwrap(), 1);
    assert_eq!(store.take_held(w, None, 10).unwrap().len(), 1);
    assert_eq!(store.waiting_count(w).unwrap(), 0);
    assert_eq!(store.waiting_count(Gid::mint()).unwrap(), 0);
    assert!(matches!(
        store.transition(MsgId::mint(), &MsgState::Injected),
        Err(StoreError::NoMessage(_))
    ));
}

#[test]
fn a_queued_brief_keeps_its_expiry_until_it_is_taken_off_its_queue_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (lead, w) = (Gid::mint(), Gid::mint());
    let brief = Message {
        expires_ms: Some(1_234),
        ..message(lead, w, MsgState::Queued, "from afar")
    };
    let local = message(lead, w, MsgState::Queued, "from here");
    {
        let store = open(&dir);
        store.insert_messages(&[brief.clone(), local]).unwrap();
        assert_eq!(
            store.message(brief.msg_id).unwrap().unwrap().expires_ms,
            Some(1_234)
        );
    }
    let store = open(&dir);
    let taken = store.dequeue(w, &MsgState::Injecting).unwrap().unwrap();
    assert_eq!(
        (taken.body.as_str(), taken.expires_ms),
        ("from afar", Some(1_234))
    );
    assert!(taken.expired(1_234) && !taken.expired(1_233));
    let taken = store.dequeue(w, &MsgState::Injecting).unwrap().unwrap();
    assert_eq!((taken.body.as_str(), taken.expires_ms), ("from here", None));
    assert!(!taken.expired(i64::MAX));
}

#[test]
fn held_replies_drain_exactly_once_oldest_first_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let (lead, w1, w2) = (Gid::mint(), Gid::mint(), Gid::mint());
    let bodies = ["a", "b", "c", "d"];
    {
        let store = open(&dir);
        for (i, body) in bodies.iter().enumerate() {
            let from = if i % 2 == 0 { w1 } else { w2 };
            store
                .insert_message(&message(from, lead, MsgState::Held, body))
                .unwrap();
        }
    }
    let store = open(&dir);
    let from_w2: Vec<String> = store
        .take_held(lead, Some(w2), 10)
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(from_w2, vec!["b", "d"]);
    let first = store.take_held(lead, None, 1).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].body, "a");
    let rest: Vec<String> = store
        .take_held(lead, None, 10)
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(rest, vec!["c"]);
    assert!(store.take_held(lead, None, 10).unwrap().is_empty());
    let again = store.message(first[0].msg_id).unwrap().unwrap();
    assert_eq!(again.state, MsgState::Consumed);
}

#[test]
fn an_answer_is_found_by_what_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let task = message(lead, w, MsgState::Queued, "task");
    store.insert_message(&task).unwrap();
    assert!(store.take_answer(lead, task.msg_id).unwrap().is_none());
    // A notice about the task (a stall) is no answer to it: it waits for a poll.
    let mut notice = message(w, lead, MsgState::Held, "[fleet] stalled");
    notice.in_reply_to = Some(task.msg_id);
    store.insert_message(&notice).unwrap();
    store
        .insert_message(&message(w, lead, MsgState::Held, "other"))
        .unwrap();
    assert!(!store.answer_waits(lead, task.msg_id).unwrap());
    let mut reply = message(w, lead, MsgState::Held, "done");
    reply.kind = Kind::Reply;
    reply.in_reply_to = Some(task.msg_id);
    store.insert_message(&reply).unwrap();
    // Seen on the reader as soon as it is committed, and only by the one it answers.
    assert!(store.answer_waits(lead, task.msg_id).unwrap());
    assert!(!store.answer_waits(w, task.msg_id).unwrap());
    let got = store.take_answer(lead, task.msg_id).unwrap().unwrap();
    assert_eq!(got.body, "done");
    assert!(!store.answer_waits(lead, task.msg_id).unwrap());
    assert!(store.take_answer(lead, task.msg_id).unwrap().is_none());
    assert_eq!(store.held_count(lead).unwrap(), 2);
}

#[test]
fn a_failure_notice_about_a_task_already_answered_is_taken_as_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let (task, other) = (
        message(lead, w, MsgState::Injected, "task"),
        message(lead, w, MsgState::Injected, "another"),
    );
    let mut reply = message(w, lead, MsgState::Held, "done");
    reply.kind = Kind::Reply;
    reply.in_reply_to = Some(task.msg_id);
    store.insert_message(&reply).unwrap();
    let failed =
        |about: &Message| Message::notice(about, Kind::Failed, "'w' never answered".into(), 2);
    // Its reply there (held or taken): the notice changes nothing.
    assert!(!store.insert_message(&failed(&task)).unwrap());
    store.take_answer(lead, task.msg_id).unwrap().unwrap();
    let within = store
        .insert_messages_within(&[failed(&task), failed(&other)], &|_, _| Ok(()))
        .unwrap();
    assert_eq!(
        within,
        vec![Ok(Inserted::Seen), Ok(Inserted::New)],
        "a task not answered is failed"
    );
    let held: Vec<Option<MsgId>> = store
        .take_held(lead, None, 10)
        .unwrap()
        .into_iter()
        .map(|m| m.in_reply_to)
        .collect();
    assert_eq!(held, vec![Some(other.msg_id)]);
}

#[test]
fn a_task_whose_enter_went_in_as_its_worker_ended_is_left_to_its_typing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let entered = message(lead, w, MsgState::Injecting, "entered");
    let pasted = message(lead, w, MsgState::Injecting, "pasted");
    let untyped = message(lead, w, MsgState::Injecting, "untyped");
    let queued = message(lead, w, MsgState::Queued, "queued");
    for m in [&entered, &pasted, &untyped, &queued] {
        store.insert_message(m).unwrap();
    }
    assert!(store.keys_sent(entered.msg_id).unwrap());
    assert!(store.enter_sent(entered.msg_id).unwrap());
    assert!(store.keys_sent(pasted.msg_id).unwrap());
    let failed_ids = |failed: Vec<Message>| {
        let mut ids: Vec<_> = failed.iter().map(|m| m.msg_id).collect();
        ids.sort();
        ids
    };
    // In flight before its keys, or only pasted: failed (its Enter is then withheld).
    for in_flight in [&untyped, &pasted] {
        let dir = tempfile::tempdir().unwrap();
        let other = open(&dir);
        for m in [&entered, &pasted, &untyped, &queued] {
            other.insert_message(m).unwrap();
        }
        other.keys_sent(pasted.msg_id).unwrap();
        let failed = other
            .fail_undelivered_to(w, "gone", Some(in_flight.msg_id))
            .unwrap();
        assert!(
            failed.iter().any(|m| m.msg_id == in_flight.msg_id),
            "{}",
            in_flight.body
        );
    }
    // In flight with its Enter in: left, the rest failed.
    let failed = store
        .fail_undelivered_to(w, "gone", Some(entered.msg_id))
        .unwrap();
    let mut expected = vec![pasted.msg_id, untyped.msg_id, queued.msg_id];
    expected.sort();
    assert_eq!(failed_ids(failed), expected);
    assert_eq!(
        store.message(entered.msg_id).unwrap().map(|m| m.state),
        Some(MsgState::Injecting)
    );
    // Not in flight (a restart's leftover): failed, Enter or not.
    let failed = store.fail_undelivered_to(w, "gone", None).unwrap();
    assert_eq!(failed_ids(failed), vec![entered.msg_id]);
}

#[test]
fn undelivered_and_interrupted_messages_fail_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = mixed_traffic(&store);
    let failed = store.fail_undelivered_to(w, "worker gone", None).unwrap();
    assert_eq!(failed.len(), 2);
    assert!(
        failed
            .iter()
            .all(|m| m.state == MsgState::Failed("worker gone".into()))
    );
    assert_eq!(store.held_count(lead).unwrap(), 1);
}

#[test]
fn a_restart_fails_what_was_being_typed_or_waiting_to_be() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, _worker) = mixed_traffic(&store);
    let failed = store
        .fail_leftovers("interrupted", "orphaned", &[Gid::mint()])
        .unwrap();
    let reasons: Vec<(String, Option<&str>)> = failed
        .iter()
        .map(|m| (m.body.clone(), m.state.reason()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("i".into(), Some("interrupted")),
            ("q".into(), Some("orphaned"))
        ]
    );
    assert_eq!(store.held_count(lead).unwrap(), 1);
}

#[test]
fn unanswered_tasks_are_found_and_answered_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let answered = message(lead, w, MsgState::Injected, "done");
    let open_task = message(lead, w, MsgState::Injected, "in flight");
    let still_queued = message(lead, w, MsgState::Queued, "later");
    let mut reply = message(w, lead, MsgState::Held, "answer");
    reply.kind = Kind::Reply;
    reply.in_reply_to = Some(answered.msg_id);
    for m in [&answered, &open_task, &still_queued, &reply] {
        store.insert_message(m).unwrap();
    }
    let open: Vec<String> = store
        .unanswered_tasks_to(w)
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(open, vec!["in flight"]);
    // Answered by a reply that went to another host: no longer open (said twice, noted once).
    store.answered_elsewhere(open_task.msg_id, true).unwrap();
    store.answered_elsewhere(open_task.msg_id, true).unwrap();
    assert!(store.unanswered_tasks_to(w).unwrap().is_empty());
}

#[test]
fn a_task_has_one_answer_and_a_second_reply_is_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let task = message(lead, w, MsgState::Injected, "do it");
    let elsewhere = message(lead, w, MsgState::Injected, "do it there");
    store.insert_message(&task).unwrap();
    store.insert_message(&elsewhere).unwrap();
    assert!(!store.is_answered(task.msg_id).unwrap());
    let reply = |body: &str| {
        let mut reply = message(w, lead, MsgState::Held, body);
        reply.kind = Kind::Reply;
        reply.in_reply_to = Some(task.msg_id);
        reply
    };
    assert!(store.insert_message(&reply("first")).unwrap());
    assert!(store.is_answered(task.msg_id).unwrap());
    // A second answer to the same task, with an id of its own, is not stored.
    assert!(!store.insert_message(&reply("second")).unwrap());
    let held: Vec<String> = store
        .take_held(lead, None, 10)
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(held, vec!["first"]);
    // Failed to a sender on another host: a reply after that still goes; replied there: no
    // second (and a failure noted after the reply does not undo it).
    assert!(!store.is_answered(elsewhere.msg_id).unwrap());
    store.answered_elsewhere(elsewhere.msg_id, false).unwrap();
    assert!(!store.is_answered(elsewhere.msg_id).unwrap());
    store.answered_elsewhere(elsewhere.msg_id, true).unwrap();
    store.answered_elsewhere(elsewhere.msg_id, false).unwrap();
    assert!(store.is_answered(elsewhere.msg_id).unwrap());
}

#[test]
fn released_messages_are_held_again_and_old_ones_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    for body in ["a", "b"] {
        store
            .insert_message(&message(w, lead, MsgState::Held, body))
            .unwrap();
    }
    let taken = store.take_held(lead, None, 10).unwrap();
    assert_eq!(store.held_count(lead).unwrap(), 0);
    store.release(&[taken[0].msg_id]).unwrap();
    assert_eq!(store.held_count(lead).unwrap(), 1);
    // Only settled messages go, and only old enough ones.
    assert_eq!(store.prune(0).unwrap(), 0);
    assert_eq!(store.prune(i64::MAX).unwrap(), 1);
    assert_eq!(store.take_held(lead, None, 10).unwrap()[0].body, "a");
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let err = SqliteStore::open(&path).err().unwrap();
    assert!(err.to_string().contains("schema 99 is newer"), "{err}");
}

/// The threads of this process named as a store's checkpoint thread (`fleetd-checkpoint`, which
/// Linux cuts to 15 characters). nextest runs each test in a process of its own.
fn checkpoint_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|task| {
            let comm = task.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|name| name.trim() == "fleetd-checkpoi")
        })
        .count()
}

/// Waits up to 10 s for `checkpoint_threads()` to be `count`.
fn until_checkpoint_threads(count: usize, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while checkpoint_threads() != count {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn an_open_store_checkpoints_on_a_thread_of_its_own_that_ends_with_it() {
    assert_eq!(checkpoint_threads(), 0);
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    // A new thread names itself once it runs.
    until_checkpoint_threads(1, "an open store has no checkpoint thread");
    drop(store);
    until_checkpoint_threads(0, "the checkpoint thread outlives its store");
}

/// How many messages wait for `to` as the cap check sees them (nothing is stored).
fn waiting_seen(store: &SqliteStore, to: Gid) -> usize {
    let seen = std::cell::Cell::new(usize::MAX);
    let probe = message(Gid::mint(), to, MsgState::Held, "probe");
    let refuse = |_: &Message, waiting: usize| {
        seen.set(waiting);
        Err(Full {
            count: waiting,
            cap: 0,
            key: HELD_KEY,
        })
    };
    store.insert_messages_within(&[probe], &refuse).unwrap();
    seen.get()
}

/// How many messages wait for `to`, counted in the database itself.
fn waiting_counted(path: &std::path::Path, to: Gid) -> usize {
    let conn = rusqlite::Connection::open(path).unwrap();
    let count: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM messages WHERE to_gid = ?1 AND state IN ('held', 'queued')",
            [to.to_string()],
            |row| row.get(0),
        )
        .unwrap();
    usize::try_from(count).unwrap()
}

#[test]
fn the_waiting_count_follows_every_change_and_an_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store = SqliteStore::open(&path).unwrap();
    let (lead, w) = mixed_traffic(&store);
    let both = |store: &SqliteStore| {
        for to in [lead, w] {
            assert_eq!(waiting_seen(store, to), waiting_counted(&path, to), "{to}");
        }
    };
    both(&store);
    for body in ["a", "b", "c"] {
        store
            .insert_message(&message(w, lead, MsgState::Held, body))
            .unwrap();
    }
    store
        .insert_message(&message(lead, w, MsgState::Queued, "q2"))
        .unwrap();
    both(&store);
    assert_eq!(waiting_seen(&store, lead), 4);
    // Taken for typing, pulled, given back, failed, pruned: each moves the count.
    store.dequeue(w, &MsgState::Injecting).unwrap();
    both(&store);
    let taken = store.take_held(lead, None, 2).unwrap();
    both(&store);
    store.release(&[taken[0].msg_id]).unwrap();
    both(&store);
    assert_eq!(waiting_seen(&store, lead), 3);
    store.fail_undelivered_to(w, "gone", None).unwrap();
    both(&store);
    assert_eq!(waiting_seen(&store, w), 0);
    store.prune(i64::MAX).unwrap();
    both(&store);
    drop(store);
    // A database of the first schema (no count kept) is brought up to date with its counts.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP TRIGGER waiting_inserted; DROP TRIGGER waiting_entered; DROP TRIGGER waiting_left;
         DROP TRIGGER waiting_deleted; DROP TABLE waiting; DROP TABLE seen; DROP TABLE sent;
         DROP TABLE awaited; DROP TABLE outbox;
         DROP TRIGGER coord_senders_pruned; DROP TABLE coord_senders;
         DROP TRIGGER changes_message_made; DROP TRIGGER changes_message_moved;
         DROP TRIGGER changes_message_pruned; DROP TRIGGER changes_entity_made;
         DROP TRIGGER changes_entity_moved; DROP TABLE changes;
         DROP TRIGGER answered_pruned; DROP TABLE answered;
         ALTER TABLE messages DROP COLUMN expires_ms;
         DROP TRIGGER adoptable_gone; DROP TABLE adoptable; DROP TABLE alive; DROP TABLE lead_panes;
         ALTER TABLE entities DROP COLUMN sandbox; ALTER TABLE entities DROP COLUMN profile_role;
         DROP INDEX entities_name; ALTER TABLE entities DROP COLUMN ended;
         PRAGMA user_version = 1;",
    )
    .unwrap();
    conn.execute(
        "INSERT INTO messages (msg_id, trace_id, kind, from_gid, to_gid, body, state, created_ms, updated_ms)
         VALUES (?1, ?2, 'SEND', ?3, ?4, 'old', 'held', 1, 1)",
        [
            MsgId::mint().to_string(),
            TraceId::mint().to_string(),
            w.to_string(),
            lead.to_string(),
        ],
    )
    .unwrap();
    drop(conn);
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.last_change().unwrap(), 0, "no history is made up");
    both(&store);
    assert_eq!(waiting_seen(&store, lead), 4);
    // The upgraded store records changes from now on.
    let next = message(lead, w, MsgState::Queued, "after the upgrade");
    store.insert_message(&next).unwrap();
    assert_eq!(store.history(next.msg_id).unwrap()[0].state, "queued");
}

#[test]
fn what_came_off_the_broker_and_where_messages_went_outlive_a_restart_until_their_time() {
    let dir = tempfile::tempdir().unwrap();
    let (owner, other, lead, w) = (Gid::mint(), Gid::mint(), Gid::mint(), Gid::mint());
    let (a, b) = (MsgId::mint(), MsgId::mint());
    let sent = |msg_id, host: &str, from, to, until_ms| SentRecord {
        msg_id,
        host: host.into(),
        from,
        to,
        until_ms,
    };
    {
        let store = open(&dir);
        assert_eq!(
            store
                .see(&[(a, owner, 100), (b, owner, 200), (a, owner, 300)])
                .unwrap(),
            [false, false, true],
            "a second arrival in the same batch is seen"
        );
        // The same id for another recipient (a broadcast's copy) is its own arrival.
        assert_eq!(store.see(&[(a, other, 100)]).unwrap(), [false]);
        store
            .record_sent(&[
                sent(a, "hostb", lead, Some(w), 100),
                sent(b, "hostc", lead, None, 200),
                sent(b, "*", lead, None, 200),
            ])
            .unwrap();
    }
    let store = open(&dir);
    assert_eq!(
        store.see(&[(a, owner, 100), (b, other, 100)]).unwrap(),
        [true, false]
    );
    assert_eq!(
        store
            .sent_to(&[
                (a, "hostb".into()),
                (a, "hostc".into()),
                (b, "hostc".into())
            ])
            .unwrap(),
        [Some((lead, Some(w))), None, Some((lead, None))]
    );
    assert_eq!(store.recent_broadcasts(10).unwrap(), [(b, lead)]);
    // Every record of an id, whatever its host.
    let mut records = store.sent_records(&[b, a, MsgId::mint()]).unwrap();
    records.sort_by_key(|(id, _, to)| (*id, to.is_some()));
    let mut expected = vec![(a, lead, Some(w)), (b, lead, None), (b, lead, None)];
    expected.sort_by_key(|(id, _, to)| (*id, to.is_some()));
    assert_eq!(records, expected);
    // Forgotten once their time is past, not before.
    assert_eq!(store.forget(100).unwrap(), 0);
    // a for owner and for other, b for other, and a sent to hostb.
    assert_eq!(store.forget(150).unwrap(), 4);
    assert_eq!(
        store.see(&[(a, owner, 100), (b, owner, 300)]).unwrap(),
        [false, true]
    );
    assert_eq!(store.sent_to(&[(a, "hostb".into())]).unwrap(), [None]);
    assert_eq!(store.sent_records(&[a]).unwrap(), []);
}

#[test]
fn an_awaited_receipt_outlives_a_restart_until_it_is_settled() {
    let dir = tempfile::tempdir().unwrap();
    let brief = || AwaitedReceipt {
        msg_id: MsgId::mint(),
        sender: Gid::mint(),
        recipient: Gid::mint(),
        trace_id: TraceId::mint(),
    };
    let (a, b) = (brief(), brief());
    {
        let store = open(&dir);
        store.await_receipt(&a).unwrap();
        store.await_receipt(&b).unwrap();
        store.await_receipt(&a).unwrap();
    }
    let store = open(&dir);
    let mut awaited = store.awaited_receipts().unwrap();
    awaited.sort_by_key(|r| r.msg_id);
    let mut expected = vec![a.clone(), b.clone()];
    expected.sort_by_key(|r| r.msg_id);
    assert_eq!(awaited, expected);
    store.receipts_settled(&[a.msg_id]).unwrap();
    assert_eq!(store.awaited_receipts().unwrap(), [b]);
}

#[test]
fn the_outbox_keeps_notices_across_a_restart_until_they_are_sent() {
    let dir = tempfile::tempdir().unwrap();
    let (lead, w) = (Gid::mint(), Gid::mint());
    let first = message(w, lead, MsgState::Held, "first");
    let second = message(w, lead, MsgState::Held, "second");
    {
        let store = open(&dir);
        store.put_outbox(&first, 1).unwrap();
        store.put_outbox(&second, 2).unwrap();
        store.put_outbox(&first, 3).unwrap();
    }
    let store = open(&dir);
    assert_eq!(store.outbox().unwrap(), [first.clone(), second.clone()]);
    store.outbox_sent(first.msg_id).unwrap();
    assert_eq!(store.outbox().unwrap(), [second]);
}

#[test]
fn an_answer_counts_once_there_whatever_became_of_it_and_only_from_its_sender() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, arch, other) = (Gid::mint(), Gid::mint(), Gid::mint());
    let brief = message(lead, arch, MsgState::Injected, "brief");
    store.insert_message(&brief).unwrap();
    // Its task and others' answers are no answer of its own.
    store
        .insert_message(&Message::reply_to(
            &message(lead, other, MsgState::Injected, "t"),
            "r".into(),
            2,
        ))
        .unwrap();
    assert_eq!(store.last_answer_ms(lead, arch).unwrap(), None);
    let reply = Message::reply_to(&brief, "advice".into(), 3);
    store.insert_message(&reply).unwrap();
    assert_eq!(store.last_answer_ms(lead, arch).unwrap(), Some(3));
    // Taken by the lead, it still counts.
    store.take_held(lead, Some(arch), 10).unwrap();
    assert_eq!(store.last_answer_ms(lead, arch).unwrap(), Some(3));
    // A later answer is the last.
    let again = message(lead, arch, MsgState::Injected, "follow-up");
    store
        .insert_message(&Message::reply_to(&again, "more".into(), 7))
        .unwrap();
    assert_eq!(store.last_answer_ms(lead, arch).unwrap(), Some(7));
    // A failure notice about a message to it counts as its answer too.
    let brief2 = message(lead, other, MsgState::Injected, "b2");
    let failed = Message::notice(&brief2, Kind::Failed, "gone".into(), 4);
    store.insert_message(&failed).unwrap();
    assert_eq!(store.last_answer_ms(lead, other).unwrap(), Some(4));
    assert_eq!(store.last_answer_ms(arch, lead).unwrap(), None);
}

#[test]
fn a_coordination_sender_lasts_as_long_as_its_message_or_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (from, to) = (Gid::mint(), Gid::mint());
    let held = message(from, to, MsgState::Held, "shared finding");
    store
        .note_coord_sender(held.msg_id, "alice@hosta", 100)
        .unwrap();
    // Noted once: a redelivery does not change who sent it.
    store
        .note_coord_sender(held.msg_id, "mallory@x", 100)
        .unwrap();
    assert!(store.insert_message(&held).unwrap());
    let never = MsgId::mint();
    store.note_coord_sender(never, "carol@hostc", 100).unwrap();
    assert_eq!(
        store.coord_sender(held.msg_id).unwrap().as_deref(),
        Some("alice@hosta")
    );
    assert_eq!(store.coord_sender(MsgId::mint()).unwrap(), None);
    // Past its time, only the one whose message was never held goes; reopened, it stays.
    assert_eq!(store.forget(100).unwrap(), 0);
    assert_eq!(store.forget(101).unwrap(), 1);
    assert_eq!(store.coord_sender(never).unwrap(), None);
    drop(store);
    let store = open(&dir);
    assert_eq!(
        store.coord_sender(held.msg_id).unwrap().as_deref(),
        Some("alice@hosta")
    );
    // It goes with its message.
    assert_eq!(store.take_held(to, None, 10).unwrap().len(), 1);
    assert!(store.prune(i64::MAX).unwrap() >= 1);
    assert_eq!(store.coord_sender(held.msg_id).unwrap(), None);
}

#[test]
fn messages_are_counted_by_kind_and_state_and_what_waits_by_recipient() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    for body in ["one", "two"] {
        store
            .insert_message(&message(lead, w, MsgState::Queued, body))
            .unwrap();
    }
    let task = message(lead, w, MsgState::Injected, "three");
    store.insert_message(&task).unwrap();
    store
        .insert_message(&Message::reply_to(&task, "done".into(), 1))
        .unwrap();
    let counts = store.message_counts().unwrap();
    assert_eq!(
        counts,
        vec![
            ("REPLY".to_string(), "held".to_string(), 1),
            ("SEND".to_string(), "injected".to_string(), 1),
            ("SEND".to_string(), "queued".to_string(), 2),
        ]
    );
    let mut waiting = store.waiting_by_recipient().unwrap();
    waiting.sort_by_key(|(gid, state, _)| (*gid == w, state.clone()));
    assert_eq!(
        waiting,
        vec![(lead, "held".to_string(), 1), (w, "queued".to_string(), 2)]
    );
}

#[test]
fn messages_are_listed_newest_first_by_state_recipient_sender_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w1, w2) = (Gid::mint(), Gid::mint(), Gid::mint());
    let mut old = message(lead, w1, MsgState::Injected, "old");
    old.created_ms = 1_000;
    store.insert_message(&old).unwrap();
    let mut queued = message(lead, w1, MsgState::Queued, "queued");
    queued.created_ms = 5_000;
    store.insert_message(&queued).unwrap();
    let mut other = message(lead, w2, MsgState::Failed("gone".into()), "other");
    other.created_ms = 6_000;
    store.insert_message(&other).unwrap();
    let bodies = |filter: MessageFilter| -> Vec<String> {
        store
            .messages(&filter)
            .unwrap()
            .into_iter()
            .map(|m| m.body)
            .collect()
    };
    let all = MessageFilter {
        limit: 10,
        ..MessageFilter::default()
    };
    assert_eq!(bodies(all.clone()), ["other", "queued", "old"]);
    assert_eq!(
        bodies(MessageFilter {
            limit: 2,
            ..all.clone()
        }),
        ["other", "queued"]
    );
    assert_eq!(
        bodies(MessageFilter {
            to: Some(w1),
            ..all.clone()
        }),
        ["queued", "old"]
    );
    assert_eq!(
        bodies(MessageFilter {
            state: Some("failed".into()),
            ..all.clone()
        }),
        ["other"]
    );
    assert_eq!(
        bodies(MessageFilter {
            since_ms: Some(5_000),
            from: Some(lead),
            ..all.clone()
        }),
        ["other", "queued"]
    );
    assert!(
        bodies(MessageFilter {
            from: Some(w1),
            ..all.clone()
        })
        .is_empty()
    );
    assert_eq!(
        bodies(MessageFilter {
            involving: vec![w2],
            ..all.clone()
        }),
        ["other"]
    );
    assert!(
        bodies(MessageFilter {
            involving: vec![Gid::mint()],
            ..all.clone()
        })
        .is_empty()
    );
    // Both must be a party: a lead's own messages with one worker.
    assert_eq!(
        bodies(MessageFilter {
            involving: vec![lead, w1],
            ..all.clone()
        }),
        ["queued", "old"]
    );
    assert!(
        bodies(MessageFilter {
            involving: vec![w2, w1],
            ..all.clone()
        })
        .is_empty()
    );
    // Pages: on from the last one listed, and the total of all of them.
    let newest = store
        .messages(&MessageFilter {
            limit: 1,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(
        bodies(MessageFilter {
            before: Some(newest[0].msg_id),
            ..all.clone()
        }),
        ["queued", "old"]
    );
    assert_eq!(
        bodies(MessageFilter {
            before: Some(newest[0].msg_id),
            limit: 1,
            to: Some(w1),
            ..all.clone()
        }),
        ["queued"]
    );
    let paged = MessageFilter {
        before: Some(newest[0].msg_id),
        limit: 1,
        ..all.clone()
    };
    assert_eq!(
        store.message_total(&paged).unwrap(),
        (3, 1),
        "all pages count, and the one before"
    );
    assert_eq!(
        store
            .message_total(&MessageFilter {
                state: Some("failed".into()),
                ..paged.clone()
            })
            .unwrap(),
        (1, 1)
    );
    assert_eq!(
        store
            .message_total(&MessageFilter {
                before: None,
                ..paged.clone()
            })
            .unwrap(),
        (3, 0)
    );
    assert!(
        bodies(MessageFilter {
            before: Some(MsgId::mint()),
            ..all
        })
        .is_empty(),
        "nothing is before a message not stored"
    );
    let failed = store
        .messages(&MessageFilter {
            state: Some("failed".into()),
            limit: 1,
            ..MessageFilter::default()
        })
        .unwrap();
    assert_eq!(failed[0].state.reason(), Some("gone"));
    let mut notice = message(w2, lead, MsgState::Held, "told");
    notice.kind = Kind::Failed;
    store.insert_message(&notice).unwrap();
    let failures = store
        .messages(&MessageFilter {
            kind: Some(Kind::Failed),
            limit: 10,
            ..MessageFilter::default()
        })
        .unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].body, "told");
}

#[test]
fn every_change_of_a_message_or_an_entity_is_recorded_in_order_and_goes_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let start = store.last_change().unwrap();
    let lead = Gid::mint();
    let w = worker("w1", lead);
    store.insert_entity(&w).unwrap();
    store
        .set_session(w.entity.gid, WorkerStatus::Idle, Some("%1"))
        .unwrap();
    // The same status again is no change.
    store
        .set_session(w.entity.gid, WorkerStatus::Idle, None)
        .unwrap();
    let brief = message(lead, w.entity.gid, MsgState::Queued, "task");
    store.insert_message(&brief).unwrap();
    store
        .dequeue(w.entity.gid, &MsgState::Injecting)
        .unwrap()
        .unwrap();
    store.transition(brief.msg_id, &MsgState::Injected).unwrap();
    let other = message(lead, w.entity.gid, MsgState::Queued, "late");
    store.insert_message(&other).unwrap();
    store
        .fail_undelivered_to(w.entity.gid, "its worker stopped", None)
        .unwrap();

    let changes = store.changes_since(start, 100).unwrap();
    let seen: Vec<(fleet_store::Subject, &str, Option<&str>)> = changes
        .iter()
        .map(|c| (c.subject, c.state.as_str(), c.reason.as_deref()))
        .collect();
    use fleet_store::Subject::{Entity as E, Message as M};
    assert_eq!(
        seen,
        vec![
            (E(w.entity.gid), "spawning", None),
            (E(w.entity.gid), "idle", None),
            (M(brief.msg_id), "queued", None),
            (M(brief.msg_id), "injecting", None),
            (M(brief.msg_id), "injected", None),
            (M(other.msg_id), "queued", None),
            (M(other.msg_id), "failed", Some("its worker stopped")),
        ]
    );
    assert!(changes.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(store.last_change().unwrap(), changes[6].seq);
    // Read on from a point: only what came after it, at most the limit.
    let after = store.changes_since(changes[2].seq, 2).unwrap();
    assert_eq!(
        after.iter().map(|c| c.seq).collect::<Vec<_>>(),
        vec![changes[3].seq, changes[4].seq]
    );
    let history: Vec<String> = store
        .history(brief.msg_id)
        .unwrap()
        .into_iter()
        .map(|c| c.state)
        .collect();
    assert_eq!(history, ["queued", "injecting", "injected"]);
    assert!(store.history(MsgId::mint()).unwrap().is_empty());

    // Pruned messages take their changes along; entities' go by age.
    assert_eq!(store.prune(i64::MAX).unwrap(), 2);
    assert!(store.history(brief.msg_id).unwrap().is_empty());
    assert!(store.changes_since(start, 100).unwrap().is_empty());
    // Numbers are never reused: a feed reading on from where it was misses nothing.
    let before = store.last_change().unwrap();
    assert_eq!(before, changes[6].seq, "pruning keeps the count going");
    store
        .insert_message(&message(lead, w.entity.gid, MsgState::Queued, "next"))
        .unwrap();
    let next = store.changes_since(before, 10).unwrap();
    assert_eq!(next.len(), 1);
    assert!(next[0].seq > before);
}

#[test]
fn a_restart_keeps_what_waits_for_a_session_it_takes_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, kept) = mixed_traffic(&store);
    let ended = Gid::mint();
    store
        .insert_message(&message(lead, ended, MsgState::Queued, "q2"))
        .unwrap();
    let failed = store
        .fail_leftovers("interrupted", "orphaned", &[kept])
        .unwrap();
    let bodies: Vec<&str> = failed.iter().map(|m| m.body.as_str()).collect();
    // What was being typed fails whoever it was for: it may or may not have been typed.
    assert_eq!(bodies, ["i", "q2"], "the kept worker's queued task stays");
    assert_eq!(store.waiting_count(kept).unwrap(), 1);
    assert_eq!(store.waiting_count(ended).unwrap(), 0);
}

#[test]
fn what_a_session_is_known_by_goes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let lead = store.ensure_lead("lead", "h", &[]).unwrap();
    let w = worker("w1", lead);
    let gid = w.entity.gid;
    store.insert_entity(&w).unwrap();
    assert_eq!(store.adoptable(gid).unwrap(), None);
    store.put_adoptable(gid, "{\"pid\":1}", 10).unwrap();
    store.put_adoptable(gid, "{\"pid\":2}", 20).unwrap();
    assert_eq!(
        store.adoptable(gid).unwrap(),
        Some(("{\"pid\":2}".to_string(), 20))
    );
    store
        .set_session(gid, WorkerStatus::Idle, Some("%1"))
        .unwrap();
    assert!(store.adoptable(gid).unwrap().is_some());
    store.set_session(gid, WorkerStatus::Gone, None).unwrap();
    assert_eq!(store.adoptable(gid).unwrap(), None);
}

#[test]
fn the_pane_a_lead_named_last_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let lead = store.ensure_lead("lead", "h", &[]).unwrap();
    assert_eq!(store.lead_pane(lead).unwrap(), None);
    store
        .put_lead_pane(lead, "%3", "/tmp/t/default", 40)
        .unwrap();
    store.put_lead_pane(lead, "%7", "/tmp/t/other", 41).unwrap();
    drop(store);
    let store = open(&dir);
    assert_eq!(
        store.lead_pane(lead).unwrap(),
        Some(("%7".to_string(), "/tmp/t/other".to_string(), 41))
    );
    store.forget_lead_pane(lead).unwrap();
    assert_eq!(store.lead_pane(lead).unwrap(), None);
}

#[test]
fn tasks_taken_counts_what_was_typed_in_or_handed_over_since() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    for (state, body) in [
        (MsgState::Injected, "a"),
        (MsgState::Consumed, "b"),
        (MsgState::Queued, "c"),
        (MsgState::Held, "d"),
    ] {
        store
            .insert_message(&message(lead, w, state, body))
            .unwrap();
    }
    store
        .insert_message(&message(w, lead, MsgState::Held, "reply"))
        .unwrap();
    assert_eq!(store.tasks_taken(w, 0).unwrap(), 2);
    assert_eq!(store.tasks_taken(w, now_ms() + 60_000).unwrap(), 0);
    assert_eq!(store.tasks_taken(lead, 0).unwrap(), 0);
}

#[test]
fn a_write_probe_changes_nothing_and_fails_while_another_holds_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    assert_eq!(store.last_alive_ms().unwrap(), None);
    let (lead, w) = mixed_traffic(&store);
    let before = (
        store.held_count(lead).unwrap(),
        store.waiting_count(w).unwrap(),
    );
    let last = store.last_change().unwrap();
    store.probe_write().unwrap();
    let after = (
        store.held_count(lead).unwrap(),
        store.waiting_count(w).unwrap(),
    );
    assert_eq!(before, after);
    assert_eq!(store.last_change().unwrap(), last, "the probe is no change");
    // It notes when the gateway was last alive.
    let alive = store.last_alive_ms().unwrap().unwrap_or_default();
    assert!((now_ms() - alive).abs() < 60_000, "{alive}");
    // Another process holding the database's write lock: the probe cannot write, and says so.
    let other = rusqlite::Connection::open(dir.path().join("fleet.db")).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let refused = store.probe_write().unwrap_err();
    assert!(refused.to_string().contains("locked"), "{refused}");
    other.execute_batch("COMMIT").unwrap();
    store.probe_write().unwrap();
}

#[test]
fn a_task_is_failed_as_untyped_only_while_its_enter_has_not_gone_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let state = |id| store.message(id).unwrap().unwrap().state;
    // Not a key gone in yet, then only pasted: failed, and its typing's next note refused.
    for pasted in [false, true] {
        let task = message(lead, w, MsgState::Injecting, "a task");
        store.insert_message(&task).unwrap();
        if pasted {
            assert!(store.keys_sent(task.msg_id).unwrap());
        }
        assert!(store.fail_untyped(task.msg_id, "its turn ended").unwrap());
        assert_eq!(
            state(task.msg_id),
            MsgState::Failed("its turn ended".into())
        );
        assert!(
            !store.enter_sent(task.msg_id).unwrap(),
            "the Enter is withheld"
        );
        assert!(!store.fail_untyped(task.msg_id, "again").unwrap());
        assert_eq!(
            state(task.msg_id),
            MsgState::Failed("its turn ended".into())
        );
    }
    // Its Enter gone in: left for its typing to record; typed, queued or held: left as well.
    let entered = message(lead, w, MsgState::Injecting, "entered");
    store.insert_message(&entered).unwrap();
    assert!(store.enter_sent(entered.msg_id).unwrap());
    assert!(
        !store
            .fail_untyped(entered.msg_id, "its turn ended")
            .unwrap()
    );
    assert_eq!(state(entered.msg_id), MsgState::Injecting);
    for other in [MsgState::Injected, MsgState::Queued, MsgState::Held] {
        let task = message(lead, w, other.clone(), "another");
        store.insert_message(&task).unwrap();
        assert!(!store.fail_untyped(task.msg_id, "its turn ended").unwrap());
        assert_eq!(state(task.msg_id), other);
    }
}

#[test]
fn a_task_found_never_typed_goes_back_to_the_head_of_its_queue() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let typing = message(lead, w, MsgState::Injecting, "first");
    store.insert_message(&typing).unwrap();
    store
        .insert_message(&message(lead, w, MsgState::Queued, "second"))
        .unwrap();
    assert_eq!(store.waiting_count(w).unwrap(), 1);
    assert!(store.put_back_untyped(typing.msg_id).unwrap());
    // Only from `injecting`: a task typed, answered or failed since stays so.
    assert!(!store.put_back_untyped(typing.msg_id).unwrap());
    assert_eq!(store.waiting_count(w).unwrap(), 2);
    let next = store.dequeue(w, &MsgState::Injecting).unwrap().unwrap();
    assert_eq!(next.body, "first", "it keeps its place");
    assert!(store.transition(next.msg_id, &MsgState::Injected).is_ok());
    assert!(!store.put_back_untyped(next.msg_id).unwrap());
    let trail: Vec<String> = store
        .changes_since(0, 100)
        .unwrap()
        .into_iter()
        .filter(|c| c.subject == fleet_store::Subject::Message(typing.msg_id))
        .map(|c| c.state)
        .collect();
    assert_eq!(trail, ["injecting", "queued", "injecting", "injected"]);
}

#[test]
fn keys_sent_are_noted_on_a_task_being_typed_and_go_with_its_next_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let typing = message(lead, w, MsgState::Injecting, "typing");
    let queued = message(lead, w, MsgState::Queued, "queued");
    for m in [&typing, &queued] {
        store.insert_message(m).unwrap();
    }
    assert_eq!(store.keys_sent_to(w).unwrap(), []);
    assert!(store.keys_sent(typing.msg_id).unwrap());
    // Only on a task being typed.
    assert!(!store.keys_sent(queued.msg_id).unwrap());
    assert_eq!(store.keys_sent_to(w).unwrap(), [(typing.msg_id, false)]);
    assert_eq!(store.keys_sent_to(lead).unwrap(), []);
    assert!(store.enter_sent(typing.msg_id).unwrap());
    assert!(!store.enter_sent(queued.msg_id).unwrap());
    assert_eq!(store.keys_sent_to(w).unwrap(), [(typing.msg_id, true)]);
    let kept = store.message(typing.msg_id).unwrap().unwrap();
    assert_eq!(kept.state, MsgState::Injecting, "still typing");
    store
        .transition(typing.msg_id, &MsgState::Injected)
        .unwrap();
    assert_eq!(store.keys_sent_to(w).unwrap(), []);
    let typed = store.message(typing.msg_id).unwrap().unwrap();
    assert_eq!(typed.state, MsgState::Injected);
}

#[test]
fn what_a_build_before_schema_10_left_injecting_is_taken_as_having_had_its_enter_sent() {
    // A build before schema 10 noted nothing: its `injecting` tasks may have been typed.
    let dir = tempfile::tempdir().unwrap();
    let (lead, w) = (Gid::mint(), Gid::mint());
    let typing = message(lead, w, MsgState::Injecting, "typing");
    {
        let store = open(&dir);
        store.insert_message(&typing).unwrap();
        assert_eq!(store.keys_sent_to(w).unwrap(), []);
    }
    let conn = rusqlite::Connection::open(dir.path().join("fleet.db")).unwrap();
    change_log_of_schema_12(&conn).unwrap();
    conn.execute_batch(
        "ALTER TABLE entities DROP COLUMN sandbox; ALTER TABLE entities DROP COLUMN profile_role;
         DROP INDEX entities_name; ALTER TABLE entities DROP COLUMN ended;
         PRAGMA user_version = 9;",
    )
    .unwrap();
    drop(conn);
    let store = open(&dir);
    assert_eq!(store.keys_sent_to(w).unwrap(), [(typing.msg_id, true)]);
}

#[test]
fn what_a_worker_was_spawned_as_is_kept_and_a_build_before_schema_11_recorded_none() {
    let dir = tempfile::tempdir().unwrap();
    let lead = Gid::mint();
    let mut boxed = worker("boxed", lead);
    boxed.entity.sandbox = Some("bwrap".into());
    boxed.entity.profile_role = Some("backend".into());
    let plain = worker("plain", lead);
    {
        let store = open(&dir);
        store.insert_entity(&boxed).unwrap();
        store.insert_entity(&plain).unwrap();
        assert_eq!(store.entity(boxed.entity.gid).unwrap(), Some(boxed.clone()));
        assert_eq!(store.entity(plain.entity.gid).unwrap(), Some(plain.clone()));
    }
    // Reopened, as a restart finds them.
    let live = open(&dir).live_entities().unwrap();
    assert_eq!(live, [boxed.clone(), plain.clone()]);
    // A database of schema 10 (no such columns) with a worker in it: brought up to date, it
    // says nothing of what the worker runs in.
    let path = dir.path().join("fleet.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    change_log_of_schema_12(&conn).unwrap();
    conn.execute_batch(
        "ALTER TABLE entities DROP COLUMN sandbox; ALTER TABLE entities DROP COLUMN profile_role;
         DROP INDEX entities_name; ALTER TABLE entities DROP COLUMN ended;
         PRAGMA user_version = 10;",
    )
    .unwrap();
    drop(conn);
    let store = open(&dir);
    let upgraded = store.entity(boxed.entity.gid).unwrap().unwrap();
    assert_eq!(
        (upgraded.entity.sandbox, upgraded.entity.profile_role),
        (None, None)
    );
    assert_eq!(upgraded.entity.name, "boxed");
    // What is spawned after the upgrade is recorded in full, and what it runs as after a
    // fresh start too.
    let mut later = worker("later", lead);
    later.entity.sandbox = Some("podman".into());
    store.insert_entity(&later).unwrap();
    assert_eq!(store.entity(later.entity.gid).unwrap(), Some(later.clone()));
    later.entity.sandbox = None;
    later.entity.profile_role = Some("frontend".into());
    store.set_spawned_as(&later.entity).unwrap();
    assert_eq!(store.entity(later.entity.gid).unwrap(), Some(later));
}

#[test]
fn why_a_worker_ended_is_kept_and_a_build_before_schema_12_recorded_none() {
    let dir = tempfile::tempdir().unwrap();
    let lead = Gid::mint();
    let (stopped, live, old) = (worker("w1", lead), worker("w2", lead), worker("w3", lead));
    {
        let store = open(&dir);
        for record in [&stopped, &live, &old] {
            store.insert_entity(record).unwrap();
        }
        // Live, or never seen: nothing ended.
        assert_eq!(store.ended_named("w2").unwrap(), None);
        assert_eq!(store.ended_named("nobody").unwrap(), None);
        let before = now_ms();
        store
            .set_session(stopped.entity.gid, WorkerStatus::Gone, None)
            .unwrap();
        store
            .note_ended(stopped.entity.gid, "stopped by lead")
            .unwrap();
        let ended = store.ended_named("w1").unwrap().unwrap();
        assert_eq!(ended.why.as_deref(), Some("stopped by lead"));
        assert!(
            ended.at_ms >= before && ended.at_ms <= now_ms(),
            "{ended:?}"
        );
        store
            .set_session(old.entity.gid, WorkerStatus::Gone, None)
            .unwrap();
    }
    // A new worker of the same name is live: the name is not an ended one any more.
    let store = open(&dir);
    let again = worker("w1", lead);
    store.insert_entity(&again).unwrap();
    assert_eq!(store.ended_named("w1").unwrap(), None);
    drop(store);
    // A database of schema 11 (no cause kept): an ended worker reads as ended, cause unknown.
    let conn = rusqlite::Connection::open(dir.path().join("fleet.db")).unwrap();
    change_log_of_schema_12(&conn).unwrap();
    conn.execute_batch("DROP INDEX entities_name; ALTER TABLE entities DROP COLUMN ended; PRAGMA user_version = 11;")
        .unwrap();
    drop(conn);
    let store = open(&dir);
    assert_eq!(store.ended_named("w3").unwrap().unwrap().why, None);
    assert_eq!(store.ended_named("w2").unwrap(), None);
}

#[test]
fn a_task_typed_and_then_answered_only_by_a_failure_reads_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (lead, w) = (Gid::mint(), Gid::mint());
    let answer = |task: &Message, kind: Kind, body: &str| {
        let mut m = message(w, lead, MsgState::Held, body);
        m.kind = kind;
        m.in_reply_to = Some(task.msg_id);
        store.insert_message(&m).unwrap();
    };
    let crashed = message(lead, w, MsgState::Injected, "crashed");
    let replied = message(lead, w, MsgState::Injected, "replied");
    let late = message(lead, w, MsgState::Injected, "failed, then replied late");
    let working = message(lead, w, MsgState::Injected, "still working");
    let untyped = message(lead, w, MsgState::Failed("not submitted".into()), "untyped");
    let afar_failed = message(lead, w, MsgState::Injected, "failed on the sender's host");
    let afar_replied = message(lead, w, MsgState::Injected, "replied on the sender's host");
    let all = [
        &crashed,
        &replied,
        &late,
        &working,
        &untyped,
        &afar_failed,
        &afar_replied,
    ];
    for m in all {
        store.insert_message(m).unwrap();
    }
    answer(&crashed, Kind::Failed, "'w' ended before replying");
    answer(&replied, Kind::Reply, "done");
    answer(&late, Kind::Failed, "'w' stalled");
    answer(&late, Kind::Reply, "done after all");
    store.answered_elsewhere(afar_failed.msg_id, false).unwrap();
    store
        .answered_elsewhere(afar_replied.msg_id, false)
        .unwrap();
    store.answered_elsewhere(afar_replied.msg_id, true).unwrap();
    let failed: Vec<String> = store
        .messages(&MessageFilter {
            state: Some("failed".into()),
            kind: Some(Kind::Send),
            limit: 20,
            ..MessageFilter::default()
        })
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(
        failed,
        ["failed on the sender's host", "untyped", "crashed"]
    );
    let ids: Vec<MsgId> = all.iter().map(|m| m.msg_id).collect();
    assert_eq!(
        store.answers(&ids).unwrap(),
        [
            (
                crashed.msg_id,
                Answer::Failed(Some("'w' ended before replying".into()))
            ),
            (replied.msg_id, Answer::Replied),
            (late.msg_id, Answer::Replied),
            (afar_failed.msg_id, Answer::Failed(None)),
            (afar_replied.msg_id, Answer::Replied),
        ]
    );
}
