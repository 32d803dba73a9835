//! The domain error: a stable code a program can branch on plus a sentence a model can act on.
//! The mapping of codes onto MCP, HTTP and AMQP outcomes lives in one module of the daemon.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A stable error code. Its text form never changes once released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A parameter is missing, malformed or out of range.
    InvalidParams,
    /// The recipient (by gid or name) is not in the roster.
    UnknownRecipient,
    /// The profile named in a spawn is not configured.
    UnknownProfile,
    /// A spawned worker did not become ready in time.
    NotReady,
    /// The caller's role may not do this.
    Forbidden,
    /// A message is larger than the configured limit.
    TooLarge,
    /// A wait ran out.
    Timeout,
    /// The caller cancelled the call.
    Cancelled,
    /// The recipient exists but can no longer take messages.
    Gone,
    /// A remote recipient while the broker cannot be reached.
    BrokerUnavailable,
    /// The pane host (tmux, herdr) failed.
    PaneHost,
    /// Something inside fleetd failed; the message says what.
    Internal,
    /// A worker's ask found no lead waiting in a fleet call (asks are live only).
    NoWaiter,
    /// An answer came after the ask it answers was over; it was not delivered.
    TooLate,
    /// A dialog's answer did not take: its menu's cursor did not reach the option (Enter was
    /// not pressed), or the dialog stayed on the screen after its key.
    NotPressed,
    /// A cap on how many was reached (messages waiting for one recipient, one caller's long
    /// calls, one token's sessions): the message names the cap and its config key.
    TooMany,
}

impl ErrorCode {
    /// The code's stable text.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidParams => "invalid_params",
            ErrorCode::UnknownRecipient => "unknown_recipient",
            ErrorCode::UnknownProfile => "unknown_profile",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Gone => "gone",
            ErrorCode::BrokerUnavailable => "broker_unavailable",
            ErrorCode::PaneHost => "pane_host",
            ErrorCode::Internal => "internal",
            ErrorCode::NoWaiter => "no_waiter",
            ErrorCode::TooLate => "too_late",
            ErrorCode::NotPressed => "not_pressed",
            ErrorCode::TooMany => "too_many",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A domain error: what went wrong, as a code and a sentence.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct FleetError {
    /// The stable code.
    pub code: ErrorCode,
    /// A sentence naming what is wrong and, where possible, what to do instead.
    pub message: String,
}

impl FleetError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An `invalid_params` error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParams, message)
    }

    /// A `forbidden` error.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }

    /// An `internal` error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_code_then_sentence() {
        let err = FleetError::forbidden("workers may not spawn");
        assert_eq!(err.to_string(), "forbidden: workers may not spawn");
        assert_eq!(
            serde_json::to_string(&ErrorCode::UnknownRecipient).unwrap(),
            "\"unknown_recipient\""
        );
    }
}
