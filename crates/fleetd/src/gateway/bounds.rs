//! The cap on messages waiting for one recipient, as the gateway applies it: the store counts
//! (in the transaction that inserts), `fleet_core::bounds::admit_waiting` decides, and this
//! module words the refusal. It decides nothing itself and never drops a message it accepted.

use fleet_core::bounds::Full;
use fleet_core::{ErrorCode, FleetError, Gid, Message};
use fleet_store::Inserted;

use super::LocalPlane;

impl LocalPlane {
    /// Stores `messages` in one transaction (with other callers' that come at the same time),
    /// each one that is to wait for its recipient only within `gateway.max_held_per_recipient`:
    /// for each, whether it was new, or the cap that refused it.
    pub(super) async fn store_within_cap(
        &self,
        messages: Vec<Message>,
    ) -> Result<Vec<Result<bool, Full>>, FleetError> {
        let outcomes = self.commits.store(messages).await?;
        Ok(outcomes
            .into_iter()
            .map(|o| o.map(Inserted::fresh))
            .collect())
    }

    /// Stores one message within the cap: whether it was new, or `too_many` naming the cap.
    pub(super) async fn store_one_within_cap(&self, message: Message) -> Result<bool, FleetError> {
        let to = message.to;
        match self.store_within_cap(vec![message]).await?.pop() {
            Some(Ok(fresh)) => Ok(fresh),
            Some(Err(full)) => Err(self.over_cap(to, &full).await),
            None => Err(FleetError::internal("the store answered for no message")),
        }
    }

    /// What the sender of a message to `to` is told when `to` is at its cap.
    pub(super) async fn over_cap(&self, to: Gid, full: &Full) -> FleetError {
        FleetError::new(
            ErrorCode::TooMany,
            format!(
                "'{}' already has {} messages waiting, the most allowed ({full}); yours was not accepted: send it again once some have been taken (a lead takes them with fleet_poll, a worker by working through its tasks)",
                self.name_of(to).await,
                full.count
            ),
        )
    }
}
