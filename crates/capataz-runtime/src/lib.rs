//! capataz's runtime: the IO around the health decisions of the pure `capataz-health` crate
//! (probes, the proxy and its listeners, the supervisor, fleet, metrics, status, history, alerts,
//! ACME and stapling, handover, logging). The admin API and the binary sit on top of it.

// The layers below the runtime, crates of their own (Cargo keeps them from importing it), under
// the names the runtime's modules have always used.
pub use capataz_config as config;
use capataz_discovery as discovery;
pub use capataz_events as events;
pub use capataz_timefmt as timefmt;
pub use capataz_tls as tls;
pub use capataz_upstream::client_body;
pub use capataz_upstream::{access_log, balance};
use capataz_upstream::{body, instruments, rate_limit, upstream};
// The request path's own pieces the runtime uses too, still not part of its API.
use capataz_upstream::{atomic_enum, lockstat, oneshot, outbox, turn};

mod acme;
pub mod alerts;
mod downstream;
mod fleet;
mod h3;
pub mod handover;
pub mod health;
mod history;
pub mod logging;
pub mod manual;
pub mod metrics;
pub mod prober;
pub mod proxy;
pub mod sd_notify;
mod stapling;
pub mod status;
pub mod supervisor;
mod tcp;
pub mod workers;
