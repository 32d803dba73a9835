//! The one error of the broker link. It says what went wrong as a sentence and whether a later
//! attempt may succeed on its own; the daemon maps it onto its domain error at the boundary.

/// A broker call failed.
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    /// The broker cannot be reached, the link broke, or it did not answer in time: try again
    /// later.
    #[error("{0}")]
    Unavailable(String),
    /// The broker refused what was asked (a queue declared otherwise, a permission): a
    /// configuration problem to report, not to retry blindly.
    #[error("{0}")]
    Refused(String),
    /// An inbox another consumer holds exclusively: a second gateway of the same host, or a
    /// crashed run of this one whose connection the broker has not yet timed out.
    #[error("{0}")]
    Held(String),
    /// The connection URI cannot be used.
    #[error("{0}")]
    BadUri(String),
    /// The TLS files cannot be used: one cannot be read or holds no PEM of its kind, a
    /// certificate comes without its key, or the URI is not `amqps://`.
    #[error("{0}")]
    BadTls(String),
}

impl AmqpError {
    /// Whether a later attempt may succeed on its own.
    pub fn retry(&self) -> bool {
        matches!(self, AmqpError::Unavailable(_))
    }

    /// Whether an inbox is held by another consumer (which may let go of it).
    pub fn is_held(&self) -> bool {
        matches!(self, AmqpError::Held(_))
    }

    /// The same failure, counted as a queue another connection holds when the broker refused
    /// it for exclusive use (`ACCESS_REFUSED … in exclusive use` to a consumer,
    /// `RESOURCE_LOCKED … exclusive access` to a declare); any other failure as it is.
    pub(crate) fn held(self) -> Self {
        match self {
            AmqpError::Refused(message) if message.contains("exclusive") => {
                AmqpError::Held(message)
            }
            other => other,
        }
    }

    /// A lapin failure while doing `what`: a channel-level (soft) protocol error is the
    /// broker refusing; anything else is the link failing.
    pub(crate) fn from_lapin(what: &str, err: &lapin::Error) -> Self {
        let detail = match err.kind() {
            lapin::ErrorKind::ProtocolError(amqp) => amqp.get_message().to_string(),
            _ => err.to_string(),
        };
        let message = format!("{what}: {detail}");
        if err.is_amqp_soft_error() {
            AmqpError::Refused(message)
        } else {
            AmqpError::Unavailable(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unavailable_broker_is_retried() {
        assert!(AmqpError::Unavailable("down".into()).retry());
        assert!(!AmqpError::Refused("403".into()).retry());
        assert!(!AmqpError::BadUri("no".into()).retry());
        assert!(!AmqpError::BadTls("no".into()).retry());
        let locked = "declaring queue roster.a: RESOURCE_LOCKED - cannot obtain exclusive access to locked queue";
        let held = AmqpError::Refused(locked.into()).held();
        assert!(!held.retry() && held.is_held());
        assert_eq!(held.to_string(), locked);
        // A permission refused, or a link down, is not an inbox held.
        assert!(
            !AmqpError::Refused("ACCESS_REFUSED - no access".into())
                .held()
                .is_held()
        );
        assert!(AmqpError::Unavailable("x".into()).held().retry());
        assert!(!AmqpError::BadUri("no".into()).held().is_held());
    }
}
