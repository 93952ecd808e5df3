//! The access log: one line per request, with who ended it and where,
//! written off the request path. `lines.rs`: the fields over HTTP/1.1, TLS and h2c, both
//! formats, escaping; `endings.rs`: who ended a request (backend, client, capataz) and in
//! which phase; `writer.rs`: a stalled writer drops and counts, a reload reopens the file;
//! `vanished.rs`: an HTTP/1.1 client that resets while its request waits; `affinity.rs`:
//! `affinity=` on hashing and sticky pools, against the traffic and the move counter.

mod affinity;
mod endings;
mod lines;
mod vanished;
mod writer;

use std::net::SocketAddr;

use capataz::server::Balancer;

use crate::support::access_log::table;
use crate::support::balancer::{start, ConfigText};

/// A balancer over `config` whose listener logs to `path` in `format`; the listener's
/// address.
async fn logging(
    config: ConfigText,
    path: &std::path::Path,
    format: &str,
    listener_lines: &str,
) -> (Balancer, SocketAddr) {
    let config = config.listener(&format!("{listener_lines}\n{}", table(path, format, "")));
    let (balancer, _) = start(&config.build()).await;
    let addr = balancer.local_addrs()[0];
    (balancer, addr)
}
