//! capataz: a load balancer that keeps its pool honest with active and passive health checks.
//!
//! The health decisions live in the pure `capataz-health` crate, the IO around them in
//! `capataz-runtime` and the admin API in `capataz-admin`; this crate is the binary's: the
//! listeners' server, upgrades, the demo and its simulated backends, `ctl` and the `replay` driver.

// The layers below, crates of their own (Cargo keeps them from importing this one), under the
// names the binary's modules and the tests have always used.
pub use capataz_admin as admin;
pub use capataz_runtime::{
    access_log, alerts, balance, config, events, handover, health, logging, manual, metrics,
    prober, sd_notify, status, supervisor, timefmt, tls, workers,
};

// The one internal HTTP/1.1 client (`ctl` and the demo use it too), not part of the API.
use capataz_upstream::oneshot;

pub mod ctl;
pub mod demo;
pub mod replay;
pub mod server;
pub mod sim;
pub mod upgrade;
