//! The trust checks on what comes off the broker, in the order `fleet_core::trust` gives
//! them: the facts each rule needs are looked up here (this host's registry, the roster, the
//! store), the rules decide, and a refusal is dead-lettered with a loud log line and an audit
//! line `refused: <reason>`. Nothing a message says is acted on — no notice sent, no name
//! remembered — before it passed. The gateway carries on.

use std::time::Duration;

use fleet_amqp::Delivery;
use fleet_core::clock::now_ms;
use fleet_core::envelope::Envelope;
use fleet_core::signing::{KEY_ID_HEADER, SIG_HEADER};
use fleet_core::trust::{Refusal, Seal, Trust, Window, check_seal};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Federation;
use crate::config::FederationConfig;

/// The most heartbeat senders whose last stamp is remembered (a pinned host could otherwise
/// grow the map by announcing ever new entities); past it, a new one is taken unremembered.
pub(super) const MAX_HEARTBEAT_SENDERS: usize = 100_000;
/// How many of this gateway's newest broadcasts an answer about a broadcast's copy is matched
/// against (a copy's id is derived from the broadcast's and its recipient's).
pub(super) const RECENT_BROADCASTS: usize = 1_000;
/// Refusals logged one by one before the log is thinned out to powers of two.
pub(super) const LOGGED_IN_FULL: u64 = 16;

/// A message off an inbox that passed the checks made one by one, waiting for those made
/// against the store for the whole batch.
pub(super) struct Vouched {
    pub(super) delivery: Delivery,
    pub(super) envelope: Envelope,
    pub(super) body: String,
}

/// How long the checks of one batch may wait for senders not yet announced, and what stops
/// the wait early.
pub(super) struct Patience<'a> {
    /// When the waiting ends for the whole batch.
    pub(super) until: Instant,
    /// The consumer's stop.
    pub(super) stop: &'a CancellationToken,
}

/// Whether `delivery`, carrying `envelope`, is sealed by a key `trust` pins for the host it
/// names (and came with that host's broker login, where one is pinned): for a look from
/// outside a gateway (`fleetd doctor`).
pub fn sealed(trust: &Trust, envelope: &Envelope, delivery: &Delivery) -> bool {
    check_seal(trust, envelope, delivery.body(), seal_of(delivery)).is_ok()
}

/// The signature headers and the broker login of `delivery`.
pub(in crate::gateway) fn seal_of(delivery: &Delivery) -> Seal<'_> {
    Seal {
        sig: delivery.text_header(SIG_HEADER),
        key_id: delivery.text_header(KEY_ID_HEADER),
        login: delivery.login(),
    }
}

/// Whether the `count`th line about something refused is written: the first few, then at
/// powers of two (a flood of forgeries cannot flood the log).
pub(in crate::gateway) fn loud(count: u64) -> bool {
    count <= LOGGED_IN_FULL || count.is_power_of_two()
}

/// The window messages off the broker are judged by, as `config` sets it.
pub(in crate::gateway) fn message_window(config: &FederationConfig) -> Window {
    Window {
        skew_ms: config.clock_skew_s.saturating_mul(1000),
        max_age_ms: config.max_message_age_s.saturating_mul(1000),
    }
}

/// Until when (Unix ms) the id of a message stamped `ts_ms` is remembered: as long as it could
/// pass [`check_time`] in `config`'s window.
pub(in crate::gateway) fn remember_until(config: &FederationConfig, ts_ms: u64) -> i64 {
    let window = message_window(config);
    let until = ts_ms
        .saturating_add(window.max_age_ms)
        .saturating_add(window.skew_ms);
    i64::try_from(until).unwrap_or(i64::MAX)
}

impl Federation {
    /// Check 1, unless this gateway was told to take unsigned messages (a lab).
    pub(super) fn check_seal(
        &self,
        envelope: &Envelope,
        delivery: &Delivery,
    ) -> Result<(), Refusal> {
        if self.config.insecure_unsigned {
            return Ok(());
        }
        check_seal(&self.trust, envelope, delivery.body(), seal_of(delivery))
    }

    /// Whether `delivery` under `envelope` is sealed by this gateway itself: its own key and
    /// broker login (whatever `insecure_unsigned` says: this gateway signs all it publishes).
    pub(super) fn check_own_seal(
        &self,
        envelope: &Envelope,
        delivery: &Delivery,
    ) -> Result<(), Refusal> {
        check_seal(&self.trust, envelope, delivery.body(), seal_of(delivery))
    }

    pub(super) fn skew_ms(&self) -> u64 {
        self.config.clock_skew_s.saturating_mul(1000)
    }

    /// The window messages on an inbox are judged by.
    pub(super) fn message_window(&self) -> Window {
        message_window(&self.config)
    }

    /// The window heartbeats are judged by: one older than the roster keeps an entry is no
    /// news.
    pub(super) fn heartbeat_window(&self) -> Window {
        Window {
            skew_ms: self.skew_ms(),
            max_age_ms: self
                .config
                .presence_ttl_s
                .saturating_add(self.config.clock_skew_s)
                .saturating_mul(1000),
        }
    }

    /// Until when (Unix ms) the id of a message stamped `ts_ms` is remembered: as long as it
    /// could pass [`check_time`].
    pub(super) fn remember_until(&self, ts_ms: u64) -> i64 {
        remember_until(&self.config, ts_ms)
    }

    /// How long a batch may wait for senders not yet announced: until a heartbeat could have
    /// told (`presence_ttl_s`).
    pub(super) fn patience(&self) -> Duration {
        Duration::from_secs(self.config.presence_ttl_s)
    }

    /// Counts a line about something refused; whether to write it (the first few, then at
    /// powers of two: a flood of forgeries cannot flood the log), and the count.
    pub(super) fn loud(&self) -> (bool, u64) {
        let mut state = self.lock();
        state.refused += 1;
        let count = state.refused;
        (loud(count), count)
    }
}

/// Forgets the last heartbeat stamps old enough that a heartbeat stamped so would be refused
/// as stale anyway.
pub(super) fn forget_heartbeats(fed: &Federation) {
    let now = u64::try_from(now_ms()).unwrap_or(0);
    let window = fed.heartbeat_window();
    let oldest = now.saturating_sub(window.max_age_ms.saturating_add(window.skew_ms));
    fed.lock()
        .heartbeats_last
        .retain(|_, (ts, _)| *ts >= oldest);
}
