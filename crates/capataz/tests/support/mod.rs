//! Scaffolding shared by capataz's integration tests: a balancer started from a config string
//! on ephemeral ports ([`balancer`]), HTTP clients ([`client`]) and blocking ones
//! ([`blocking`]), switchable health and agent backends ([`checks`]), an event recorder ([`events`]), hand-written backends and raw sockets
//! ([`raw`]), a fleet of `capataz` processes ([`fleet`]) and a TCP relay that can be cut
//! ([`relay`]), and waits with a generous deadline ([`wait`]). Scripted backends are [`capataz::sim::SimBackend`].
//!
//! Every address a test binds is `127.0.0.1:0`: the suite runs beside a `capataz demo` (8080,
//! 9901) or another copy of itself.

// Each test binary uses a different part of this module, and its items are `pub` so that every
// test module of a binary can reach them.
#![allow(dead_code, unreachable_pub)]

pub mod access_log;
pub mod backends_tls;
pub mod balancer;
pub mod blocking;
pub mod checks;
pub mod client;
pub mod etcd;
pub mod etcd_secure;
pub mod events;
pub mod fleet;
pub mod h2client;
pub mod h2frames;
pub mod knot;
pub mod ocsp;
pub mod pebble;
pub mod process;
pub mod prometheus;
pub mod proxied;
pub mod raw;
pub mod relay;
pub mod stream;
pub mod tls;
pub mod wait;

use std::net::SocketAddr;
use std::time::Duration;

/// How long a test waits for anything before it gives up.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// An ephemeral port on loopback.
pub fn any() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}
