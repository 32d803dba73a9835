//! The one place a delivery off the broker is settled, and what a delivery on its way to be
//! held carries.

use fleet_amqp::Delivery;
use fleet_core::Message;
use fleet_core::admission::Handled;
use fleet_core::envelope::Envelope;

/// A message off an inbox, on its way to be held.
pub(super) struct Incoming {
    pub(super) delivery: Delivery,
    pub(super) envelope: Envelope,
    pub(super) message: Message,
}

/// Tells the broker how `delivery` was handled (with `through`, every delivery before it on
/// its channel too): the one place a delivery is settled. False if the broker was not told
/// (the channel is gone: the delivery comes again to the next consumer).
pub(in crate::gateway) async fn settle(
    delivery: &Delivery,
    handled: Handled,
    through: bool,
) -> bool {
    let how = handled.settlement();
    match delivery.settle(how, through).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(?how, through, error = %e, "a delivery was not settled; the broker delivers it again");
            false
        }
    }
}
