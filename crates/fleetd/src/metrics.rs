//! Prometheus metrics, served at `GET /metrics` in the OpenMetrics text format: counts and
//! timings only. No message text and nothing a message holds ever becomes a label; the only
//! names are entities' names (validated at spawn or in config) and fleetd's own words.
//!
//! Counters and histograms are bumped as things happen; the gauges (sessions by status,
//! messages by kind and state, what waits for each recipient, hosts up) are set from a
//! [`Snapshot`] the gateway takes at each scrape.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use fleet_core::Kind;
use fleet_core::dead::Cause;
use fleet_core::delivery::Placement;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// The content type of what [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of a message accepted into the local plane.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Accepted {
    kind: &'static str,
    placement: &'static str,
}

/// A label naming how something ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

/// Labels of a dead letter off the broker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Dead {
    cause: &'static str,
    outcome: &'static str,
}

/// Who was nudged.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Nudged {
    role: &'static str,
}

/// A session status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Status {
    status: String,
}

/// A message kind and state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindState {
    kind: String,
    state: String,
}

/// A recipient and the state of what waits for it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Waiting {
    recipient: String,
    state: String,
}

/// How typing a task into a pane ended, for [`Metrics::injected`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectEnd {
    /// Submitted at the first Enter.
    Submitted,
    /// Submitted at the second Enter.
    Retried,
    /// Not seen submitted.
    NotSubmitted,
    /// Not typed: the input box held something.
    InputNotEmpty,
    /// The pane host failed.
    PaneHostError,
    /// Not typed: the store could not note that it was being typed.
    StoreError,
}

impl InjectEnd {
    fn label(self) -> &'static str {
        match self {
            InjectEnd::Submitted => "submitted",
            InjectEnd::Retried => "submitted_on_retry",
            InjectEnd::NotSubmitted => "not_submitted",
            InjectEnd::InputNotEmpty => "input_not_empty",
            InjectEnd::PaneHostError => "pane_host_error",
            InjectEnd::StoreError => "store_error",
        }
    }
}

/// A tool call: which tool (one of fleetd's, or `other`), and which way it was answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolCall {
    tool: &'static str,
    served: &'static str,
}

/// Which way a tool call was answered, for [`Metrics::tool_called`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// By fleetd itself, without rmcp's service: a plain stateless call (see
    /// `crate::mcp::direct`).
    Direct,
    /// By rmcp's per-request service: every other call.
    Rmcp,
}

/// Why the listener closed a connection (or refused one), as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Why {
    why: &'static str,
}

/// What the listener has done since start (see [`crate::listener::ListenerStats`]), taken at a
/// scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionFigures {
    /// Connections held now.
    pub open: u64,
    /// Connections taken in.
    pub accepted: u64,
    /// Closed: the first request's head did not come in time.
    pub header_timeouts: u64,
    /// Closed: idle between requests, or a later head too slow.
    pub idle_timeouts: u64,
    /// Closed: not authenticated within its lifetime.
    pub stranger_timeouts: u64,
    /// Closed to make room for a newer connection.
    pub evicted: u64,
    /// Refused `503`: every connection held had authenticated.
    pub refused: u64,
    /// Accepts that failed.
    pub accept_errors: u64,
}

/// What the gauges show, taken at a scrape.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Pane sessions by status (every status, zeros included).
    pub sessions: Vec<(String, i64)>,
    /// Stored messages by kind and state.
    pub messages: Vec<(String, String, i64)>,
    /// Messages waiting for a recipient (by name): held, or queued to be typed or pulled.
    pub waiting: Vec<(String, String, i64)>,
    /// Gateways up: this one and those the roster hears from.
    pub hosts_up: i64,
    /// Other hosts' entities the roster holds (heard or unreachable).
    pub remote_entities: i64,
    /// What the listener has done.
    pub connections: ConnectionFigures,
}

/// The metrics of one gateway.
pub struct Metrics {
    registry: Registry,
    accepted: Family<Accepted, Counter>,
    injects: Family<Outcome, Counter>,
    inject_seconds: Histogram,
    publish_seconds: Histogram,
    dead_letters: Family<Dead, Counter>,
    asks: Counter,
    /// Heartbeats from other hosts that came too late to be taken (held up by a partition).
    heartbeats_late: Counter,
    nudges: Family<Nudged, Counter>,
    tool_calls: Family<ToolCall, Counter>,
    sessions: Family<Status, Gauge>,
    messages: Family<KindState, Gauge>,
    waiting: Family<Waiting, Gauge>,
    hosts_up: Gauge,
    remote_entities: Gauge,
    /// Log lines lost (stderr gone): follows [`crate::logs::write_failures`] at each scrape.
    log_write_failures: Counter,
    /// Connections held now.
    connections_open: Gauge,
    /// Connections taken in (follows the listener's count).
    connections_accepted: Counter,
    /// Connections the listener closed or refused, by why (follow its counts).
    connections_ended: Family<Why, Counter>,
    /// Failed accepts (follows the listener's count).
    accept_errors: Counter,
    /// One scrape sets the gauges and encodes at a time.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric, registered under the `fleetd_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fleetd");
        registry.register(
            "build",
            "The fleetd build",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let metrics = Self {
            accepted: Family::default(),
            injects: Family::default(),
            // 5 ms to about 20 s.
            inject_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 13)),
            // 0.5 ms to about 2 s.
            publish_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 13)),
            dead_letters: Family::default(),
            asks: Counter::default(),
            heartbeats_late: Counter::default(),
            nudges: Family::default(),
            tool_calls: Family::default(),
            sessions: Family::default(),
            messages: Family::default(),
            waiting: Family::default(),
            hosts_up: Gauge::default(),
            remote_entities: Gauge::default(),
            log_write_failures: Counter::default(),
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            connections_ended: Family::default(),
            accept_errors: Counter::default(),
            scrape: Mutex::new(()),
            registry: Registry::default(),
        };
        metrics.register_traffic(&mut registry);
        metrics.register_state(&mut registry);
        Self {
            registry,
            ..metrics
        }
    }

    /// Registers what counts the traffic: messages accepted, typed in, published, dead-lettered,
    /// asked about, nudged for, and heartbeats that came late.
    fn register_traffic(&self, registry: &mut Registry) {
        registry.register(
            "messages_accepted",
            "Messages accepted into this gateway's plane, by kind and where they went",
            self.accepted.clone(),
        );
        registry.register(
            "injects",
            "Tasks typed into panes, by how the submit went",
            self.injects.clone(),
        );
        registry.register_with_unit(
            "inject_duration",
            "Time to type a task into a pane and see it submitted",
            Unit::Seconds,
            self.inject_seconds.clone(),
        );
        registry.register_with_unit(
            "broker_publish_duration",
            "Time from publishing to the broker to its confirm",
            Unit::Seconds,
            self.publish_seconds.clone(),
        );
        registry.register(
            "dead_letters",
            "Dead letters off the broker, by cause and whether their sender was told",
            self.dead_letters.clone(),
        );
        registry.register(
            "asks",
            "Questions workers asked their leads mid-task",
            self.asks.clone(),
        );
        registry.register(
            "heartbeats_late",
            "Heartbeats from other hosts dropped for coming too late (they sat out a partition): genuine, not forged",
            self.heartbeats_late.clone(),
        );
        registry.register(
            "nudges",
            "Nudges typed to pull waiting messages, by the role nudged",
            self.nudges.clone(),
        );
        registry.register(
            "tool_calls",
            "MCP tool calls, by tool and by which way they were answered (direct: by fleetd itself; rmcp: by its per-request service)",
            self.tool_calls.clone(),
        );
    }

    /// Registers what shows the state: sessions, messages held, hosts up, the listener's
    /// connections, and lost log lines.
    fn register_state(&self, registry: &mut Registry) {
        registry.register(
            "sessions",
            "Pane sessions (workers, architects) by status",
            self.sessions.clone(),
        );
        registry.register(
            "messages",
            "Messages in the store, by kind and state",
            self.messages.clone(),
        );
        registry.register(
            "waiting_messages",
            "Messages waiting for a recipient, held or queued",
            self.waiting.clone(),
        );
        registry.register(
            "hosts_up",
            "Gateways up: this one and those the roster hears from",
            self.hosts_up.clone(),
        );
        registry.register(
            "remote_entities",
            "Other hosts' entities the roster holds, heard or unreachable",
            self.remote_entities.clone(),
        );
        registry.register(
            "log_write_failures",
            "Log lines fleetd could not write (its stderr gone): dropped, never fatal",
            self.log_write_failures.clone(),
        );
        registry.register(
            "connections_open",
            "HTTP connections held now",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_accepted",
            "HTTP connections taken in",
            self.connections_accepted.clone(),
        );
        registry.register(
            "connections_closed",
            "HTTP connections the listener closed (header or idle timeout, not authenticated in time, evicted for a newer one) or refused (503, every one held authenticated), by why",
            self.connections_ended.clone(),
        );
        registry.register(
            "accept_errors",
            "Accepts that failed (out of descriptors): the listener backs off",
            self.accept_errors.clone(),
        );
    }

    /// A message of `kind` accepted, and where it went.
    pub fn accepted(&self, kind: Kind, placement: Placement) {
        let placement = match placement {
            Placement::Hold => "hold",
            Placement::Queue => "queue",
            Placement::Dead => "dead",
            Placement::Remote => "remote",
        };
        self.accepted
            .get_or_create(&Accepted {
                kind: kind.as_str(),
                placement,
            })
            .inc();
    }

    /// A task typed into a pane, ended as `end` after `took`.
    pub fn injected(&self, end: InjectEnd, took: Duration) {
        self.injects
            .get_or_create(&Outcome {
                outcome: end.label(),
            })
            .inc();
        self.inject_seconds.observe(took.as_secs_f64());
    }

    /// A publish to the broker confirmed (or refused) after `took`.
    pub fn published(&self, took: Duration) {
        self.publish_seconds.observe(took.as_secs_f64());
    }

    /// A dead letter of `cause`; `told`: its sender was told, else it was dropped.
    pub fn dead_letter(&self, cause: Cause, told: bool) {
        let cause = match cause {
            Cause::Expired => "expired",
            Cause::MaxLen => "maxlen",
            Cause::Rejected => "rejected",
            Cause::DeliveryLimit => "delivery_limit",
            Cause::Unknown => "unknown",
        };
        let outcome = if told { "told" } else { "dropped" };
        self.dead_letters
            .get_or_create(&Dead { cause, outcome })
            .inc();
    }

    /// A worker asked its lead.
    pub fn asked(&self) {
        self.asks.inc();
    }

    /// A genuine heartbeat from another host came too late to be taken.
    pub fn heartbeat_late(&self) {
        self.heartbeats_late.inc();
    }

    /// An entity of `role` nudged.
    pub fn nudged(&self, role: &'static str) {
        self.nudges.get_or_create(&Nudged { role }).inc();
    }

    /// A call of the tool named `tool` (any name a caller sent: counted under `other` unless
    /// it is one of fleetd's), answered the way `served` says.
    pub fn tool_called(&self, tool: &str, served: Served) {
        let tool = crate::mcp::TOOLS
            .iter()
            .copied()
            .find(|known| *known == tool)
            .unwrap_or("other");
        let served = match served {
            Served::Direct => "direct",
            Served::Rmcp => "rmcp",
        };
        self.tool_calls
            .get_or_create(&ToolCall { tool, served })
            .inc();
    }

    /// Brings the connection figures up to `figures`.
    fn follow_connections(&self, figures: &ConnectionFigures) {
        self.connections_open
            .set(i64::try_from(figures.open).unwrap_or(i64::MAX));
        follow(&self.connections_accepted, figures.accepted);
        follow(&self.accept_errors, figures.accept_errors);
        for (why, count) in [
            ("header_timeout", figures.header_timeouts),
            ("idle_timeout", figures.idle_timeouts),
            ("unauthenticated_timeout", figures.stranger_timeouts),
            ("evicted", figures.evicted),
            ("refused", figures.refused),
        ] {
            follow(&self.connections_ended.get_or_create(&Why { why }), count);
        }
    }

    /// Every metric in the OpenMetrics text format, the gauges set from `snapshot`.
    pub fn render(&self, snapshot: &Snapshot) -> Result<String, fmt::Error> {
        let _one = self.scrape.lock().map_err(|_| fmt::Error)?;
        self.sessions.clear();
        for (status, count) in &snapshot.sessions {
            self.sessions
                .get_or_create(&Status {
                    status: status.clone(),
                })
                .set(*count);
        }
        self.messages.clear();
        for (kind, state, count) in &snapshot.messages {
            self.messages
                .get_or_create(&KindState {
                    kind: kind.clone(),
                    state: state.clone(),
                })
                .set(*count);
        }
        self.waiting.clear();
        for (recipient, state, count) in &snapshot.waiting {
            self.waiting
                .get_or_create(&Waiting {
                    recipient: recipient.clone(),
                    state: state.clone(),
                })
                .set(*count);
        }
        self.hosts_up.set(snapshot.hosts_up);
        self.remote_entities.set(snapshot.remote_entities);
        follow(&self.log_write_failures, crate::logs::write_failures());
        self.follow_connections(&snapshot.connections);
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Brings `counter` up to `count`, a count kept elsewhere (a counter only goes up: a count
/// below what it shows changes nothing).
fn follow(counter: &Counter, count: u64) {
    let shown = counter.get();
    if count > shown {
        counter.inc_by(count - shown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_follow_the_naming_rules_and_carry_counts_only() {
        let metrics = Metrics::new();
        metrics.accepted(Kind::Send, Placement::Queue);
        metrics.injected(InjectEnd::Retried, Duration::from_millis(40));
        metrics.dead_letter(Cause::MaxLen, true);
        metrics.published(Duration::from_millis(2));
        metrics.asked();
        metrics.nudged("architect");
        let snapshot = Snapshot {
            sessions: vec![("idle".into(), 2), ("busy".into(), 0)],
            messages: vec![("SEND".into(), "injected".into(), 3)],
            waiting: vec![("alice".into(), "held".into(), 1)],
            hosts_up: 1,
            remote_entities: 7,
            connections: ConnectionFigures {
                open: 3,
                accepted: 40,
                header_timeouts: 5,
                idle_timeouts: 6,
                stranger_timeouts: 10,
                evicted: 7,
                refused: 8,
                accept_errors: 9,
            },
        };
        let text = metrics.render(&snapshot).unwrap();
        for line in [
            "fleetd_build_info{version=\"",
            "fleetd_messages_accepted_total{kind=\"SEND\",placement=\"queue\"} 1",
            "fleetd_injects_total{outcome=\"submitted_on_retry\"} 1",
            "# UNIT fleetd_inject_duration_seconds seconds",
            "fleetd_inject_duration_seconds_count 1",
            "fleetd_broker_publish_duration_seconds_count 1",
            "fleetd_dead_letters_total{cause=\"maxlen\",outcome=\"told\"} 1",
            "fleetd_asks_total 1",
            "fleetd_nudges_total{role=\"architect\"} 1",
            "fleetd_sessions{status=\"idle\"} 2",
            "fleetd_sessions{status=\"busy\"} 0",
            "fleetd_messages{kind=\"SEND\",state=\"injected\"} 3",
            "fleetd_waiting_messages{recipient=\"alice\",state=\"held\"} 1",
            "fleetd_hosts_up 1",
            "fleetd_remote_entities 7",
            "# TYPE fleetd_log_write_failures counter",
            "fleetd_log_write_failures_total ",
            "fleetd_connections_open 3",
            "fleetd_connections_accepted_total 40",
            "fleetd_connections_closed_total{why=\"header_timeout\"} 5",
            "fleetd_connections_closed_total{why=\"idle_timeout\"} 6",
            "fleetd_connections_closed_total{why=\"unauthenticated_timeout\"} 10",
            "fleetd_connections_closed_total{why=\"evicted\"} 7",
            "fleetd_connections_closed_total{why=\"refused\"} 8",
            "fleetd_accept_errors_total 9",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        // A recipient gone since the last scrape is gone from the next.
        let text = metrics.render(&Snapshot::default()).unwrap();
        assert!(!text.contains("recipient=\"alice\""), "{text}");
    }

    #[test]
    fn lost_log_lines_are_counted_up_to_the_process_count() {
        let metrics = Metrics::new();
        follow(&metrics.log_write_failures, 3);
        follow(&metrics.log_write_failures, 5);
        follow(&metrics.log_write_failures, 4);
        assert_eq!(metrics.log_write_failures.get(), 5);
        let text = metrics.render(&Snapshot::default()).unwrap();
        // At least the 5 seen here (the process's own count may be higher: other tests log).
        let shown: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("fleetd_log_write_failures_total "))
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(shown >= 5, "{text}");
    }
}
