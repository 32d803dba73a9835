//! herdr as a pane host: [`codec`] (pure), [`driver`] (the socket), [`host`] (the
//! [`crate::PaneHost`]).

pub mod codec;
pub mod driver;
pub mod host;
