//! The database schema and its version. A newer schema on disk is refused rather than guessed at.

use rusqlite::Connection;

use crate::{StoreError, StoreResult};

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;

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
    if found == 0 {
        tx.execute_batch(SCHEMA_V1)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(())
}
