//! herdr as a pane host.

pub mod codec;
