//! The local plane's durable state: entities (with their session status and pane), token
//! hashes, and every message with its state.
//!
//! [`Store`] is the storage-neutral contract; [`SqliteStore`] keeps it in one SQLite file in
//! WAL mode. Calls are synchronous and short: the daemon runs them off its async threads.
//! This crate never decides *what* to deliver; it only records, and answers queries atomically.

mod checkpoint;
mod schema;
mod sqlite;
pub mod tokens;

use fleet_core::bounds::Full;
use fleet_core::{Entity, Gid, Kind, Message, MsgId, MsgState, TraceId, WorkerStatus};

pub use sqlite::SqliteStore;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database said no.
    #[error("state database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A live entity already has this name.
    #[error("the name '{0}' is already taken by a live entity")]
    NameTaken(String),
    /// A row does not parse; the database was changed behind fleetd's back.
    #[error("state database holds a bad row: {0}")]
    Corrupt(String),
    /// The state dir was written by a newer fleetd.
    #[error("state database schema {found} is newer than this fleetd understands ({known})")]
    NewerSchema {
        /// The version on disk.
        found: i64,
        /// The newest version this build knows.
        known: i64,
    },
    /// A message was asked to move to a state it cannot reach from where it is.
    #[error("message {msg_id} cannot go from {from} to {to}")]
    BadTransition {
        /// The message.
        msg_id: MsgId,
        /// Its state now.
        from: String,
        /// The state asked for.
        to: String,
    },
    /// No such message.
    #[error("no message {0}")]
    NoMessage(MsgId),
}

/// A result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// What became of a message offered to [`Store::insert_messages_within`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// New: stored as it came.
    New,
    /// New, offered `injecting`, but stored `queued`: something was queued for its recipient
    /// before it.
    Queued,
    /// Seen before: nothing of it was stored again.
    Seen,
}

impl Inserted {
    /// Whether it was new.
    pub fn fresh(self) -> bool {
        self != Inserted::Seen
    }
}

/// An entity with its session state, as kept in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntityRecord {
    /// Who it is.
    pub entity: Entity,
    /// Where it is in its life (leads are always `idle`).
    pub status: WorkerStatus,
    /// The pane host's id of its pane, for pane-bound entities.
    pub pane: Option<String>,
    /// When it was created, in Unix milliseconds.
    pub created_ms: i64,
}

/// How a message was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// By a reply.
    Replied,
    /// Only by a failure notice: what it told, if it is held here (a notice to another host's
    /// sender is not).
    Failed(Option<String>),
}

/// The end of an entity that is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// When it ended (its last change), in Unix milliseconds.
    pub at_ms: i64,
    /// Why, if that was recorded (not by a build before schema 12).
    pub why: Option<String>,
    /// The lead that spawned it, if one did.
    pub owner: Option<Gid>,
}

/// Who a remembered message went between: its sender, and its recipient (none for a
/// broadcast's own id).
pub type SentBetween = (Gid, Option<Gid>);

/// A brief published to a remote worker, whose `INJECTED` receipt is awaited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwaitedReceipt {
    /// The brief's id.
    pub msg_id: MsgId,
    /// Who sent it.
    pub sender: Gid,
    /// The remote worker it went to.
    pub recipient: Gid,
    /// Its trace.
    pub trace_id: TraceId,
}

/// A message this gateway published to another host, as remembered for its answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentRecord {
    /// Its id.
    pub msg_id: MsgId,
    /// The host it went to (`*` for a broadcast, besides a row per host it reached).
    pub host: String,
    /// Its sender.
    pub from: Gid,
    /// Its recipient (none for a broadcast's own id).
    pub to: Option<Gid>,
    /// Until when it is remembered, Unix ms.
    pub until_ms: i64,
}

/// What [`Store::messages`] selects: every condition given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageFilter {
    /// Its state's name (see `MsgState::NAMES`); `failed` also takes a task that was typed
    /// (`injected`) and then answered only by a failure notice (its worker ended, stalled …).
    pub state: Option<String>,
    /// Its kind.
    pub kind: Option<Kind>,
    /// Its recipient.
    pub to: Option<Gid>,
    /// Its sender.
    pub from: Option<Gid>,
    /// Made at or after this Unix ms.
    pub since_ms: Option<i64>,
    /// Sent by or to each of these entities (a lead's own, and the one it asks about).
    pub involving: Vec<Gid>,
    /// Stored before this message (a page on from the last one listed); none if it is not stored.
    pub before: Option<MsgId>,
    /// At most this many, the newest.
    pub limit: usize,
}

/// What a recorded change is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A message, whose state changed (or which was made).
    Message(MsgId),
    /// An entity, whose status changed (or which was made).
    Entity(Gid),
}

/// One change of a message's state or an entity's status, as the store recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Its place in the order of all changes (increasing, never reused).
    pub seq: i64,
    /// When it happened, Unix ms.
    pub at_ms: i64,
    /// What changed.
    pub subject: Subject,
    /// The state (a message's) or status (an entity's) it reached.
    pub state: String,
    /// Why, for a message that failed.
    pub reason: Option<String>,
}

/// The durable state of one gateway. Every method is atomic; none blocks for long.
pub trait Store: Send + Sync + 'static {
    /// Returns the gid of the lead `name`, minting it on first use (fixed from then on).
    /// Updates the lead's groups and host to those given.
    fn ensure_lead(&self, name: &str, host: &str, groups: &[String]) -> StoreResult<Gid>;

    /// Records the hash of a bearer token for `gid`. With `replace`, every earlier token of
    /// `gid` stops working in the same transaction.
    fn put_token(&self, gid: Gid, hash: &[u8; 32], replace: bool) -> StoreResult<()>;

    /// The gid a token hash belongs to, if any. Asked on every request: it must not wait for
    /// other calls' transactions.
    fn gid_for_token(&self, hash: &[u8; 32]) -> StoreResult<Option<Gid>>;

    /// Makes every token of `gid` stop working.
    fn revoke_tokens(&self, gid: Gid) -> StoreResult<()>;

    /// Adds a pane-bound entity. Fails with [`StoreError::NameTaken`] if a live entity has its
    /// name.
    fn insert_entity(&self, record: &EntityRecord) -> StoreResult<()>;

    /// One entity, live or gone.
    fn entity(&self, gid: Gid) -> StoreResult<Option<EntityRecord>>;

    /// The newest entity ever called `name`, live or gone.
    fn latest_named(&self, name: &str) -> StoreResult<Option<EntityRecord>>;

    /// Records why `gid` ended (its status is made gone apart, by [`Store::set_session`]): a
    /// sentence of fleetd's own (no screen, no task), which the gateway tells its owner.
    fn note_ended(&self, gid: Gid, why: &str) -> StoreResult<()>;

    /// The newest entity ever called `name`, if it is gone: when it ended and why.
    fn ended_named(&self, name: &str) -> StoreResult<Option<Ended>>;

    /// Every entity that is not gone, in the order they were added.
    fn live_entities(&self) -> StoreResult<Vec<EntityRecord>>;

    /// Records what `entity` runs as now: its sandbox and its profile's role (a recycled
    /// worker's fresh session runs as its profile says at the time).
    fn set_spawned_as(&self, entity: &Entity) -> StoreResult<()>;

    /// Records a session's status and, when given, its pane.
    fn set_session(&self, gid: Gid, status: WorkerStatus, pane: Option<&str>) -> StoreResult<()>;

    /// Accepts a message. Returns false (and changes nothing) if its id was seen before: the
    /// dedup on every path. A `FAILED` notice about a task whose `REPLY` its recipient already
    /// has counts as seen before too: a task has one answer.
    fn insert_message(&self, message: &Message) -> StoreResult<bool> {
        Ok(self
            .insert_messages(std::slice::from_ref(message))?
            .first()
            .is_some_and(|fresh| *fresh))
    }

    /// Accepts messages in one transaction (all or none): for each, whether it was new (see
    /// [`Store::insert_message`]).
    fn insert_messages(&self, messages: &[Message]) -> StoreResult<Vec<bool>>;

    /// Accepts messages in one transaction as [`Store::insert_messages`] does, except that a
    /// new message that is to wait for its recipient (`held` or `queued`) goes in only if
    /// `admit` allows it, asked with how many messages already wait for that recipient (those
    /// accepted earlier in the same call included). For each: what became of it, or the cap
    /// that refused it (nothing of it is then stored). A message seen before is a duplicate,
    /// never refused, so a redelivery is settled as before. The count and the insert are one
    /// transaction: concurrent callers never take a recipient past the cap together.
    ///
    /// A new task offered `injecting` (taken by its worker as it is accepted, never queued)
    /// goes in so only if nothing is queued for its recipient: otherwise it is queued behind
    /// what is, within the cap as any queued message ([`Inserted::Queued`]), never ahead of it.
    fn insert_messages_within(
        &self,
        messages: &[Message],
        admit: &dyn Fn(&Message, usize) -> Result<(), Full>,
    ) -> StoreResult<Vec<Result<Inserted, Full>>>;

    /// Moves a message to `next`, refusing transitions the message rules forbid.
    fn transition(&self, msg_id: MsgId, next: &MsgState) -> StoreResult<()>;

    /// One message, in whatever state.
    fn message(&self, msg_id: MsgId) -> StoreResult<Option<Message>>;

    /// Whether task `msg_id` has its reply: stored here, or gone to another host
    /// ([`Store::answered_elsewhere`]). A task has one reply: a second is never stored (a
    /// failure notice does not count: a reply after it still goes). Asked without waiting for
    /// writers.
    fn is_answered(&self, msg_id: MsgId) -> StoreResult<bool>;

    /// How each of `msg_ids` that was answered was, here or on the sender's host
    /// ([`Store::answered_elsewhere`]): a reply wins over a failure notice. Ids not answered
    /// are left out.
    fn answers(&self, msg_ids: &[MsgId]) -> StoreResult<Vec<(MsgId, Answer)>>;

    /// Takes the oldest queued message for `to` off its queue, moving it to `next` (injecting,
    /// or held when an open poll will take it), in one transaction.
    fn dequeue(&self, to: Gid, next: &MsgState) -> StoreResult<Option<Message>>;

    /// Drains up to `limit` held messages for `to` (only those from `from`, when given), oldest
    /// first, marking them consumed in the same transaction: each is handed out once.
    fn take_held(&self, to: Gid, from: Option<Gid>, limit: usize) -> StoreResult<Vec<Message>>;

    /// Drains the held message for `to` that answers `in_reply_to` (a reply or a failure
    /// notice), if one has arrived.
    fn take_answer(&self, to: Gid, in_reply_to: MsgId) -> StoreResult<Option<Message>>;

    /// Whether a held answer to `in_reply_to` waits for `to` (what [`Store::take_answer`] would
    /// take), asked without waiting for writers: cheap enough for every wake-up of a send that
    /// waits for its answer.
    fn answer_waits(&self, to: Gid, in_reply_to: MsgId) -> StoreResult<bool>;

    /// How many messages are held for `to`.
    fn held_count(&self, to: Gid) -> StoreResult<usize>;

    /// How many messages wait for `to` to pull them: held, or queued and not yet taken.
    fn waiting_count(&self, to: Gid) -> StoreResult<usize>;

    /// The stored messages `filter` selects, newest first.
    fn messages(&self, filter: &MessageFilter) -> StoreResult<Vec<Message>>;

    /// How many stored messages `filter` selects, its `before` and `limit` aside (all its
    /// pages), and how many of those are not older than its `before` (the pages before the one
    /// it asks for; none without `before`).
    fn message_total(&self, filter: &MessageFilter) -> StoreResult<(usize, usize)>;

    /// How many messages are stored, by kind and state (the names the store keeps them by).
    fn message_counts(&self) -> StoreResult<Vec<(String, String, usize)>>;

    /// How many messages wait for each recipient, by state: held, or queued.
    fn waiting_by_recipient(&self) -> StoreResult<Vec<(Gid, String, usize)>>;

    /// When `from` last answered `to` (Unix ms, as the answer was created): a reply, or the
    /// notice that a message of `to`'s to it failed (held, taken or settled since); `None` if
    /// it never did.
    fn last_answer_ms(&self, to: Gid, from: Gid) -> StoreResult<Option<i64>>;

    /// Fails every queued or injecting message to `to` with `reason`; returns them so their
    /// senders can be told. The task `in_flight`, if the Enter under it went to the pane
    /// already ([`Store::enter_sent`]), is left as it is: what became of it is for whoever
    /// types it to record (a worker that ended as it took the task may have taken it: it ended
    /// before replying, not before its task reached it). One only pasted is failed, so the
    /// Enter under it is withheld.
    fn fail_undelivered_to(
        &self,
        to: Gid,
        reason: &str,
        in_flight: Option<MsgId>,
    ) -> StoreResult<Vec<Message>>;

    /// Records that the keys of `msg_id`, `injecting`, are to go to its pane: until then
    /// a stop leaves it certainly untyped. (Kept in its `reason`, which an `injecting`
    /// message has no other use for; cleared by its next state.) False if it is no longer
    /// `injecting` (failed meanwhile): its keys are not to go.
    fn keys_sent(&self, msg_id: MsgId) -> StoreResult<bool>;

    /// Records that the Enter under `msg_id`, `injecting` and pasted, is to go to its pane
    /// (once the paste shows): until then it cannot have been submitted. False if it is no
    /// longer `injecting`.
    fn enter_sent(&self, msg_id: MsgId) -> StoreResult<bool>;

    /// The messages `injecting` for `to` whose keys [`Store::keys_sent`] recorded sent, each
    /// with whether its Enter went too ([`Store::enter_sent`]).
    fn keys_sent_to(&self, to: Gid) -> StoreResult<Vec<(MsgId, bool)>>;

    /// Fails `msg_id` with `reason` if it is still being typed and its Enter has not gone in
    /// (`injecting`, no [`Store::enter_sent`] noted): its typing's next note is refused from
    /// then on, so what is left of its keys is withheld, and a restart does not put it back.
    /// Returns whether it was failed (a task whose Enter went, typed, or settled otherwise is
    /// left as it is).
    fn fail_untyped(&self, msg_id: MsgId, reason: &str) -> StoreResult<bool>;

    /// At start-up: puts `msg_id`, left `injecting` by a previous run, back on its queue,
    /// where it keeps its place: the pane showed it was never typed. Only that proof may move
    /// a task back (typing a task twice is what `injecting` is there to prevent); returns
    /// whether it was still `injecting`.
    fn put_back_untyped(&self, msg_id: MsgId) -> StoreResult<bool>;

    /// At start-up: fails every message a previous run left `injecting` with `interrupted`
    /// (what the pane could not settle: see `fleet_mux::interrupted`) and
    /// every one it left `queued` for a recipient not among `kept` (the sessions this start
    /// took back) with `orphaned`; returns them so their senders can be told.
    fn fail_leftovers(
        &self,
        interrupted: &str,
        orphaned: &str,
        kept: &[Gid],
    ) -> StoreResult<Vec<Message>>;

    /// Records what worker `gid`'s session is known by, for a restart to take it back
    /// (`facts`, a document of fleetd's), as of `since_ms`; replaces what was recorded. The
    /// record goes when the entity does.
    fn put_adoptable(&self, gid: Gid, facts: &str, since_ms: i64) -> StoreResult<()>;

    /// What [`Store::put_adoptable`] recorded for `gid`, and as of when.
    fn adoptable(&self, gid: Gid) -> StoreResult<Option<(String, i64)>>;

    /// How many tasks (`SEND`s) were typed into or handed to `to` since `since_ms`.
    fn tasks_taken(&self, to: Gid, since_ms: i64) -> StoreResult<u64>;

    /// When the gateway was last seen alive (its last [`Store::probe_write`]), if ever.
    fn last_alive_ms(&self) -> StoreResult<Option<i64>>;

    /// Records the pane lead `gid` named last: `pane`, on the tmux server at `socket` whose pid
    /// is `server`; replaces what was recorded.
    fn put_lead_pane(&self, gid: Gid, pane: &str, socket: &str, server: u32) -> StoreResult<()>;

    /// Forgets the pane lead `gid` named last (it was found gone).
    fn forget_lead_pane(&self, gid: Gid) -> StoreResult<()>;

    /// The pane lead `gid` named last, its tmux server's socket and pid, if it ever named one.
    fn lead_pane(&self, gid: Gid) -> StoreResult<Option<(String, String, u32)>>;

    /// The tasks (`SEND`s) typed into or handed to `to` that nothing answers yet: no reply and
    /// no failure notice names them, here or (see [`Store::answered_elsewhere`]) on another host.
    fn unanswered_tasks_to(&self, to: Gid) -> StoreResult<Vec<Message>>;

    /// Notes that task `msg_id` was answered by a message that went to another host (the
    /// broker took it; no copy is stored here): its reply (`by_reply`), or a failure notice.
    /// Idempotent (a reply noted stays noted); the note goes with the task.
    fn answered_elsewhere(&self, msg_id: MsgId, by_reply: bool) -> StoreResult<()>;

    /// Puts consumed messages back to `held`: the call that took them ended before its answer
    /// could reach the client. Only for messages this process just handed out.
    fn release(&self, msg_ids: &[MsgId]) -> StoreResult<()>;

    /// Records that each `(msg_id, owner, until_ms)` came off the broker for `owner`, to be
    /// remembered until `until_ms` (Unix ms), in one transaction; for each, whether it had been
    /// seen before (a replay, or the broker delivering it again).
    fn see(&self, arrivals: &[(MsgId, Gid, i64)]) -> StoreResult<Vec<bool>>;

    /// Records each message published to an entity on another host (see [`SentRecord`]).
    fn record_sent(&self, sent: &[SentRecord]) -> StoreResult<()>;

    /// For each `(msg_id, host)`: from whom and to whom `msg_id` was published to `host`, if
    /// it was.
    fn sent_to(&self, asked: &[(MsgId, String)]) -> StoreResult<Vec<Option<SentBetween>>>;

    /// Every record of `msg_ids` being published, whatever host it went to: `(id, from, to)`,
    /// `to` none for a broadcast's own id.
    fn sent_records(&self, msg_ids: &[MsgId]) -> StoreResult<Vec<(MsgId, Gid, Option<Gid>)>>;

    /// The newest `limit` broadcasts this gateway published (those recorded under the host
    /// `*`), with their senders.
    fn recent_broadcasts(&self, limit: usize) -> StoreResult<Vec<(MsgId, Gid)>>;

    /// Keeps `message` (a notice for another host) until the broker can take it; kept once.
    fn put_outbox(&self, message: &Message, now_ms: i64) -> StoreResult<()>;

    /// What waits for the broker, oldest first.
    fn outbox(&self) -> StoreResult<Vec<Message>>;

    /// `msg_id` was published (or cannot be, ever): it leaves the outbox.
    fn outbox_sent(&self, msg_id: MsgId) -> StoreResult<()>;

    /// Records a brief published to a remote worker whose `INJECTED` receipt is awaited.
    fn await_receipt(&self, brief: &AwaitedReceipt) -> StoreResult<()>;

    /// Stops awaiting the receipts of `msg_ids` (come, overdue, or not published after all).
    fn receipts_settled(&self, msg_ids: &[MsgId]) -> StoreResult<()>;

    /// Every brief whose receipt is still awaited.
    fn awaited_receipts(&self) -> StoreResult<Vec<AwaitedReceipt>>;

    /// Records that the coordination message `msg_id` came from the lead whose coordination id
    /// is `coord_id` (before the message is held; kept once): kept as long as the message is,
    /// and at least until `until_ms` (Unix ms) if the message never is.
    fn note_coord_sender(&self, msg_id: MsgId, coord_id: &str, until_ms: i64) -> StoreResult<()>;

    /// The coordination id the coordination message `msg_id` came from; none for any other
    /// message.
    fn coord_sender(&self, msg_id: MsgId) -> StoreResult<Option<String>>;

    /// Forgets what [`Store::see`] and [`Store::record_sent`] remembered until before
    /// `now_ms`, and the coordination senders noted until before `now_ms` of messages never
    /// held (refused at their cap); returns how many.
    fn forget(&self, now_ms: i64) -> StoreResult<usize>;

    /// Deletes messages that reached the end of their life (`injected`, `consumed`, `failed`)
    /// before `before_ms` (Unix ms); returns how many.
    fn prune(&self, before_ms: i64) -> StoreResult<usize>;

    /// The changes recorded after `after_seq`, oldest first, at most `limit`.
    fn changes_since(&self, after_seq: i64, limit: usize) -> StoreResult<Vec<Change>>;

    /// The `seq` of the newest change recorded (0 for none): a feed that starts now reads on
    /// from it.
    fn last_change(&self) -> StoreResult<i64>;

    /// Every change of one message's state, oldest first (empty for no such message).
    fn history(&self, msg_id: MsgId) -> StoreResult<Vec<Change>>;

    /// Takes a write committed as every other write is: `Ok` proves the store can still take
    /// writes now (its disk, its file, its lock), for the health check. What it writes is
    /// the time, read back by [`Store::last_alive_ms`].
    fn probe_write(&self) -> StoreResult<()>;
}
