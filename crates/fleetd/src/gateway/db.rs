//! The store as the gateway's async code reaches it: calls that may wait on disk run on
//! tokio's blocking pool, the store's alone (the launchers' preparation has threads of its own,
//! see [`crate::lane::Lane`]), which is also the one pool a paused test clock waits for; the
//! few lookups with a reader of their own that never waits for writers are asked in place.

use std::sync::Arc;

use fleet_core::{ErrorCode, FleetError};
use fleet_store::{Store, StoreError, StoreResult};

/// The gateway's handle on its store.
pub(super) struct Db(Arc<dyn Store>);

impl Db {
    pub(super) fn new(store: Arc<dyn Store>) -> Self {
        Self(store)
    }

    /// Runs `f` on the store, off the async threads.
    pub(super) async fn run<T, F>(&self, f: F) -> Result<T, FleetError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> StoreResult<T> + Send + 'static,
    {
        let store = Arc::clone(&self.0);
        match tokio::task::spawn_blocking(move || f(store.as_ref())).await {
            Ok(result) => result.map_err(store_error),
            Err(join) => Err(FleetError::internal(format!("store call failed: {join}"))),
        }
    }

    /// The store, for a lookup asked in place: only one whose reader never waits for writers
    /// (a token's, an answer's), where a hop to a blocking thread would cost more than the look.
    pub(super) fn at_once(&self) -> &dyn Store {
        self.0.as_ref()
    }

    /// The store, shared: for what runs its own blocking work on it (the group commit, the
    /// health probe).
    pub(super) fn shared(&self) -> Arc<dyn Store> {
        Arc::clone(&self.0)
    }
}

/// Maps a store failure onto the domain error.
pub(super) fn store_error(err: StoreError) -> FleetError {
    match err {
        StoreError::NameTaken(name) => FleetError::invalid(format!(
            "the name '{name}' is taken by a live entity; pick another or stop that one first"
        )),
        other => FleetError::new(ErrorCode::Internal, other.to_string()),
    }
}
