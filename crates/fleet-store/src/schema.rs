//! The database schema and its version. A newer schema on disk is refused rather than guessed at.

use rusqlite::Connection;

use crate::{StoreError, StoreResult};

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 13;

const SCHEMA_V1: &str = "
CREATE TABLE entities (
    gid         TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    host        TEXT NOT NULL,
    profile     TEXT,
    groups_json TEXT NOT NULL,
    parent      TEXT,
    pane        TEXT,
    status      TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);
CREATE UNIQUE INDEX entities_live_name ON entities(name) WHERE status != 'gone';
CREATE UNIQUE INDEX entities_lead_name ON entities(name) WHERE role = 'lead';

CREATE TABLE tokens (
    hash       BLOB PRIMARY KEY,
    gid        TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE INDEX tokens_gid ON tokens(gid);

CREATE TABLE messages (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id      TEXT NOT NULL UNIQUE,
    trace_id    TEXT NOT NULL,
    kind        TEXT NOT NULL,
    from_gid    TEXT NOT NULL,
    to_gid      TEXT NOT NULL,
    in_reply_to TEXT,
    body        TEXT NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);
CREATE INDEX messages_inbox ON messages(to_gid, state, seq);
CREATE INDEX messages_answers ON messages(in_reply_to) WHERE in_reply_to IS NOT NULL;
";

/// Version 2: how many messages wait (held or queued) for each recipient, kept by triggers in
/// the transaction that changes them, so the cap on waiting messages is checked with one lookup
/// instead of a count that grows with the backlog (which made holding n messages cost O(n²)).
const SCHEMA_V2: &str = "
CREATE TABLE waiting (
    to_gid TEXT PRIMARY KEY,
    count  INTEGER NOT NULL
);
INSERT INTO waiting (to_gid, count)
    SELECT to_gid, COUNT(*) FROM messages WHERE state IN ('held', 'queued') GROUP BY to_gid;
CREATE TRIGGER waiting_inserted AFTER INSERT ON messages
    WHEN NEW.state IN ('held', 'queued')
BEGIN
    INSERT INTO waiting (to_gid, count) VALUES (NEW.to_gid, 1)
        ON CONFLICT (to_gid) DO UPDATE SET count = count + 1;
END;
CREATE TRIGGER waiting_entered AFTER UPDATE OF state ON messages
    WHEN OLD.state NOT IN ('held', 'queued') AND NEW.state IN ('held', 'queued')
BEGIN
    INSERT INTO waiting (to_gid, count) VALUES (NEW.to_gid, 1)
        ON CONFLICT (to_gid) DO UPDATE SET count = count + 1;
END;
CREATE TRIGGER waiting_left AFTER UPDATE OF state ON messages
    WHEN OLD.state IN ('held', 'queued') AND NEW.state NOT IN ('held', 'queued')
BEGIN
    UPDATE waiting SET count = count - 1 WHERE to_gid = OLD.to_gid;
END;
CREATE TRIGGER waiting_deleted AFTER DELETE ON messages
    WHEN OLD.state IN ('held', 'queued')
BEGIN
    UPDATE waiting SET count = count - 1 WHERE to_gid = OLD.to_gid;
END;
";

/// Version 3: what signed federation remembers across a restart. `seen`: the ids of messages
/// that came off the broker, per recipient, until they could no longer pass the freshness check
/// (a replay within that time is refused). `sent`: which host each message this gateway
/// published to a remote entity went to, from whom and to whom, for as long as an answer may
/// come (an answer from any other host, or between others, is refused); a broadcast is kept
/// under the host `*` as well, for its copies' answers. `awaited`: the briefs published to
/// remote workers whose `INJECTED` receipt has not come, so a restart keeps failing them at
/// the bound. `outbox`: notices for senders on other hosts made while the broker could not be
/// reached, published once it can.
const SCHEMA_V3: &str = "
CREATE TABLE seen (
    msg_id     TEXT NOT NULL,
    owner      TEXT NOT NULL,
    until_ms   INTEGER NOT NULL,
    PRIMARY KEY (msg_id, owner)
) WITHOUT ROWID;
CREATE INDEX seen_until ON seen(until_ms);
CREATE TABLE sent (
    msg_id     TEXT NOT NULL,
    host       TEXT NOT NULL,
    from_gid   TEXT NOT NULL,
    to_gid     TEXT,
    until_ms   INTEGER NOT NULL,
    PRIMARY KEY (msg_id, host)
) WITHOUT ROWID;
CREATE INDEX sent_until ON sent(until_ms);
CREATE INDEX sent_host ON sent(host, until_ms);
CREATE TABLE outbox (
    msg_id     TEXT PRIMARY KEY,
    message    TEXT NOT NULL,
    since_ms   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE awaited (
    msg_id     TEXT PRIMARY KEY,
    sender     TEXT NOT NULL,
    recipient  TEXT NOT NULL,
    trace_id   TEXT NOT NULL
) WITHOUT ROWID;
";

/// Version 4: the coordination id each coordination message held here came from (lead-to-lead
/// coordination: its sender is a lead of another fleet, known by that id only). A row goes with
/// its message, or, for a message never held (refused at its cap), after `until_ms`.
const SCHEMA_V4: &str = "
CREATE TABLE coord_senders (
    msg_id     TEXT PRIMARY KEY,
    coord_id   TEXT NOT NULL,
    until_ms   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TRIGGER coord_senders_pruned AFTER DELETE ON messages
BEGIN
    DELETE FROM coord_senders WHERE msg_id = OLD.msg_id;
END;
";

/// Version 5: every change of a message's state and of an entity's status, in the order they
/// happened, written by triggers in the transaction that makes the change (so no code path can
/// change one without its record): one message's history, and the live feed of the operator
/// surfaces (`fleetd tail`, the web view), which read on from the last `seq` they saw. Rows
/// go with their message, and by age with [`crate::Store::prune`]. Messages from before this
/// version have no history (none is made up for them).
const SCHEMA_V5: &str = "
CREATE TABLE changes (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms      INTEGER NOT NULL,
    subject    TEXT NOT NULL CHECK (subject IN ('message', 'entity')),
    id         TEXT NOT NULL,
    state      TEXT NOT NULL,
    reason     TEXT
);
CREATE INDEX changes_id ON changes(id, seq);
CREATE INDEX changes_at ON changes(at_ms) WHERE subject = 'entity';
CREATE TRIGGER changes_message_made AFTER INSERT ON messages
BEGIN
    INSERT INTO changes (at_ms, subject, id, state, reason)
        VALUES (NEW.updated_ms, 'message', NEW.msg_id, NEW.state, NEW.reason);
END;
CREATE TRIGGER changes_message_moved AFTER UPDATE OF state ON messages
    WHEN OLD.state != NEW.state
BEGIN
    INSERT INTO changes (at_ms, subject, id, state, reason)
        VALUES (NEW.updated_ms, 'message', NEW.msg_id, NEW.state, NEW.reason);
END;
CREATE TRIGGER changes_message_pruned AFTER DELETE ON messages
BEGIN
    DELETE FROM changes WHERE subject = 'message' AND id = OLD.msg_id;
END;
CREATE TRIGGER changes_entity_made AFTER INSERT ON entities
BEGIN
    INSERT INTO changes (at_ms, subject, id, state, reason)
        VALUES (NEW.updated_ms, 'entity', NEW.gid, NEW.status, NULL);
END;
CREATE TRIGGER changes_entity_moved AFTER UPDATE OF status ON entities
    WHEN OLD.status != NEW.status
BEGIN
    INSERT INTO changes (at_ms, subject, id, state, reason)
        VALUES (NEW.updated_ms, 'entity', NEW.gid, NEW.status, NULL);
END;
";

/// Version 6: the tasks answered by a message that went to another host (a worker's reply, or a
/// failure notice, to a lead there: the broker carries it, and no copy of it is stored here), so
/// that a restart which reaps the worker does not report them unanswered. A row goes with its
/// task.
const SCHEMA_V6: &str = "
CREATE TABLE answered (
    msg_id     TEXT PRIMARY KEY
) WITHOUT ROWID;
CREATE TRIGGER answered_pruned AFTER DELETE ON messages
BEGIN
    DELETE FROM answered WHERE msg_id = OLD.msg_id;
END;
";

/// Version 7: whether a task answered on another host was answered by a reply (a task has one
/// reply: a second is refused) or by a failure notice (after which its worker's reply still
/// goes). Rows from before are taken as replies.
const SCHEMA_V7: &str = "
ALTER TABLE answered ADD COLUMN by_reply INTEGER NOT NULL DEFAULT 1;
";

/// Version 8: a queued message's expiry (a brief from another host keeps its envelope's while
/// it waits in its worker's queue), checked where it is taken off the queue.
const SCHEMA_V8: &str = "
ALTER TABLE messages ADD COLUMN expires_ms INTEGER;
";

/// Version 9: what a restart needs to take back the workers a previous run left running.
/// `adoptable`: for each live worker or architect, what fleetd knows it by (the program it
/// started in its pane, its working directory, owner and shares: a JSON document fleetd
/// writes and reads); a row goes when its entity does. `alive`: when this gateway was last
/// seen alive (the store probe writes it), so a start knows how long the fleet ran without it.
/// `lead_panes`: the pane each lead last named, with its tmux server's socket and pid, so a
/// restarted gateway can nudge a lead about what waits for it before the lead calls again.
const SCHEMA_V9: &str = "
CREATE TABLE adoptable (
    gid        TEXT PRIMARY KEY,
    facts      TEXT NOT NULL,
    since_ms   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TRIGGER adoptable_gone AFTER UPDATE OF status ON entities
    WHEN NEW.status = 'gone'
BEGIN
    DELETE FROM adoptable WHERE gid = NEW.gid;
END;
CREATE TABLE alive (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    at_ms      INTEGER NOT NULL
);
CREATE TABLE lead_panes (
    gid        TEXT PRIMARY KEY,
    pane       TEXT NOT NULL,
    socket     TEXT NOT NULL,
    server_pid INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Version 10: fleetd notes in an `injecting` message's `reason` that its keys, then its Enter,
/// went to the pane (`Store::keys_sent`, `Store::enter_sent`), and a restart puts back on its
/// queue one without the first note. A build before wrote no note: whatever it left
/// `injecting` may have been submitted, so it is marked as if its Enter went, for the restart
/// to settle from the pane rather than type again.
const SCHEMA_V10: &str = "
UPDATE messages SET reason = 'enter sent' WHERE state = 'injecting';
";

/// Version 11: what a worker or architect was spawned as besides its profile's name, as
/// `fleet_list` shows it: the sandbox runtime its profile ran it in (`bwrap`, `podman`; NULL
/// when unsandboxed) and the role its profile declares (`backend`). Kept as they were at its
/// spawn, so a profile changed since does not change what a running worker is said to run in.
/// Rows from before read NULL for both: a sandbox is never claimed that was not recorded.
const SCHEMA_V11: &str = "
ALTER TABLE entities ADD COLUMN sandbox TEXT;
ALTER TABLE entities ADD COLUMN profile_role TEXT;
";

/// Version 12: why an entity ended, kept on its row once it is gone (its `updated_ms` says
/// when), so that a send to a stopped or ended worker is told when and why. Rows from before
/// read NULL: an end whose cause was not recorded. The index finds the newest entity of a name,
/// gone ones included (the unique indexes on names hold live entities or leads only).
const SCHEMA_V12: &str = "
ALTER TABLE entities ADD COLUMN ended TEXT;
CREATE INDEX entities_name ON entities(name);
";

/// Version 13: the change log keys a message's changes by the message's row (`messages.seq`,
/// an integer that only grows) instead of its 36-character text id, so each row and each index
/// entry is that much smaller. An entity's changes keep its gid (its rowid is not its key, and
/// a `VACUUM` may renumber it). The numbers given so far carry over, so a feed reading on from
/// the last it saw misses nothing. A change whose message is gone (which the trigger that
/// deletes them with their message should never leave) is not carried. The triggers are
/// dropped only if there: a test that takes a store back to schema 12's log drops them.
const SCHEMA_V13: &str = "
DROP TRIGGER IF EXISTS changes_message_made;
DROP TRIGGER IF EXISTS changes_message_moved;
DROP TRIGGER IF EXISTS changes_message_pruned;
DROP TRIGGER IF EXISTS changes_entity_made;
DROP TRIGGER IF EXISTS changes_entity_moved;
CREATE TABLE changes_v13 (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms      INTEGER NOT NULL,
    message    INTEGER,
    entity     TEXT,
    state      TEXT NOT NULL,
    reason     TEXT,
    CHECK ((message IS NULL) != (entity IS NULL))
);
INSERT INTO changes_v13 (seq, at_ms, message, entity, state, reason)
    SELECT c.seq, c.at_ms, m.seq, NULL, c.state, c.reason
        FROM changes c JOIN messages m ON m.msg_id = c.id WHERE c.subject = 'message'
    UNION ALL
    SELECT seq, at_ms, NULL, id, state, reason FROM changes WHERE subject = 'entity';
DELETE FROM sqlite_sequence WHERE name = 'changes_v13';
INSERT INTO sqlite_sequence (name, seq) SELECT 'changes_v13', seq FROM sqlite_sequence
    WHERE name = 'changes';
DROP TABLE changes;
ALTER TABLE changes_v13 RENAME TO changes;
CREATE INDEX changes_message ON changes(message) WHERE message IS NOT NULL;
CREATE INDEX changes_at ON changes(at_ms) WHERE entity IS NOT NULL;
CREATE TRIGGER changes_message_made AFTER INSERT ON messages
BEGIN
    INSERT INTO changes (at_ms, message, state, reason)
        VALUES (NEW.updated_ms, NEW.seq, NEW.state, NEW.reason);
END;
CREATE TRIGGER changes_message_moved AFTER UPDATE OF state ON messages
    WHEN OLD.state != NEW.state
BEGIN
    INSERT INTO changes (at_ms, message, state, reason)
        VALUES (NEW.updated_ms, NEW.seq, NEW.state, NEW.reason);
END;
CREATE TRIGGER changes_message_pruned AFTER DELETE ON messages
BEGIN
    DELETE FROM changes WHERE message = OLD.seq;
END;
CREATE TRIGGER changes_entity_made AFTER INSERT ON entities
BEGIN
    INSERT INTO changes (at_ms, entity, state, reason)
        VALUES (NEW.updated_ms, NEW.gid, NEW.status, NULL);
END;
CREATE TRIGGER changes_entity_moved AFTER UPDATE OF status ON entities
    WHEN OLD.status != NEW.status
BEGIN
    INSERT INTO changes (at_ms, entity, state, reason)
        VALUES (NEW.updated_ms, NEW.gid, NEW.status, NULL);
END;
";

/// Brings a fresh database to the current schema and refuses one from a newer build.
/// Runs under an immediate transaction, so two processes opening a new state dir at once
/// (`fleetd serve` and `fleetd token`) do not both create it.
pub fn migrate(conn: &mut Connection) -> StoreResult<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let found: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found,
            known: SCHEMA_VERSION,
        });
    }
    if found < 1 {
        tx.execute_batch(SCHEMA_V1)?;
    }
    if found < 2 {
        tx.execute_batch(SCHEMA_V2)?;
    }
    if found < 3 {
        tx.execute_batch(SCHEMA_V3)?;
    }
    if found < 4 {
        tx.execute_batch(SCHEMA_V4)?;
    }
    if found < 5 {
        tx.execute_batch(SCHEMA_V5)?;
    }
    if found < 6 {
        tx.execute_batch(SCHEMA_V6)?;
    }
    if found < 7 {
        tx.execute_batch(SCHEMA_V7)?;
    }
    if found < 8 {
        tx.execute_batch(SCHEMA_V8)?;
    }
    if found < 9 {
        tx.execute_batch(SCHEMA_V9)?;
    }
    if found < 10 {
        tx.execute_batch(SCHEMA_V10)?;
    }
    if found < 11 {
        tx.execute_batch(SCHEMA_V11)?;
    }
    if found < 12 {
        tx.execute_batch(SCHEMA_V12)?;
    }
    if found < 13 {
        tx.execute_batch(SCHEMA_V13)?;
    }
    if found < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SqliteStore, Store, Subject};

    type Row = (i64, i64, String, String, String, Option<String>);

    /// A database of schema 12 with a message's changes, a pruned message's, and an entity's.
    fn schema_12_with_changes(conn: &Connection) -> (String, String) {
        for batch in [
            SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7, SCHEMA_V8,
            SCHEMA_V9, SCHEMA_V10, SCHEMA_V11, SCHEMA_V12,
        ] {
            conn.execute_batch(batch).unwrap();
        }
        conn.pragma_update(None, "user_version", 12).unwrap();
        let (kept, pruned, entity) = (
            fleet_core::MsgId::mint().to_string(),
            fleet_core::MsgId::mint().to_string(),
            fleet_core::Gid::mint().to_string(),
        );
        let insert = "INSERT INTO messages (msg_id, trace_id, kind, from_gid, to_gid, body, state,
             created_ms, updated_ms) VALUES (?1, 't', 'SEND', 'a', 'b', 'x', 'queued', 1, 1)";
        conn.execute(insert, [&kept]).unwrap();
        conn.execute(
            "INSERT INTO entities (gid, name, role, host, groups_json, status, created_ms,
             updated_ms) VALUES (?1, 'w', 'worker', 'h', '[]', 'idle', 2, 2)",
            [&entity],
        )
        .unwrap();
        conn.execute(
            "UPDATE messages SET state = 'failed', reason = 'why', updated_ms = 3 WHERE msg_id = ?1",
            [&kept],
        )
        .unwrap();
        conn.execute("UPDATE entities SET status = 'busy', updated_ms = 4", [])
            .unwrap();
        // A change whose message is gone (none should be: they go with it) is not carried.
        conn.execute(
            "INSERT INTO changes (at_ms, subject, id, state) VALUES (5, 'message', ?1, 'held')",
            [fleet_core::MsgId::mint().to_string()],
        )
        .unwrap();
        // The last number given went to a message pruned since: its rows are gone, its number
        // is not to be given again.
        conn.execute(insert, [&pruned]).unwrap();
        conn.execute("DELETE FROM messages WHERE msg_id = ?1", [&pruned])
            .unwrap();
        (kept, entity)
    }

    #[test]
    fn the_change_log_keeps_its_rows_and_its_numbers_across_schema_13() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.db");
        let conn = Connection::open(&path).unwrap();
        let (kept, entity) = schema_12_with_changes(&conn);
        let before: Vec<Row> = conn
            .prepare("SELECT seq, at_ms, subject, id, state, reason FROM changes ORDER BY seq")
            .unwrap()
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let last: i64 = conn
            .query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = 'changes'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(before.len(), 5);
        assert_eq!(before[4].2, "message", "the change of a message gone");
        assert!(
            last > before[4].0,
            "the pruned message's number is past every row"
        );
        drop(conn);

        let store = SqliteStore::open(&path).unwrap();
        let after: Vec<Row> = store
            .changes_since(0, 100)
            .unwrap()
            .into_iter()
            .map(|c| {
                let (subject, id) = match c.subject {
                    Subject::Message(id) => ("message", id.to_string()),
                    Subject::Entity(gid) => ("entity", gid.to_string()),
                };
                (c.seq, c.at_ms, subject.into(), id, c.state, c.reason)
            })
            .collect();
        assert_eq!(after, before[..4]);
        assert_eq!(store.last_change().unwrap(), last);
        let history: Vec<String> = store
            .history(kept.parse().unwrap())
            .unwrap()
            .into_iter()
            .map(|c| c.state)
            .collect();
        assert_eq!(history, ["queued", "failed"]);

        // New changes are numbered on from the last; an entity's go by age, a message's with it.
        store
            .set_session(
                entity.parse().unwrap(),
                fleet_core::WorkerStatus::Idle,
                None,
            )
            .unwrap();
        let next = store.changes_since(last, 10).unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].seq, last + 1);
        store.prune(3).unwrap();
        let left: Vec<i64> = store
            .changes_since(0, 100)
            .unwrap()
            .iter()
            .map(|c| c.seq)
            .collect();
        assert_eq!(left, [before[0].0, before[2].0, before[3].0, last + 1]);
        // A change left by a message that is gone is passed over, not taken for an error that
        // would hold a feed where it is.
        Connection::open(&path)
            .unwrap()
            .execute(
                "INSERT INTO changes (at_ms, message, state) VALUES (6, 999999, 'held')",
                [],
            )
            .unwrap();
        store.prune(i64::MAX).unwrap();
        assert!(store.changes_since(0, 100).unwrap().is_empty());
    }
}
