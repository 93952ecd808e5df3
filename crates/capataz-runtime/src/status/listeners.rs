//! The `listeners` of `/status`: each client listener's connections against its
//! `max_connections`, read from the same gauge the listener's accept loops compare with it.

use serde::Serialize;

/// One client listener, as `/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ListenerView {
    /// Its name (the metrics' `listener` label).
    pub name: String,
    /// The address it bound (its port, when configured as 0), or `unix:/path`.
    pub address: String,
    /// `http` or `tcp`.
    pub mode: &'static str,
    /// The connections it holds now: its `capataz_client_connections_open`.
    pub open: u64,
    /// Its `max_connections`, `None` without one.
    pub max_connections: Option<usize>,
    /// Whether it holds `max_connections` now: the next connection waits.
    pub full: bool,
    /// Connections it took while full (`capataz_client_connections_limit_reached_total`),
    /// `None` without a limit.
    pub limit_reached: Option<u64>,
}

impl ListenerView {
    /// The view of a listener holding `open` connections under `max_connections`.
    pub fn new(
        (name, address, mode): (String, String, &'static str),
        open: u64,
        max_connections: Option<usize>,
        limit_reached: Option<u64>,
    ) -> ListenerView {
        let full = max_connections.is_some_and(|max| open >= max as u64);
        ListenerView {
            name,
            address,
            mode,
            open,
            max_connections,
            full,
            limit_reached,
        }
    }
}
