//! End-to-end tests of the proxy's edges on loopback: upgrades, retries and their budget,
//! HTTP/1.0 and keep-alive, oversized heads, streamed bodies both ways, routing, and the
//! least-request algorithm.
//!
//! Besides the scriptable [`SimBackend`], some tests use tiny raw backends written here (a
//! WebSocket-style echo, a body counter, a streamer) because they need to see or produce bytes
//! a `SimBackend` does not. Waits are on answers and counts with generous deadlines, never on
//! fixed sleeps.
//!
//! The scaffolding is here; the tests are in one module per section.

mod connections;
mod least_request;
mod parked;
mod parked_hostile;
mod retries;
mod routing;
mod streaming;
mod upgrades;
mod watcher;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use capataz::health::Notice;
use capataz::sim::{Mode, SimBackend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::support::balancer::{backends, pairs as sims, start, ConfigText};
use crate::support::client::{Answer, Client};
use crate::support::raw::{
    fill, has_token, header, raw_roundtrip, read_body, read_exact_buf, read_head, status_of,
    RawBackend,
};
use crate::support::{any, DEADLINE};

/// No probes and a passive side that never ejects within a test: only the proxy is exercised.
const QUIET: &str = r#"
[pools.web.active]
kind = "none"

[pools.web.passive]
consecutive_errors = 1000
"#;

/// A config with one listener on a free port (with `listener_extra` keys) and one pool `web`
/// over `backends` (weight 1 each), plus `pool_extra` TOML appended after the pool's table.
fn config_text(
    backends: &[(String, SocketAddr)],
    listener_extra: &str,
    pool_extra: &str,
) -> String {
    ConfigText::new(backends)
        .listener(listener_extra)
        .extra(pool_extra)
        .build()
}

// ---- Raw backends and raw clients -------------------------------------------------------------

/// FNV-1a, to compare large bodies in a short answer.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A deterministic, non-repeating-looking body of `len` bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i / 251 % 256) as u8)
        .collect()
}

/// A keep-alive backend that reads each request's body and answers `<length> <fnv>`.
async fn counting_backend() -> RawBackend {
    RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let Some(body) = read_body(&mut stream, &mut buf, &head).await else {
                return;
            };
            hits.fetch_add(1, Ordering::SeqCst);
            let text = format!("{} {:x}", body.len(), fnv(&body));
            let response = format!(
                "HTTP/1.1 200 OK\r\nX-Backend: counter\r\nContent-Length: {}\r\n\r\n{text}",
                text.len()
            );
            if stream.write_all(response.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}
