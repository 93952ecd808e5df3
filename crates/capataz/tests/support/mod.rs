//! Scaffolding shared by capataz's integration tests: a balancer started from a config string
//! on ephemeral ports ([`balancer`]), HTTP clients ([`client`]) and blocking ones
//! ([`blocking`]), switchable health and agent backends ([`checks`]), an event recorder ([`events`]), hand-written backends and raw sockets
//! ([`raw`]), a real nginx backend ([`nginx`]), a fleet of `capataz` processes ([`fleet`]) and a TCP relay that can be cut
//! ([`relay`]), waits with a generous deadline ([`wait`]), table-driven tests over named cases
//! ([`cases`]), and what tests need from outside the
//! repository, found or failed ([`tools`]: a missing peer fails a test, never skips it). Scripted backends are [`capataz::sim::SimBackend`].
//!
//! Every address a test binds is `127.0.0.1:0`: the suite runs beside a `capataz demo` (8080,
//! 9901) or another copy of itself.

// Each test binary uses a different part of this module, and its items are `pub` so that every
// test module of a binary can reach them.
#![allow(dead_code, unreachable_pub)]

pub mod access_log;
pub mod acme2certifier;
pub mod backends_tls;
pub mod balancer;
pub mod blocking;
pub mod cases;
pub mod checks;
pub mod client;
pub mod db_server;
pub mod etcd;
pub mod etcd_secure;
pub mod events;
pub mod fleet;
pub mod grpc;
pub mod h2client;
pub mod h2frames;
pub mod h3client;
pub mod hostile_dns;
pub mod knot;
pub mod mariadb;
pub mod nginx;
pub mod ocsp;
pub mod pebble;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod proxied;
pub mod raw;
pub mod redis;
pub mod relay;
pub mod sockets;
pub mod stream;
pub mod tls;
pub mod tools;
pub mod unix;
pub mod wait;

use std::net::SocketAddr;
use std::time::Duration;

/// How long a test waits for anything before it gives up.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A tokio runtime of one worker, for a test that drives blocking code (a child process, std
/// threads) and calls async helpers beside it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// An ephemeral port on loopback.
pub fn any() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

/// A loopback port held for a listener that must be given its port before it binds (the
/// balancer an ACME server validates against, started again on the same port). A port found
/// free and released is often taken by someone else's `127.0.0.1:0` before the listener binds
/// it on a busy machine; held like this (bound with `SO_REUSEADDR`, never listening) the
/// kernel hands it to no one binding port 0, while a listener that sets `SO_REUSEADDR`
/// (capataz's, Go's) still binds and listens on it. Released when dropped.
pub struct ReservedPort {
    _socket: socket2::Socket,
    /// The port.
    pub port: u16,
}

/// Reserves a free loopback port (see [`ReservedPort`]).
pub fn reserve_port() -> ReservedPort {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    socket.set_reuse_address(true).expect("SO_REUSEADDR");
    socket.bind(&any().into()).expect("bind 127.0.0.1:0");
    let port = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .expect("a bound port");
    ReservedPort {
        _socket: socket,
        port,
    }
}
