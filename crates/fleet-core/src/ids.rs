//! Global identifiers. Every entity, message and flow is named by a UUID v7 (time-ordered, so ids
//! sort by creation), never by a host-local pane id: a pane id means nothing off its host.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// Mints a new time-ordered id.
            pub fn mint() -> Self {
                Self(Uuid::now_v7())
            }

        }

        impl From<Uuid> for $name {
            fn from(value: Uuid) -> Self {
                Self(value)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

uuid_id!(
    /// The global id of a message-addressable entity (lead, architect, worker).
    Gid
);
impl Gid {
    /// When it was minted, in Unix ms (a UUID v7 carries it); `None` for an id of another
    /// version.
    pub fn minted_ms(&self) -> Option<u64> {
        let (secs, nanos) = self.0.get_timestamp()?.to_unix();
        Some(secs.saturating_mul(1000) + u64::from(nanos / 1_000_000))
    }
}
impl Gid {
    /// The fixed gid an operator's token (`[operators.NAME]`) stands for. No entity has it (an
    /// entity's gid is a v7 UUID, this one a v5 of the name), so it is never in the roster nor
    /// a message's sender or recipient.
    pub fn of_operator(name: &str) -> Gid {
        Gid(Uuid::new_v5(
            &Uuid::NAMESPACE_OID,
            format!("fleetd operator {name}").as_bytes(),
        ))
    }
}
uuid_id!(
    /// The id of one message: the dedup key on every path.
    MsgId
);
impl MsgId {
    /// The id of the message that `purpose` (say, "failed") derives from this one: the same
    /// every time, so a notice about a message is accepted once however often it is sent.
    pub fn derived(&self, purpose: &str) -> MsgId {
        let mut name = self.0.as_bytes().to_vec();
        name.extend_from_slice(purpose.as_bytes());
        MsgId(Uuid::new_v5(&Uuid::NAMESPACE_OID, &name))
    }
}

uuid_id!(
    /// The id of a flow, minted at its first send and carried by every later hop.
    TraceId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text() {
        let gid = Gid::mint();
        let parsed: Gid = gid.to_string().parse().unwrap();
        assert_eq!(gid, parsed);
    }

    #[test]
    fn later_ids_sort_after_earlier_ones() {
        let first = MsgId::mint();
        let second = MsgId::mint();
        assert!(first < second);
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let original = MsgId::mint();
        assert_eq!(original.derived("failed"), original.derived("failed"));
        assert_ne!(original.derived("failed"), original.derived("other"));
        assert_ne!(original.derived("failed"), MsgId::mint().derived("failed"));
    }

    #[test]
    fn a_gid_tells_when_it_was_minted() {
        let before = u64::try_from(crate::clock::now_ms()).unwrap();
        let gid = Gid::mint();
        let after = u64::try_from(crate::clock::now_ms()).unwrap();
        let minted = gid.minted_ms().unwrap();
        assert!(
            before <= minted && minted <= after,
            "{before} {minted} {after}"
        );
        let v4: Gid = "5b7f2c3e-8a1d-4c2b-9e3f-1a2b3c4d5e6f".parse().unwrap();
        assert_eq!(v4.minted_ms(), None);
    }

    #[test]
    fn garbage_is_not_an_id() {
        assert!("not-a-uuid".parse::<Gid>().is_err());
    }
}
