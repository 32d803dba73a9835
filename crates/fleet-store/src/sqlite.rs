//! [`Store`] on one SQLite file in WAL mode.
//!
//! WAL with `synchronous=NORMAL` survives a crash of fleetd itself (kill -9): a committed
//! transaction is in the OS's hands before the call returns. It does not fsync every commit, so
//! a power cut may lose the last moments; that is the price of thousands of messages a second.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleet_core::bounds::Full;
use fleet_core::clock::now_ms;
use fleet_core::{Entity, Gid, Kind, Message, MsgId, MsgState, Role, WorkerStatus};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Transaction, params};

use crate::schema::migrate;
use crate::tokens::{self, TokenCache};
use crate::{
    Answer, AwaitedReceipt, Change, Ended, EntityRecord, Inserted, MessageFilter, SentBetween,
    SentRecord, Store, StoreError, StoreResult, Subject,
};

/// Compiled statements kept per connection: more than the store has.
const STATEMENT_CACHE: usize = 128;

/// How long a writer waits for another process (say `fleetd token`) to finish its write.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const MESSAGE_COLUMNS: &str = "msg_id, trace_id, kind, from_gid, to_gid, in_reply_to, body, state, reason, created_ms, expires_ms";
const ENTITY_COLUMNS: &str = "gid, name, role, host, profile, groups_json, parent, pane, status, created_ms, sandbox, profile_role";
/// The changes, each with the text id of what changed (a message's found by its row; a change
/// whose message is gone, which its trigger should never leave, has none and is passed over).
const CHANGES: &str = "SELECT c.seq, c.at_ms, m.msg_id, c.entity, c.state, c.reason
     FROM changes c LEFT JOIN messages m ON m.seq = c.message";

/// The held answer (a reply or a failure notice) to task `?2` for `?1`, looked up by what it
/// answers (a message or two), never by the recipient: left to itself the planner walks
/// everything held for the recipient in order, so each look of a waiting send cost as much as
/// the backlog held for its caller.
const HELD_ANSWER: &str = "FROM messages INDEXED BY messages_answers
     WHERE in_reply_to = ?2 AND to_gid = ?1 AND state = 'held' AND kind IN ('REPLY', 'FAILED')";

/// The SQLite-backed store. One connection for everything, serialised by a mutex: every call
/// is a short transaction, so contention costs microseconds. The two lookups asked most often —
/// a token, on every request, and whether an answer waits, on every wake-up of a waiting send —
/// have a read-only connection of their own: in WAL mode a reader does not wait for writers, so
/// a lookup is a few microseconds and can be made without leaving the caller's thread.
pub struct SqliteStore {
    /// The connection for everything but the frequent lookups; SQLite connections are not
    /// shareable across threads at once.
    conn: Mutex<Connection>,
    /// The read-only connection for the frequent lookups.
    reader: Mutex<Connection>,
    /// The tokens already resolved (see [`crate::tokens`]).
    tokens: Mutex<TokenCache>,
    /// The file every writer of the tokens table marks its changes on.
    tokens_mark: tokens::Mark,
}

impl SqliteStore {
    /// Notes how far the typing of `msg_id` got (`note`: [`KEYS_SENT`] or [`ENTER_SENT`]),
    /// while it is `injecting`; whether it was.
    fn note_typing(&self, msg_id: MsgId, note: &str) -> StoreResult<bool> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE messages SET reason = ?2 WHERE msg_id = ?1 AND state = 'injecting'",
            )?
            .execute(params![msg_id.to_string(), note])?;
        Ok(changed == 1)
    }

    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> StoreResult<Self> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        migrate(&mut conn)?;
        // Checkpoints on a thread of the store's own, not in the commits of the hot path.
        crate::checkpoint::take_over(path, &mut conn)?;
        // Every statement the store asks stays compiled: past rusqlite's default of 16, a
        // round trip's statements pushed one another out and each was parsed again.
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // One plan per statement, whatever its parameters: without this guarantee SQLite
        // compiled the next-task query again for every other recipient's id (it read its plan
        // as depending on the value), a tenth of a busy fleetd's CPU. The store's plans do not
        // depend on values: where an index matters, the query names it (`INDEXED BY`).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        let reader = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        reader.busy_timeout(BUSY_TIMEOUT)?;
        reader.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        reader.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        Ok(Self {
            conn: Mutex::new(conn),
            reader: Mutex::new(reader),
            tokens: Mutex::new(TokenCache::new(Instant::now())),
            tokens_mark: tokens::Mark::of(path),
        })
    }

    /// The tokens table changed (committed): forgets what this process resolved, and marks
    /// the change for every other process holding the store open. The change stands whether
    /// or not the mark can be written (a full disk, say): failing the call would hide a
    /// committed token from its caller, and another process's cache holds without the mark
    /// for at most [`tokens::TOKEN_CACHE_FOR`].
    fn tokens_changed(&self) {
        self.tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
        if let Err(e) = self.tokens_mark.changed() {
            tracing::warn!(
                mark = %self.tokens_mark.path().display(),
                error = %e,
                for_at_most_s = tokens::TOKEN_CACHE_FOR.as_secs(),
                "a token change is stored but cannot be marked: a running fleetd may take a rotated or revoked token a while more"
            );
        }
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        lock(&self.conn)
    }
}

/// A connection's lock. A panic while holding it cannot leave a half-done transaction behind
/// (rusqlite rolls back on drop), so a poisoned lock is still safe to use.
fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn parse<T: std::str::FromStr>(text: &str, what: &str) -> StoreResult<T> {
    text.parse()
        .map_err(|_| corrupt(format!("{what} '{text}' does not parse")))
}

/// The raw columns of a change row.
struct RawChange {
    seq: i64,
    at_ms: i64,
    message: Option<String>,
    entity: Option<String>,
    state: String,
    reason: Option<String>,
}

impl RawChange {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            seq: row.get(0)?,
            at_ms: row.get(1)?,
            message: row.get(2)?,
            entity: row.get(3)?,
            state: row.get(4)?,
            reason: row.get(5)?,
        })
    }

    fn parse(self) -> StoreResult<Change> {
        let subject = match (self.message, self.entity) {
            (Some(id), None) => Subject::Message(parse(&id, "change's msg_id")?),
            (None, Some(id)) => Subject::Entity(parse(&id, "change's gid")?),
            _ => {
                return Err(corrupt(format!(
                    "change {} names neither one message nor one entity",
                    self.seq
                )));
            }
        };
        Ok(Change {
            seq: self.seq,
            at_ms: self.at_ms,
            subject,
            state: self.state,
            reason: self.reason,
        })
    }
}

/// The raw columns of a message row, read before any parsing so the row closure stays
/// infallible in the domain sense.
struct RawMessage {
    msg_id: String,
    trace_id: String,
    kind: String,
    from: String,
    to: String,
    in_reply_to: Option<String>,
    body: String,
    state: String,
    reason: Option<String>,
    created_ms: i64,
    expires_ms: Option<i64>,
}

impl RawMessage {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            msg_id: row.get(0)?,
            trace_id: row.get(1)?,
            kind: row.get(2)?,
            from: row.get(3)?,
            to: row.get(4)?,
            in_reply_to: row.get(5)?,
            body: row.get(6)?,
            state: row.get(7)?,
            reason: row.get(8)?,
            created_ms: row.get(9)?,
            expires_ms: row.get(10)?,
        })
    }

    fn parse(self) -> StoreResult<Message> {
        Ok(Message {
            msg_id: parse(&self.msg_id, "msg_id")?,
            trace_id: parse(&self.trace_id, "trace_id")?,
            kind: self.kind.parse::<Kind>().map_err(corrupt)?,
            from: parse(&self.from, "from_gid")?,
            to: parse(&self.to, "to_gid")?,
            in_reply_to: self
                .in_reply_to
                .as_deref()
                .map(|id| parse(id, "in_reply_to"))
                .transpose()?,
            body: self.body,
            state: MsgState::from_parts(&self.state, self.reason).map_err(corrupt)?,
            created_ms: self.created_ms,
            expires_ms: self.expires_ms,
        })
    }
}

struct RawEntity {
    gid: String,
    name: String,
    role: String,
    host: String,
    profile: Option<String>,
    groups_json: String,
    parent: Option<String>,
    pane: Option<String>,
    status: String,
    created_ms: i64,
    sandbox: Option<String>,
    profile_role: Option<String>,
}

impl RawEntity {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            gid: row.get(0)?,
            name: row.get(1)?,
            role: row.get(2)?,
            host: row.get(3)?,
            profile: row.get(4)?,
            groups_json: row.get(5)?,
            parent: row.get(6)?,
            pane: row.get(7)?,
            status: row.get(8)?,
            created_ms: row.get(9)?,
            sandbox: row.get(10)?,
            profile_role: row.get(11)?,
        })
    }

    fn parse(self) -> StoreResult<EntityRecord> {
        Ok(EntityRecord {
            entity: Entity {
                gid: parse(&self.gid, "gid")?,
                name: self.name,
                host: self.host,
                role: self.role.parse::<Role>().map_err(corrupt)?,
                profile: self.profile,
                sandbox: self.sandbox,
                profile_role: self.profile_role,
                groups: serde_json::from_str(&self.groups_json).map_err(corrupt)?,
                parent: self
                    .parent
                    .as_deref()
                    .map(|gid| parse(gid, "parent"))
                    .transpose()?,
            },
            status: self.status.parse::<WorkerStatus>().map_err(corrupt)?,
            pane: self.pane,
            created_ms: self.created_ms,
        })
    }
}

fn query_messages(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> StoreResult<Vec<Message>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let raws = stmt
        .query_map(params, RawMessage::read)?
        .collect::<Result<Vec<_>, _>>()?;
    raws.into_iter().map(RawMessage::parse).collect()
}

/// Inserts `m` unless a message with its id is there already; whether it went in.
fn insert_row(tx: &Transaction<'_>, m: &Message) -> StoreResult<bool> {
    if let (Kind::Failed | Kind::Reply, Some(task)) = (m.kind, m.in_reply_to) {
        // A task has one answer: a failure notice about one whose reply its recipient already
        // has is told of no more than a copy would be (a gateway killed after the reply left
        // it, before it noted so, reports the task unanswered when it restarts), and a second
        // reply (a worker answering again, here or on another host) is not stored.
        let mut replied = tx.prepare_cached(
            "SELECT 1 FROM messages INDEXED BY messages_answers
             WHERE in_reply_to = ?1 AND to_gid = ?2 AND kind = 'REPLY'",
        )?;
        if replied.exists([task.to_string(), m.to.to_string()])? {
            return Ok(false);
        }
    }
    let mut stmt = tx.prepare_cached(
        "INSERT OR IGNORE INTO messages
         (msg_id, trace_id, kind, from_gid, to_gid, in_reply_to, body, state, reason, created_ms, updated_ms, expires_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11)",
    )?;
    let inserted = stmt.execute(params![
        m.msg_id.to_string(),
        m.trace_id.to_string(),
        m.kind.as_str(),
        m.from.to_string(),
        m.to.to_string(),
        m.in_reply_to.map(|id| id.to_string()),
        m.body,
        m.state.name(),
        m.state.reason(),
        m.created_ms,
        m.expires_ms,
    ])?;
    Ok(inserted == 1)
}

fn groups_json(groups: &[String]) -> StoreResult<String> {
    serde_json::to_string(groups).map_err(corrupt)
}

fn is_unique_violation(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(e, _) if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
    )
}

/// The `reason` of an `injecting` message whose keys went to its pane ([`Store::keys_sent`]).
const KEYS_SENT: &str = "keys sent";
/// The `reason` of an `injecting` message whose Enter went to its pane ([`Store::enter_sent`]).
const ENTER_SENT: &str = "enter sent";

/// A task (`messages` row) that was answered by a failure notice and never by a reply, here or
/// on its sender's host.
const FAILED_AFTER_TYPING: &str = "((EXISTS (SELECT 1 FROM messages a INDEXED BY messages_answers
            WHERE a.in_reply_to = messages.msg_id AND a.kind = 'FAILED')
        OR EXISTS (SELECT 1 FROM answered WHERE answered.msg_id = messages.msg_id AND NOT by_reply))
    AND NOT EXISTS (SELECT 1 FROM messages a INDEXED BY messages_answers
        WHERE a.in_reply_to = messages.msg_id AND a.kind = 'REPLY')
    AND NOT EXISTS (SELECT 1 FROM answered WHERE answered.msg_id = messages.msg_id AND by_reply))";

/// The `WHERE` clause of the messages `filter` selects (its page, with its `before`), and the
/// values it binds: only the conditions given, so SQLite can use an index for them (a
/// recipient's is `messages_inbox`).
fn selected(filter: &MessageFilter) -> (String, Vec<rusqlite::types::Value>) {
    let mut values: Vec<rusqlite::types::Value> = Vec::new();
    let mut bind = |value: rusqlite::types::Value| {
        values.push(value);
        format!("?{}", values.len())
    };
    let mut clauses = Vec::new();
    if let Some(state) = &filter.state {
        let at = bind(state.clone().into());
        clauses.push(if state == "failed" {
            format!("(state = {at} OR (state = 'injected' AND {FAILED_AFTER_TYPING}))")
        } else {
            format!("state = {at}")
        });
    }
    if let Some(kind) = filter.kind {
        clauses.push(format!("kind = {}", bind(kind.as_str().to_string().into())));
    }
    if let Some(to) = filter.to {
        clauses.push(format!("to_gid = {}", bind(to.to_string().into())));
    }
    if let Some(from) = filter.from {
        clauses.push(format!("from_gid = {}", bind(from.to_string().into())));
    }
    if let Some(since) = filter.since_ms {
        clauses.push(format!("created_ms >= {}", bind(since.into())));
    }
    for gid in &filter.involving {
        let at = bind(gid.to_string().into());
        clauses.push(format!("(from_gid = {at} OR to_gid = {at})"));
    }
    if let Some(before) = filter.before {
        // A message no longer stored has no seq: nothing is before it.
        let at = bind(before.to_string().into());
        clauses.push(format!(
            "seq < (SELECT seq FROM messages WHERE msg_id = {at})"
        ));
    }
    let condition = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    (condition, values)
}

impl Store for SqliteStore {
    fn ensure_lead(&self, name: &str, host: &str, groups: &[String]) -> StoreResult<Gid> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let groups = groups_json(groups)?;
        let now = now_ms();
        let existing: Option<String> = tx
            .query_row(
                "SELECT gid FROM entities WHERE role = 'lead' AND name = ?1",
                [name],
                |row| row.get(0),
            )
            .optional()?;
        let gid = match existing {
            Some(gid) => {
                tx.execute(
                    "UPDATE entities SET host = ?2, groups_json = ?3, updated_ms = ?4 WHERE gid = ?1",
                    params![gid, host, groups, now],
                )?;
                parse(&gid, "gid")?
            }
            None => {
                let gid = Gid::mint();
                let inserted = tx.execute(
                    "INSERT INTO entities (gid, name, role, host, profile, groups_json, parent, pane, status, created_ms, updated_ms)
                     VALUES (?1, ?2, 'lead', ?3, NULL, ?4, NULL, NULL, 'idle', ?5, ?5)",
                    params![gid.to_string(), name, host, groups, now],
                );
                match inserted {
                    Err(e) if is_unique_violation(&e) => {
                        return Err(StoreError::NameTaken(name.to_string()));
                    }
                    other => other?,
                };
                gid
            }
        };
        tx.commit()?;
        Ok(gid)
    }

    fn put_token(&self, gid: Gid, hash: &[u8; 32], replace: bool) -> StoreResult<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if replace {
            tx.execute("DELETE FROM tokens WHERE gid = ?1", [gid.to_string()])?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO tokens (hash, gid, created_ms) VALUES (?1, ?2, ?3)",
            params![hash.as_slice(), gid.to_string(), now_ms()],
        )?;
        tx.commit()?;
        self.tokens_changed();
        Ok(())
    }

    fn gid_for_token(&self, hash: &[u8; 32]) -> StoreResult<Option<Gid>> {
        let stamp = self.tokens_mark.stamp();
        let cache = || self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let generation = {
            let mut cache = cache();
            if let Some(gid) = cache.get(hash, stamp, Instant::now()) {
                return Ok(Some(gid));
            }
            cache.generation()
        };
        let found = {
            let conn = lock(&self.reader);
            let mut stmt = conn.prepare_cached("SELECT gid FROM tokens WHERE hash = ?1")?;
            let gid: Option<String> = stmt
                .query_row([hash.as_slice()], |row| row.get(0))
                .optional()?;
            gid.map(|gid| parse(&gid, "gid")).transpose()?
        };
        cache().put(*hash, found, stamp, generation);
        Ok(found)
    }

    fn revoke_tokens(&self, gid: Gid) -> StoreResult<()> {
        self.conn()
            .execute("DELETE FROM tokens WHERE gid = ?1", [gid.to_string()])?;
        self.tokens_changed();
        Ok(())
    }

    fn insert_entity(&self, record: &EntityRecord) -> StoreResult<()> {
        let entity = &record.entity;
        let result = self.conn().execute(
            "INSERT INTO entities (gid, name, role, host, profile, groups_json, parent, pane, status, created_ms, updated_ms, sandbox, profile_role)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11, ?12)",
            params![
                entity.gid.to_string(),
                entity.name,
                entity.role.as_str(),
                entity.host,
                entity.profile,
                groups_json(&entity.groups)?,
                entity.parent.map(|gid| gid.to_string()),
                record.pane,
                record.status.as_str(),
                record.created_ms,
                entity.sandbox,
                entity.profile_role,
            ],
        );
        match result {
            Err(e) if is_unique_violation(&e) => Err(StoreError::NameTaken(entity.name.clone())),
            other => other.map(|_| ()).map_err(StoreError::from),
        }
    }

    fn entity(&self, gid: Gid) -> StoreResult<Option<EntityRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {ENTITY_COLUMNS} FROM entities WHERE gid = ?1"
        ))?;
        let raw = stmt
            .query_row([gid.to_string()], RawEntity::read)
            .optional()?;
        raw.map(RawEntity::parse).transpose()
    }

    fn latest_named(&self, name: &str) -> StoreResult<Option<EntityRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {ENTITY_COLUMNS} FROM entities WHERE name = ?1 ORDER BY rowid DESC LIMIT 1"
        ))?;
        let raw = stmt.query_row([name], RawEntity::read).optional()?;
        raw.map(RawEntity::parse).transpose()
    }

    fn note_ended(&self, gid: Gid, why: &str) -> StoreResult<()> {
        self.conn()
            .prepare_cached("UPDATE entities SET ended = ?2 WHERE gid = ?1")?
            .execute(params![gid.to_string(), why])?;
        Ok(())
    }

    fn ended_named(&self, name: &str) -> StoreResult<Option<Ended>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT status, updated_ms, ended, parent FROM entities WHERE name = ?1
             ORDER BY rowid DESC LIMIT 1",
        )?;
        let newest = stmt
            .query_row([name], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<String>>(3)?,
                ))
            })
            .optional()?;
        Ok(newest
            .filter(|(status, ..)| status == WorkerStatus::Gone.as_str())
            .map(|(_, at_ms, why, owner)| Ended {
                at_ms,
                why,
                owner: owner.and_then(|o| o.parse().ok()),
            }))
    }

    fn live_entities(&self) -> StoreResult<Vec<EntityRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {ENTITY_COLUMNS} FROM entities WHERE status != 'gone' ORDER BY rowid"
        ))?;
        let raws = stmt
            .query_map([], RawEntity::read)?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter().map(RawEntity::parse).collect()
    }

    fn set_spawned_as(&self, entity: &Entity) -> StoreResult<()> {
        self.conn().execute(
            "UPDATE entities SET sandbox = ?2, profile_role = ?3 WHERE gid = ?1",
            params![entity.gid.to_string(), entity.sandbox, entity.profile_role],
        )?;
        Ok(())
    }

    fn set_session(&self, gid: Gid, status: WorkerStatus, pane: Option<&str>) -> StoreResult<()> {
        self.conn()
            .prepare_cached(
                "UPDATE entities SET status = ?2, pane = COALESCE(?3, pane), updated_ms = ?4 WHERE gid = ?1",
            )?
            .execute(params![gid.to_string(), status.as_str(), pane, now_ms()])?;
        Ok(())
    }

    fn insert_messages(&self, messages: &[Message]) -> StoreResult<Vec<bool>> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let fresh = messages
            .iter()
            .map(|m| insert_row(&tx, m))
            .collect::<StoreResult<Vec<bool>>>()?;
        tx.commit()?;
        Ok(fresh)
    }

    fn insert_messages_within(
        &self,
        messages: &[Message],
        admit: &dyn Fn(&Message, usize) -> Result<(), Full>,
    ) -> StoreResult<Vec<Result<Inserted, Full>>> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut outcomes = Vec::with_capacity(messages.len());
        {
            let mut seen = tx.prepare_cached("SELECT 1 FROM messages WHERE msg_id = ?1")?;
            // Kept by the schema's triggers: one lookup, whatever the backlog.
            let mut waiting = tx.prepare_cached("SELECT count FROM waiting WHERE to_gid = ?1")?;
            let mut queued = tx.prepare_cached(
                "SELECT 1 FROM messages INDEXED BY messages_inbox
                 WHERE to_gid = ?1 AND state = 'queued'",
            )?;
            for m in messages {
                if seen.exists([m.msg_id.to_string()])? {
                    outcomes.push(Ok(Inserted::Seen));
                    continue;
                }
                let behind = m.state == MsgState::Injecting && queued.exists([m.to.to_string()])?;
                let lined_up;
                let m = if behind {
                    lined_up = Message {
                        state: MsgState::Queued,
                        ..m.clone()
                    };
                    &lined_up
                } else {
                    m
                };
                if matches!(m.state, MsgState::Held | MsgState::Queued) {
                    let count: i64 = waiting
                        .query_row([m.to.to_string()], |row| row.get(0))
                        .optional()?
                        .unwrap_or(0);
                    if let Err(full) = admit(m, usize::try_from(count).unwrap_or(usize::MAX)) {
                        outcomes.push(Err(full));
                        continue;
                    }
                }
                outcomes.push(Ok(match insert_row(&tx, m)? {
                    false => Inserted::Seen,
                    true if behind => Inserted::Queued,
                    true => Inserted::New,
                }));
            }
        }
        tx.commit()?;
        Ok(outcomes)
    }

    fn transition(&self, msg_id: MsgId, next: &MsgState) -> StoreResult<()> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let current: Option<(String, Option<String>)> = tx
            .prepare_cached("SELECT state, reason FROM messages WHERE msg_id = ?1")?
            .query_row([msg_id.to_string()], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let (name, reason) = current.ok_or(StoreError::NoMessage(msg_id))?;
        let current = MsgState::from_parts(&name, reason).map_err(corrupt)?;
        if !current.can_become(next) {
            return Err(StoreError::BadTransition {
                msg_id,
                from: current.to_string(),
                to: next.to_string(),
            });
        }
        tx.prepare_cached(
            "UPDATE messages SET state = ?2, reason = ?3, updated_ms = ?4 WHERE msg_id = ?1",
        )?
        .execute(params![
            msg_id.to_string(),
            next.name(),
            next.reason(),
            now_ms()
        ])?;
        tx.commit()?;
        Ok(())
    }

    fn message(&self, msg_id: MsgId) -> StoreResult<Option<Message>> {
        let conn = self.conn();
        let mut found = query_messages(
            &conn,
            &format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE msg_id = ?1"),
            [msg_id.to_string()],
        )?;
        Ok(found.pop())
    }

    fn is_answered(&self, msg_id: MsgId) -> StoreResult<bool> {
        let conn = lock(&self.reader);
        let id = msg_id.to_string();
        let replied = conn
            .prepare_cached(
                "SELECT 1 FROM messages INDEXED BY messages_answers
                 WHERE in_reply_to = ?1 AND kind = 'REPLY'",
            )?
            .exists([&id])?;
        Ok(replied
            || conn
                .prepare_cached("SELECT 1 FROM answered WHERE msg_id = ?1 AND by_reply")?
                .exists([&id])?)
    }

    fn dequeue(&self, to: Gid, next: &MsgState) -> StoreResult<Option<Message>> {
        let conn = self.conn();
        let mut taken = query_messages(
            &conn,
            &format!(
                "UPDATE messages SET state = ?2, reason = ?3, updated_ms = ?4
                 WHERE seq = (SELECT seq FROM messages WHERE to_gid = ?1 AND state = 'queued' ORDER BY seq LIMIT 1)
                 RETURNING {MESSAGE_COLUMNS}"
            ),
            params![to.to_string(), next.name(), next.reason(), now_ms()],
        )?;
        Ok(taken.pop())
    }

    fn take_held(&self, to: Gid, from: Option<Gid>, limit: usize) -> StoreResult<Vec<Message>> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let filter = "to_gid = ?1 AND state = 'held' AND (?2 IS NULL OR from_gid = ?2)";
        let to = to.to_string();
        let from = from.map(|g| g.to_string());
        let taken = query_messages(
            &tx,
            &format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE {filter} ORDER BY seq LIMIT ?3"),
            params![to, from, limit],
        )?;
        if let Some(last) = taken.last() {
            // The rows selected are exactly the matching ones up to the last one's seq.
            tx.prepare_cached(&format!(
                "UPDATE messages SET state = 'consumed', updated_ms = ?4 WHERE {filter}
                 AND seq <= (SELECT seq FROM messages WHERE msg_id = ?3)"
            ))?
            .execute(params![to, from, last.msg_id.to_string(), now_ms()])?;
        }
        tx.commit()?;
        Ok(taken)
    }

    fn take_answer(&self, to: Gid, in_reply_to: MsgId) -> StoreResult<Option<Message>> {
        let conn = self.conn();
        let mut taken = query_messages(
            &conn,
            &format!(
                "UPDATE messages SET state = 'consumed', updated_ms = ?3
                 WHERE seq = (SELECT seq {HELD_ANSWER} ORDER BY seq LIMIT 1)
                 RETURNING {MESSAGE_COLUMNS}"
            ),
            params![to.to_string(), in_reply_to.to_string(), now_ms()],
        )?;
        Ok(taken.pop())
    }

    fn answers(&self, msg_ids: &[MsgId]) -> StoreResult<Vec<(MsgId, Answer)>> {
        // On the main connection: the reader's is kept for the lookups made on the runtime's
        // threads, and a listing may ask for a thousand.
        let conn = self.conn();
        let mut here = conn.prepare_cached(
            "SELECT kind = 'REPLY', CASE WHEN kind = 'FAILED' THEN body END FROM messages INDEXED BY messages_answers
             WHERE in_reply_to = ?1 AND kind IN ('REPLY', 'FAILED')
             ORDER BY kind = 'REPLY' DESC LIMIT 1",
        )?;
        let mut elsewhere =
            conn.prepare_cached("SELECT by_reply FROM answered WHERE msg_id = ?1")?;
        let mut found = Vec::new();
        for msg_id in msg_ids {
            let id = msg_id.to_string();
            let held: Option<(bool, Option<String>)> = here
                .query_row([&id], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?;
            let afar: Option<bool> = elsewhere.query_row([&id], |row| row.get(0)).optional()?;
            let answer = match (held, afar) {
                (Some((true, _)), _) | (_, Some(true)) => Answer::Replied,
                (Some((false, told)), _) => Answer::Failed(told),
                (None, Some(false)) => Answer::Failed(None),
                (None, None) => continue,
            };
            found.push((*msg_id, answer));
        }
        Ok(found)
    }

    fn answer_waits(&self, to: Gid, in_reply_to: MsgId) -> StoreResult<bool> {
        let conn = lock(&self.reader);
        let mut stmt = conn.prepare_cached(&format!("SELECT 1 {HELD_ANSWER}"))?;
        Ok(stmt.exists(params![to.to_string(), in_reply_to.to_string()])?)
    }

    fn held_count(&self, to: Gid) -> StoreResult<usize> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT COUNT(*) FROM messages WHERE to_gid = ?1 AND state = 'held'")?;
        let count: i64 = stmt.query_row([to.to_string()], |row| row.get(0))?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    fn waiting_count(&self, to: Gid) -> StoreResult<usize> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT count FROM waiting WHERE to_gid = ?1")?;
        let count: Option<i64> = stmt
            .query_row([to.to_string()], |row| row.get(0))
            .optional()?;
        Ok(count.map_or(0, |c| usize::try_from(c).unwrap_or(0)))
    }

    fn messages(&self, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        let (condition, mut values) = selected(filter);
        values.push(i64::try_from(filter.limit).unwrap_or(i64::MAX).into());
        let limit = values.len();
        let conn = self.conn();
        query_messages(
            &conn,
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages {condition} ORDER BY seq DESC LIMIT ?{limit}"
            ),
            rusqlite::params_from_iter(values),
        )
    }

    fn message_total(&self, filter: &MessageFilter) -> StoreResult<(usize, usize)> {
        // Every page: the conditions without `before`, which says only how many are newer.
        let (condition, mut values) = selected(&MessageFilter {
            before: None,
            ..filter.clone()
        });
        let newer = match filter.before {
            Some(before) => {
                values.push(before.to_string().into());
                format!(
                    "COALESCE(SUM(seq >= (SELECT seq FROM messages WHERE msg_id = ?{})), 0)",
                    values.len()
                )
            }
            None => "0".to_string(),
        };
        let conn = self.conn();
        let (total, newer): (i64, i64) = conn.query_row(
            &format!("SELECT COUNT(*), {newer} FROM messages {condition}"),
            rusqlite::params_from_iter(values),
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        let count = |n: i64| usize::try_from(n).unwrap_or(0);
        Ok((count(total), count(newer)))
    }

    fn message_counts(&self) -> StoreResult<Vec<(String, String, usize)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT kind, state, COUNT(*) FROM messages GROUP BY kind, state ORDER BY kind, state",
        )?;
        let rows = stmt.query_map([], |row| {
            let count: i64 = row.get(2)?;
            Ok((
                row.get(0)?,
                row.get(1)?,
                usize::try_from(count).unwrap_or(0),
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn waiting_by_recipient(&self) -> StoreResult<Vec<(Gid, String, usize)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT to_gid, state, COUNT(*) FROM messages WHERE state IN ('held', 'queued')
             GROUP BY to_gid, state ORDER BY to_gid, state",
        )?;
        let rows = stmt.query_map([], |row| {
            let (to, state, count): (String, String, i64) = (row.get(0)?, row.get(1)?, row.get(2)?);
            Ok((to, state, usize::try_from(count).unwrap_or(0)))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (to, state, count) = row?;
            out.push((parse(&to, "recipient")?, state, count));
        }
        Ok(out)
    }

    fn last_answer_ms(&self, to: Gid, from: Gid) -> StoreResult<Option<i64>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT MAX(created_ms) FROM messages
             WHERE to_gid = ?1 AND from_gid = ?2 AND kind IN ('REPLY', 'FAILED')",
        )?;
        Ok(stmt.query_row([to.to_string(), from.to_string()], |row| row.get(0))?)
    }

    fn fail_undelivered_to(
        &self,
        to: Gid,
        reason: &str,
        in_flight: Option<MsgId>,
    ) -> StoreResult<Vec<Message>> {
        let conn = self.conn();
        let in_flight = in_flight.map(|id| id.to_string()).unwrap_or_default();
        query_messages(
            &conn,
            &format!(
                "UPDATE messages SET state = 'failed', reason = ?2, updated_ms = ?3
                 WHERE to_gid = ?1 AND state IN ('queued', 'injecting')
                   AND NOT (msg_id = ?4 AND state = 'injecting' AND reason IS ?5)
                 RETURNING {MESSAGE_COLUMNS}"
            ),
            params![to.to_string(), reason, now_ms(), in_flight, ENTER_SENT],
        )
    }

    fn keys_sent(&self, msg_id: MsgId) -> StoreResult<bool> {
        self.note_typing(msg_id, KEYS_SENT)
    }

    fn enter_sent(&self, msg_id: MsgId) -> StoreResult<bool> {
        self.note_typing(msg_id, ENTER_SENT)
    }

    fn keys_sent_to(&self, to: Gid) -> StoreResult<Vec<(MsgId, bool)>> {
        let conn = self.conn();
        let mut query = conn.prepare_cached(
            "SELECT msg_id, reason = ?3 FROM messages
             WHERE to_gid = ?1 AND state = 'injecting' AND reason IN (?2, ?3)",
        )?;
        let rows = query
            .query_map(params![to.to_string(), KEYS_SENT, ENTER_SENT], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, bool>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.iter()
            .map(|(id, entered)| Ok((parse(id, "msg_id")?, *entered)))
            .collect()
    }

    fn fail_untyped(&self, msg_id: MsgId, reason: &str) -> StoreResult<bool> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE messages SET state = 'failed', reason = ?2, updated_ms = ?3
                 WHERE msg_id = ?1 AND state = 'injecting' AND reason IS NOT ?4",
            )?
            .execute(params![msg_id.to_string(), reason, now_ms(), ENTER_SENT])?;
        Ok(changed == 1)
    }

    fn put_back_untyped(&self, msg_id: MsgId) -> StoreResult<bool> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE messages SET state = 'queued', reason = NULL, updated_ms = ?2
                 WHERE msg_id = ?1 AND state = 'injecting'",
            )?
            .execute(params![msg_id.to_string(), now_ms()])?;
        Ok(changed == 1)
    }

    fn fail_leftovers(
        &self,
        interrupted: &str,
        orphaned: &str,
        kept: &[Gid],
    ) -> StoreResult<Vec<Message>> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let now = now_ms();
        let kept: Vec<String> = kept.iter().map(Gid::to_string).collect();
        let kept = serde_json::to_string(&kept).map_err(corrupt)?;
        let mut failed = query_messages(
            &tx,
            &format!(
                "UPDATE messages SET state = 'failed', reason = ?1, updated_ms = ?2
                 WHERE state = 'injecting'
                 RETURNING {MESSAGE_COLUMNS}"
            ),
            params![interrupted, now],
        )?;
        failed.extend(query_messages(
            &tx,
            &format!(
                "UPDATE messages SET state = 'failed', reason = ?1, updated_ms = ?2
                 WHERE state = 'queued' AND to_gid NOT IN (SELECT value FROM json_each(?3))
                 RETURNING {MESSAGE_COLUMNS}"
            ),
            params![orphaned, now, kept],
        )?);
        tx.commit()?;
        Ok(failed)
    }

    fn put_adoptable(&self, gid: Gid, facts: &str, since_ms: i64) -> StoreResult<()> {
        self.conn()
            .prepare_cached(
                "INSERT INTO adoptable (gid, facts, since_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (gid) DO UPDATE SET facts = excluded.facts, since_ms = excluded.since_ms",
            )?
            .execute(params![gid.to_string(), facts, since_ms])?;
        Ok(())
    }

    fn adoptable(&self, gid: Gid) -> StoreResult<Option<(String, i64)>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT facts, since_ms FROM adoptable WHERE gid = ?1")?
            .query_row([gid.to_string()], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?)
    }

    fn tasks_taken(&self, to: Gid, since_ms: i64) -> StoreResult<u64> {
        let count: i64 = self
            .conn()
            .prepare_cached(
                "SELECT COUNT(*) FROM messages
                 WHERE to_gid = ?1 AND kind = 'SEND' AND state IN ('injected', 'consumed')
                 AND updated_ms >= ?2",
            )?
            .query_row(params![to.to_string(), since_ms], |row| row.get(0))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    fn put_lead_pane(&self, gid: Gid, pane: &str, socket: &str, server: u32) -> StoreResult<()> {
        self.conn()
            .prepare_cached(
                "INSERT INTO lead_panes (gid, pane, socket, server_pid) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (gid) DO UPDATE SET pane = excluded.pane, socket = excluded.socket,
                 server_pid = excluded.server_pid",
            )?
            .execute(params![gid.to_string(), pane, socket, server])?;
        Ok(())
    }

    fn forget_lead_pane(&self, gid: Gid) -> StoreResult<()> {
        self.conn()
            .prepare_cached("DELETE FROM lead_panes WHERE gid = ?1")?
            .execute([gid.to_string()])?;
        Ok(())
    }

    fn lead_pane(&self, gid: Gid) -> StoreResult<Option<(String, String, u32)>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT pane, socket, server_pid FROM lead_panes WHERE gid = ?1")?
            .query_row([gid.to_string()], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()?)
    }

    fn last_alive_ms(&self) -> StoreResult<Option<i64>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT at_ms FROM alive WHERE id = 1")?
            .query_row([], |row| row.get(0))
            .optional()?)
    }

    fn unanswered_tasks_to(&self, to: Gid) -> StoreResult<Vec<Message>> {
        let conn = self.conn();
        query_messages(
            &conn,
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages AS m
                 WHERE m.to_gid = ?1 AND m.kind = 'SEND' AND m.state IN ('injected', 'held', 'consumed')
                 AND NOT EXISTS (SELECT 1 FROM messages AS a WHERE a.in_reply_to = m.msg_id)
                 AND NOT EXISTS (SELECT 1 FROM answered AS d WHERE d.msg_id = m.msg_id)
                 ORDER BY m.seq"
            ),
            [to.to_string()],
        )
    }

    fn answered_elsewhere(&self, msg_id: MsgId, by_reply: bool) -> StoreResult<()> {
        let conn = self.conn();
        // Only for a task this store has: the note goes with it when it is pruned.
        conn.prepare_cached(
            "INSERT INTO answered (msg_id, by_reply) SELECT msg_id, ?2 FROM messages WHERE msg_id = ?1
             ON CONFLICT (msg_id) DO UPDATE SET by_reply = max(by_reply, excluded.by_reply)",
        )?
        .execute(params![msg_id.to_string(), by_reply])?;
        Ok(())
    }

    fn release(&self, msg_ids: &[MsgId]) -> StoreResult<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE messages SET state = 'held', updated_ms = ?2 WHERE msg_id = ?1 AND state = 'consumed'",
            )?;
            let now = now_ms();
            for id in msg_ids {
                stmt.execute(params![id.to_string(), now])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn prune(&self, before_ms: i64) -> StoreResult<usize> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        // A message's changes go with it (a trigger); an entity's by age.
        let pruned = tx.execute(
            "DELETE FROM messages WHERE state IN ('injected', 'consumed', 'failed') AND updated_ms < ?1",
            [before_ms],
        )?;
        tx.execute(
            "DELETE FROM changes WHERE entity IS NOT NULL AND at_ms < ?1",
            [before_ms],
        )?;
        tx.commit()?;
        Ok(pruned)
    }

    fn changes_since(&self, after_seq: i64, limit: usize) -> StoreResult<Vec<Change>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "{CHANGES} WHERE c.seq > ?1 AND (m.msg_id IS NOT NULL OR c.entity IS NOT NULL)
             ORDER BY c.seq LIMIT ?2"
        ))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let raws = stmt
            .query_map(params![after_seq, limit], RawChange::read)?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter().map(RawChange::parse).collect()
    }

    fn last_change(&self) -> StoreResult<i64> {
        let conn = self.conn();
        // The last number given (AUTOINCREMENT keeps it), even when its row is pruned.
        let mut stmt = conn.prepare_cached(
            "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'changes'), 0)",
        )?;
        Ok(stmt.query_row([], |row| row.get(0))?)
    }

    fn probe_write(&self) -> StoreResult<()> {
        self.conn()
            .prepare_cached(
                "INSERT INTO alive (id, at_ms) VALUES (1, ?1)
                 ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms",
            )?
            .execute([now_ms()])?;
        Ok(())
    }

    fn history(&self, msg_id: MsgId) -> StoreResult<Vec<Change>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "{CHANGES} WHERE c.message = (SELECT seq FROM messages WHERE msg_id = ?1) ORDER BY c.seq"
        ))?;
        let raws = stmt
            .query_map([msg_id.to_string()], RawChange::read)?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter().map(RawChange::parse).collect()
    }

    fn see(&self, arrivals: &[(MsgId, Gid, i64)]) -> StoreResult<Vec<bool>> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut seen = Vec::with_capacity(arrivals.len());
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO seen (msg_id, owner, until_ms) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            )?;
            for (msg_id, owner, until_ms) in arrivals {
                let added =
                    insert.execute(params![msg_id.to_string(), owner.to_string(), until_ms])?;
                seen.push(added == 0);
            }
        }
        tx.commit()?;
        Ok(seen)
    }

    fn record_sent(&self, sent: &[SentRecord]) -> StoreResult<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO sent (msg_id, host, from_gid, to_gid, until_ms) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT DO UPDATE SET until_ms = MAX(until_ms, excluded.until_ms)",
            )?;
            for r in sent {
                insert.execute(params![
                    r.msg_id.to_string(),
                    r.host,
                    r.from.to_string(),
                    r.to.map(|g| g.to_string()),
                    r.until_ms
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn sent_to(&self, asked: &[(MsgId, String)]) -> StoreResult<Vec<Option<SentBetween>>> {
        let conn = self.conn();
        let mut query = conn
            .prepare_cached("SELECT from_gid, to_gid FROM sent WHERE msg_id = ?1 AND host = ?2")?;
        let mut found = Vec::with_capacity(asked.len());
        for (msg_id, host) in asked {
            let row: Option<(String, Option<String>)> = query
                .query_row(params![msg_id.to_string(), host], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()?;
            found.push(match row {
                Some((from, to)) => Some((
                    parse(&from, "sent sender")?,
                    to.map(|t| parse(&t, "sent recipient")).transpose()?,
                )),
                None => None,
            });
        }
        Ok(found)
    }

    fn sent_records(&self, msg_ids: &[MsgId]) -> StoreResult<Vec<(MsgId, Gid, Option<Gid>)>> {
        let conn = self.conn();
        let mut query =
            conn.prepare_cached("SELECT from_gid, to_gid FROM sent WHERE msg_id = ?1")?;
        let mut found = Vec::new();
        for msg_id in msg_ids {
            let rows = query.query_map([msg_id.to_string()], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?))
            })?;
            for row in rows {
                let (from, to) = row?;
                found.push((
                    *msg_id,
                    parse(&from, "sent sender")?,
                    to.map(|t| parse(&t, "sent recipient")).transpose()?,
                ));
            }
        }
        Ok(found)
    }

    fn recent_broadcasts(&self, limit: usize) -> StoreResult<Vec<(MsgId, Gid)>> {
        let conn = self.conn();
        let mut query = conn.prepare_cached(
            "SELECT msg_id, from_gid FROM sent WHERE host = '*' ORDER BY until_ms DESC LIMIT ?1",
        )?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = query.query_map([limit], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, from) = row?;
            out.push((parse(&id, "sent id")?, parse(&from, "sent sender")?));
        }
        Ok(out)
    }

    fn put_outbox(&self, message: &Message, now_ms: i64) -> StoreResult<()> {
        let text = serde_json::to_string(message).map_err(corrupt)?;
        self.conn().execute(
            "INSERT INTO outbox (msg_id, message, since_ms) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            params![message.msg_id.to_string(), text, now_ms],
        )?;
        Ok(())
    }

    fn outbox(&self) -> StoreResult<Vec<Message>> {
        let conn = self.conn();
        let mut query = conn.prepare_cached("SELECT message FROM outbox ORDER BY since_ms")?;
        let rows = query.query_map([], |row| row.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?).map_err(corrupt)?);
        }
        Ok(out)
    }

    fn outbox_sent(&self, msg_id: MsgId) -> StoreResult<()> {
        self.conn()
            .execute("DELETE FROM outbox WHERE msg_id = ?1", [msg_id.to_string()])?;
        Ok(())
    }

    fn await_receipt(&self, brief: &AwaitedReceipt) -> StoreResult<()> {
        self.conn().execute(
            "INSERT INTO awaited (msg_id, sender, recipient, trace_id) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT DO NOTHING",
            params![
                brief.msg_id.to_string(),
                brief.sender.to_string(),
                brief.recipient.to_string(),
                brief.trace_id.to_string()
            ],
        )?;
        Ok(())
    }

    fn receipts_settled(&self, msg_ids: &[MsgId]) -> StoreResult<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut delete = tx.prepare_cached("DELETE FROM awaited WHERE msg_id = ?1")?;
            for id in msg_ids {
                delete.execute([id.to_string()])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn awaited_receipts(&self) -> StoreResult<Vec<AwaitedReceipt>> {
        let conn = self.conn();
        let mut query =
            conn.prepare_cached("SELECT msg_id, sender, recipient, trace_id FROM awaited")?;
        let rows = query.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, String>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (msg_id, sender, recipient, trace_id) = row?;
            out.push(AwaitedReceipt {
                msg_id: parse(&msg_id, "awaited id")?,
                sender: parse(&sender, "awaited sender")?,
                recipient: parse(&recipient, "awaited recipient")?,
                trace_id: parse(&trace_id, "awaited trace")?,
            });
        }
        Ok(out)
    }

    fn forget(&self, now_ms: i64) -> StoreResult<usize> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let seen = tx.execute("DELETE FROM seen WHERE until_ms < ?1", [now_ms])?;
        let sent = tx.execute("DELETE FROM sent WHERE until_ms < ?1", [now_ms])?;
        let senders = tx.execute(
            "DELETE FROM coord_senders WHERE until_ms < ?1 AND NOT EXISTS \
             (SELECT 1 FROM messages WHERE messages.msg_id = coord_senders.msg_id)",
            [now_ms],
        )?;
        tx.commit()?;
        Ok(seen + sent + senders)
    }

    fn note_coord_sender(&self, msg_id: MsgId, coord_id: &str, until_ms: i64) -> StoreResult<()> {
        self.conn().execute(
            "INSERT OR IGNORE INTO coord_senders (msg_id, coord_id, until_ms) VALUES (?1, ?2, ?3)",
            params![msg_id.to_string(), coord_id, until_ms],
        )?;
        Ok(())
    }

    fn coord_sender(&self, msg_id: MsgId) -> StoreResult<Option<String>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT coord_id FROM coord_senders WHERE msg_id = ?1",
                [msg_id.to_string()],
                |row| row.get(0),
            )
            .optional()?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use fleet_core::TraceId;
    use rusqlite::StatementStatus;

    fn queued(to: Gid) -> Message {
        Message {
            msg_id: MsgId::mint(),
            trace_id: TraceId::mint(),
            kind: Kind::Send,
            from: to,
            to,
            in_reply_to: None,
            body: "x".into(),
            state: MsgState::Queued,
            created_ms: 1,
            expires_ms: None,
        }
    }

    /// A statement is compiled once: taking the next task of one worker, then of another, or
    /// draining another count of answers, does not make SQLite compile it again for the new
    /// values (its planner would, for a plan it takes to depend on them, without the
    /// stability guarantee).
    #[test]
    fn taking_tasks_of_different_workers_compiles_nothing_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("fleet.db")).unwrap();
        let workers: Vec<Gid> = (0..3).map(|_| Gid::mint()).collect();
        for _ in 0..4 {
            let batch: Vec<Message> = workers.iter().map(|w| queued(*w)).collect();
            store.insert_messages(&batch).unwrap();
        }
        for round in 0..4 {
            for w in &workers {
                let taken = store.dequeue(*w, &MsgState::Injecting).unwrap().unwrap();
                store.transition(taken.msg_id, &MsgState::Injected).unwrap();
                assert_eq!(taken.to, *w, "round {round}");
            }
        }
        // Held answers drained a few at a time, each time another count.
        let lead = Gid::mint();
        for _ in 0..6 {
            store
                .insert_messages(&[Message {
                    state: MsgState::Held,
                    ..queued(lead)
                }])
                .unwrap();
        }
        for limit in 1..=3 {
            assert_eq!(store.take_held(lead, None, limit).unwrap().len(), limit);
        }
        let conn = store.conn();
        for sql in [
            format!(
                "UPDATE messages SET state = ?2, reason = ?3, updated_ms = ?4
                 WHERE seq = (SELECT seq FROM messages WHERE to_gid = ?1 AND state = 'queued' ORDER BY seq LIMIT 1)
                 RETURNING {MESSAGE_COLUMNS}"
            ),
            "UPDATE messages SET state = ?2, reason = ?3, updated_ms = ?4 WHERE msg_id = ?1"
                .to_string(),
            format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages WHERE to_gid = ?1 AND state = 'held' AND (?2 IS NULL OR from_gid = ?2) ORDER BY seq LIMIT ?3"
            ),
        ] {
            let stmt = conn.prepare_cached(&sql).unwrap();
            // The store's own statement (run, not compiled afresh here), never compiled again.
            assert!(stmt.get_status(StatementStatus::Run) >= 3, "{sql}");
            assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0, "{sql}");
        }
    }
}
