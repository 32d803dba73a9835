//! The names and shapes of the federated plane on the broker (spec 10 §3): the shared
//! exchanges, the dead letters, the per-entity inboxes and their arguments, the roster queues,
//! and what changes with the queues' type (classic on one node, quorum replicated across a
//! cluster). Pure: names and tables, no I/O.

use fleet_core::Gid;

use crate::table::{Table, clamp_i64};

/// Entity → entity messages and broadcasts; routing key = recipient gid or `broadcast.*`.
pub const MSG_EXCHANGE: &str = "fleet.msg";
/// Presence heartbeats; routing key = `roster.<host>.<gid>`.
pub const ROSTER_EXCHANGE: &str = "fleet.roster";
/// Cross-host control (spawn, stop); routing key = host id.
pub const CONTROL_EXCHANGE: &str = "fleet.control";
/// Where inboxes dead-letter to.
pub const DEAD_LETTER_EXCHANGE: &str = "fleet.dlx";
/// The capped queue behind [`DEAD_LETTER_EXCHANGE`]: every dead letter, the operators' record.
pub const DEAD_LETTER_QUEUE: &str = "fleet.dlq";
/// A headers exchange bound to [`DEAD_LETTER_EXCHANGE`]: it sorts the dead letters by their
/// `fromHost` header into each sending host's [`dead_letter_queue`].
pub const DEAD_EXCHANGE: &str = "fleet.dead";
/// The broadcast key every worker inbox is bound to.
pub const BROADCAST_ALL: &str = "broadcast.all";

/// The inbox queue of entity `gid` (`.v2`: recipient-keyed, spec 10 §3).
pub fn inbox_queue(gid: Gid) -> String {
    format!("agent.{gid}.inbox.v2")
}

/// The entity whose inbox `queue` is (`agent.<gid>.inbox.v2`), if it is one.
pub fn inbox_owner(queue: &str) -> Option<Gid> {
    let gid: Gid = queue
        .strip_prefix("agent.")?
        .strip_suffix(".inbox.v2")?
        .parse()
        .ok()?;
    (inbox_queue(gid) == queue).then_some(gid)
}

/// The durable mailbox of the lead whose coordination id is `coord_id`, on the coordinator's
/// vhost (spec 10 "Lead-to-lead"): published to through the default exchange, whose routing key
/// is the queue's name.
pub fn mailbox_queue(coord_id: &str) -> String {
    format!("coord.{coord_id}")
}

/// The queue of the dead letters `host` published: its gateway tells their senders.
pub fn dead_letter_queue(host: &str) -> String {
    format!("{DEAD_LETTER_QUEUE}.{host}")
}

/// The arguments of [`dead_letter_queue`]'s binding to [`DEAD_EXCHANGE`]: the messages whose
/// `fromHost` header is `host`.
pub fn dead_letter_binding(host: &str) -> Table {
    Table::new().with("x-match", "all").with("fromHost", host)
}

/// The broadcast key of `group`.
pub fn broadcast_key(group: &str) -> String {
    format!("broadcast.{group}")
}

/// This host's roster queue.
pub fn roster_queue(host: &str) -> String {
    format!("roster.{host}")
}

/// This host's control queue: the spawns and stops other hosts ask of it (spec 10 §4).
pub fn control_queue(host: &str) -> String {
    format!("control.{host}")
}

/// The roster routing key of `who` (a gid, or `_gateway` for the host entry) on `host`.
pub fn roster_key(host: &str, who: &str) -> String {
    format!("roster.{host}.{who}")
}

/// The routing key of a heartbeat of roster key `key` addressed to host `to` alone (a whole
/// account it asked for): only `to`'s roster queue is bound to it ([`addressed_binding`]).
pub fn addressed_key(to: &str, key: &str) -> String {
    format!("to.{to}.{key}")
}

/// The binding of `host`'s roster queue for the heartbeats addressed to it alone.
pub fn addressed_binding(host: &str) -> String {
    format!("to.{host}.#")
}

/// The roster key a heartbeat delivered to `host`'s roster queue under `routing_key` carries:
/// itself, or the key within one addressed to `host`. `None` for one addressed to another
/// host (whose id begins with `host`'s and a dot, so its key matched the binding too).
pub fn roster_key_of<'a>(routing_key: &'a str, host: &str) -> Option<&'a str> {
    match routing_key.strip_prefix("to.") {
        None => Some(routing_key),
        Some(rest) => rest
            .strip_prefix(host)
            .and_then(|rest| rest.strip_prefix('.'))
            .filter(|key| key.starts_with("roster.")),
    }
}

/// The type of the durable queues a gateway consumes (inboxes, control and dead-letter queues):
/// one setting for the whole fleet, as the broker refuses a queue declared again otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueType {
    /// A classic queue: its messages live on the one node that holds it (lost with that node's
    /// disk), and the broker enforces exclusive consumers.
    #[default]
    Classic,
    /// A quorum queue (RabbitMQ 3.8+): replicated by Raft on a majority of the cluster's nodes,
    /// so it outlives the loss of a minority of them. On RabbitMQ 3.10 it does not enforce
    /// exclusive consumers and has no `reject-publish-dlx` (see [`inbox_args`]).
    Quorum,
}

impl QueueType {
    /// The name the config and the broker's `x-queue-type` use.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        }
    }

    /// The type named `name` (`classic` or `quorum`).
    pub fn parse(name: &str) -> Option<QueueType> {
        match name {
            "classic" => Some(QueueType::Classic),
            "quorum" => Some(QueueType::Quorum),
            _ => None,
        }
    }

    /// Whether the broker enforces an exclusive consumer on a queue of this type; where it does
    /// not, a gateway holds the queue's [`lock_queue`] while it consumes it.
    pub fn exclusive_consumers(self) -> bool {
        self == QueueType::Classic
    }

    /// `args` with what every consumed durable queue of this type carries: its type, and for a
    /// quorum queue a single active consumer (so that however consumers come and go, one alone
    /// gets the messages, in order) and at-least-once dead-lettering (a message expired or
    /// refused is dead-lettered once it is confirmed in the dead-letter queue, never dropped on
    /// the way), which needs the `reject-publish` overflow.
    fn consumed(self, args: Table) -> Table {
        let args = args.with("x-queue-type", self.as_str());
        match self {
            QueueType::Classic => args,
            QueueType::Quorum => args
                .with("x-single-active-consumer", true)
                .with("x-overflow", "reject-publish")
                .with("x-dead-letter-strategy", "at-least-once"),
        }
    }
}

/// The lock a gateway holds while it consumes `queue` of a type whose consumers the broker does
/// not make exclusive ([`QueueType::exclusive_consumers`]): an exclusive queue, which only one
/// connection may declare at a time and which goes with that connection (or its node), so a
/// second gateway consuming the same queue is refused loudly, as an exclusive consumer would be.
pub fn lock_queue(queue: &str) -> String {
    format!("fleet.lock.{queue}")
}

/// The arguments of a [`lock_queue`]: it holds nothing (anything published to it is dropped).
pub fn lock_args() -> Table {
    Table::new().with("x-max-length", 0)
}

/// The narrowest RabbitMQ permissions a gateway of one host needs on the fleet's vhost
/// (`rabbitmqctl set_permissions` and `set_topic_permissions`), as regular expressions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permissions {
    /// What it may declare and delete: the shared exchanges and dead-letter queue, inboxes,
    /// its own roster, control and dead-letter queues, and the locks of what it consumes
    /// ([`lock_queue`]).
    pub configure: String,
    /// What it may publish to or bind to: the message, roster and control exchanges, the dead
    /// letters (`fleet.dead` is bound to `fleet.dlx`), inboxes, and its own roster, control and
    /// dead-letter queues.
    pub write: String,
    /// What it may consume or bind from: the same, less the shared dead-letter queue.
    pub read: String,
    /// The routing keys it may publish on [`ROSTER_EXCHANGE`] (topic permission): its own
    /// host's heartbeats only (to all, or its host entry's addressed to one host).
    pub roster_write: String,
}

/// The permissions of the gateway of `host` (an id of letters, digits, `-`, `_` and `.`).
/// Inbox names carry no host (their gids are minted at spawn), so any gateway may declare any
/// inbox (and its lock): what keeps one out of another's is the exclusive consumer (or lock)
/// and the signatures. Binding
/// `fleet.dead` to `fleet.dlx` takes write on the first and read on the second; binding a queue
/// to an exchange, write on the queue and read on the exchange.
pub fn gateway_permissions(host: &str) -> Permissions {
    let host = host.replace('.', "\\.");
    let inbox = r"agent\.[0-9a-f-]{36}\.inbox\.v2";
    let own = format!(r"roster\.{host}|control\.{host}|fleet\.dlq\.{host}");
    let locks = format!(r"fleet\.lock\.({inbox}|control\.{host}|fleet\.dlq\.{host})");
    Permissions {
        configure: format!(r"^(fleet\.(msg|roster|control|dlx|dlq|dead)|{inbox}|{own}|{locks})$"),
        write: format!(r"^(fleet\.(msg|roster|control|dlx|dlq|dead)|{inbox}|{own})$"),
        read: format!(r"^(fleet\.(msg|roster|control|dlx|dead)|{inbox}|{own})$"),
        roster_write: format!(r"^(roster\.{host}\.[^.]+|to\..+\.roster\.{host}\._gateway)$"),
    }
}

/// The caps of every inbox. All gateways on a broker must agree on them: the broker refuses
/// to declare a queue again with other arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboxLimits {
    /// The most messages an inbox holds; a publish over it is refused (the publisher's confirm
    /// is a nack), and on a classic queue dead-lettered as well (`reject-publish-dlx`).
    pub max_length: u64,
    /// How long a message may wait in an inbox before it is dead-lettered, in seconds.
    pub message_ttl_s: u64,
    /// How long an inbox nobody consumes lives, in seconds.
    pub expires_s: u64,
}

/// The arguments every inbox is declared with: dead-lettered to [`DEAD_LETTER_EXCHANGE`],
/// capped at `limits.max_length`, its messages expiring, the queue itself expiring when unused,
/// of type `kind`. A publish over the cap is refused: the publisher's confirm is a nack. A
/// classic queue dead-letters the refused message too (`reject-publish-dlx`); a quorum queue on
/// RabbitMQ 3.10 has no such overflow (it would drop the oldest instead), so it only refuses
/// (`reject-publish`), and the sender, told by the nack, is the one who knows.
pub fn inbox_args(limits: &InboxLimits, kind: QueueType) -> Table {
    kind.consumed(
        Table::new()
            .with("x-dead-letter-exchange", DEAD_LETTER_EXCHANGE)
            .with("x-max-length", clamp_i64(limits.max_length))
            .with("x-overflow", "reject-publish-dlx")
            .with(
                "x-message-ttl",
                clamp_i64(limits.message_ttl_s.saturating_mul(1000)),
            )
            .with(
                "x-expires",
                clamp_i64(limits.expires_s.saturating_mul(1000)),
            ),
    )
}

/// The arguments of a roster queue: a heartbeat its gateway refuses is dead-lettered to
/// [`DEAD_LETTER_EXCHANGE`], like a refused message. Always classic: it is exclusive to its
/// gateway's connection and goes with it (presence is soft state).
pub fn roster_args() -> Table {
    Table::new().with("x-dead-letter-exchange", DEAD_LETTER_EXCHANGE)
}

/// The arguments of a control queue of type `kind`: a request its gateway refuses (or one that
/// expired before it was read) is dead-lettered to [`DEAD_LETTER_EXCHANGE`].
pub fn control_args(kind: QueueType) -> Table {
    kind.consumed(Table::new().with("x-dead-letter-exchange", DEAD_LETTER_EXCHANGE))
}

/// The arguments of [`DEAD_LETTER_QUEUE`] and of each [`dead_letter_queue`], of type `kind`:
/// capped at `max_length`, the oldest going first (`drop-head`, which both types have); a quorum
/// one has a single active consumer, as every consumed quorum queue does.
pub fn dead_letter_args(max_length: u64, kind: QueueType) -> Table {
    let args = Table::new()
        .with("x-max-length", clamp_i64(max_length))
        .with("x-queue-type", kind.as_str());
    match kind {
        QueueType::Classic => args,
        QueueType::Quorum => args.with("x-single-active-consumer", true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Field;

    #[test]
    fn queue_and_key_names_follow_the_spec() {
        let gid: Gid = "01a22d73-fb25-719f-b332-14b28da5c6c4".parse().unwrap();
        assert_eq!(
            inbox_queue(gid),
            "agent.01a22d73-fb25-719f-b332-14b28da5c6c4.inbox.v2"
        );
        assert_eq!(broadcast_key("core"), "broadcast.core");
        assert_eq!(roster_key("hostA", "_gateway"), "roster.hostA._gateway");
        assert_eq!(roster_queue("hostA"), "roster.hostA");
        assert_eq!(control_queue("hostA"), "control.hostA");
        assert_eq!(mailbox_queue("alice@laptop"), "coord.alice@laptop");
        assert_eq!(dead_letter_queue("hostA"), "fleet.dlq.hostA");
        assert_eq!(
            dead_letter_binding("hostA").get("fromHost"),
            Some(&Field::Text("hostA".into()))
        );
        assert_eq!(
            dead_letter_binding("hostA").get("x-match"),
            Some(&Field::Text("all".into()))
        );
    }

    #[test]
    fn a_heartbeat_addressed_to_a_host_reads_back_to_its_roster_key_there_only() {
        let key = roster_key("hostb", "_gateway");
        let to_a = addressed_key("hosta", &key);
        assert_eq!(to_a, "to.hosta.roster.hostb._gateway");
        assert_eq!(addressed_binding("hosta"), "to.hosta.#");
        assert_eq!(roster_key_of(&to_a, "hosta"), Some(key.as_str()));
        assert_eq!(roster_key_of(&key, "hosta"), Some(key.as_str()));
        // `to.hosta.#` also matches what is addressed to `hosta.x`: not for hosta.
        let to_ax = addressed_key("hosta.x", &key);
        assert_eq!(roster_key_of(&to_ax, "hosta"), None);
        assert_eq!(roster_key_of(&to_ax, "hosta.x"), Some(key.as_str()));
        assert_eq!(roster_key_of("to.hosta.elsewhere", "hosta"), None);
    }

    #[test]
    fn an_inbox_names_its_owner_and_nothing_else_does() {
        let gid: Gid = "01a22d73-fb25-719f-b332-14b28da5c6c4".parse().unwrap();
        assert_eq!(inbox_owner(&inbox_queue(gid)), Some(gid));
        for other in [
            "fleet.dlq",
            "roster.hostA",
            "agent.01a22d73-fb25-719f-b332-14b28da5c6c4.inbox",
            "agent.01a22d73-fb25-719f-b332-14b28da5c6c4.inbox.v2.x",
            "agent.not-a-gid.inbox.v2",
            // Another spelling of the same gid is another queue.
            "agent.01A22D73-FB25-719F-B332-14B28DA5C6C4.inbox.v2",
            "agent.{01a22d73-fb25-719f-b332-14b28da5c6c4}.inbox.v2",
            "",
        ] {
            assert_eq!(inbox_owner(other), None, "{other}");
        }
    }

    #[test]
    fn a_gateways_permissions_name_its_own_roster_control_and_dead_letters_only() {
        let p = gateway_permissions("gpu.box");
        let inbox = r"agent\.[0-9a-f-]{36}\.inbox\.v2";
        let own = r"roster\.gpu\.box|control\.gpu\.box|fleet\.dlq\.gpu\.box";
        let locks = format!(r"fleet\.lock\.({inbox}|control\.gpu\.box|fleet\.dlq\.gpu\.box)");
        assert_eq!(
            p.configure,
            format!(r"^(fleet\.(msg|roster|control|dlx|dlq|dead)|{inbox}|{own}|{locks})$")
        );
        assert_eq!(
            p.write,
            format!(r"^(fleet\.(msg|roster|control|dlx|dlq|dead)|{inbox}|{own})$")
        );
        assert_eq!(
            p.read,
            format!(r"^(fleet\.(msg|roster|control|dlx|dead)|{inbox}|{own})$")
        );
        // The last segment (a gid, or `_gateway`) holds no dot: host `gpu` cannot publish as
        // host `gpu.box`.
        assert_eq!(
            p.roster_write,
            r"^(roster\.gpu\.box\.[^.]+|to\..+\.roster\.gpu\.box\._gateway)$"
        );
        // An inbox name is a gid of 36 characters, as the pattern has it.
        let gid: Gid = "01a22d73-fb25-719f-b332-14b28da5c6c4".parse().unwrap();
        assert_eq!(gid.to_string().len(), 36);
    }

    const LIMITS: InboxLimits = InboxLimits {
        max_length: 1_000,
        message_ttl_s: 86_400,
        expires_s: u64::MAX,
    };

    fn text(args: &Table, name: &str) -> Option<String> {
        match args.get(name) {
            Some(Field::Text(t)) => Some(t.clone()),
            _ => None,
        }
    }

    #[test]
    fn inbox_arguments_are_in_milliseconds_and_never_overflow() {
        for kind in [QueueType::Classic, QueueType::Quorum] {
            let args = inbox_args(&LIMITS, kind);
            assert_eq!(args.get("x-max-length"), Some(&Field::Int(1_000)));
            assert_eq!(args.get("x-message-ttl"), Some(&Field::Int(86_400_000)));
            assert_eq!(args.get("x-expires"), Some(&Field::Int(i64::MAX)));
            assert_eq!(
                text(&args, "x-dead-letter-exchange").as_deref(),
                Some(DEAD_LETTER_EXCHANGE)
            );
            assert_eq!(text(&args, "x-queue-type").as_deref(), Some(kind.as_str()));
            assert_eq!(
                dead_letter_args(u64::MAX, kind).get("x-max-length"),
                Some(&Field::Int(i64::MAX))
            );
        }
    }

    #[test]
    fn a_classic_inbox_refuses_into_the_dead_letters_and_its_consumer_is_exclusive() {
        let args = inbox_args(&LIMITS, QueueType::Classic);
        assert_eq!(
            text(&args, "x-overflow").as_deref(),
            Some("reject-publish-dlx")
        );
        assert_eq!(args.get("x-single-active-consumer"), None);
        assert_eq!(args.get("x-dead-letter-strategy"), None);
        assert!(QueueType::Classic.exclusive_consumers());
    }

    #[test]
    fn a_quorum_queue_refuses_over_its_cap_dead_letters_at_least_once_and_has_one_consumer() {
        // RabbitMQ 3.10's quorum queues take `reject-publish-dlx` and drop the oldest instead:
        // never asked for.
        for args in [
            inbox_args(&LIMITS, QueueType::Quorum),
            control_args(QueueType::Quorum),
        ] {
            assert_eq!(text(&args, "x-overflow").as_deref(), Some("reject-publish"));
            assert_eq!(
                text(&args, "x-dead-letter-strategy").as_deref(),
                Some("at-least-once")
            );
            assert_eq!(
                args.get("x-single-active-consumer"),
                Some(&Field::Bool(true))
            );
            assert_eq!(text(&args, "x-queue-type").as_deref(), Some("quorum"));
        }
        // The dead letters keep the newest: the oldest go, as on a classic queue.
        let dead = dead_letter_args(5, QueueType::Quorum);
        assert_eq!(dead.get("x-overflow"), None);
        assert_eq!(
            dead.get("x-single-active-consumer"),
            Some(&Field::Bool(true))
        );
        // Its consumers are not exclusive: a lock stands in.
        assert!(!QueueType::Quorum.exclusive_consumers());
        assert_eq!(lock_queue("control.hostA"), "fleet.lock.control.hostA");
        assert_eq!(lock_args().get("x-max-length"), Some(&Field::Int(0)));
    }

    #[test]
    fn queue_types_are_named_as_the_broker_names_them() {
        for kind in [QueueType::Classic, QueueType::Quorum] {
            assert_eq!(QueueType::parse(kind.as_str()), Some(kind));
        }
        for other in ["", "Quorum", "stream", "classic "] {
            assert_eq!(QueueType::parse(other), None, "{other:?}");
        }
        assert_eq!(QueueType::default(), QueueType::Classic);
    }
}
