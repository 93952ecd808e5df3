//! The proxied request path under hostile peers on both sides: who is charged for a failed
//! attempt (the client, the backend), the deadlines of an upload and of a response body,
//! strict framing of backend answers, Host confusion, and connection reuse that never lets
//! one client read bytes meant for another.
//!
//! Backends and clients here are raw sockets, so each test can send or withhold exactly the
//! bytes it means to. Waits are on answers, closes and counts with generous deadlines; the
//! only timing is that of the timeouts under test, set short.

mod answers;
mod body_deadlines;
mod first_poll;
mod framing;
mod hosts;
mod retry;
mod reuse;
mod uploads;

use std::net::SocketAddr;

use capataz::server::Balancer;
use capataz_health::Outcome;
use tokio::io::AsyncWriteExt;

use crate::support::balancer::{start, ConfigText};
use crate::support::raw::{read_body, read_head, RawBackend};

/// A balancer with one listener and one pool `web` over `backends`, no probes, and a passive
/// side that ejects on the first error (so any charge shows); `listener` and `pool` are extra
/// TOML lines for the listener and for `[pools.web.timeouts]`.
async fn balancer(
    backends: &[SocketAddr],
    listener: &str,
    timeouts: &str,
) -> (Balancer, SocketAddr) {
    balancer_with(backends, listener, timeouts, "").await
}

/// [`balancer`], with `pool` added to `[pools.web]` (a `retries` line there replaces the
/// default `retries = { attempts = 0 }`).
async fn balancer_with(
    backends: &[SocketAddr],
    listener: &str,
    timeouts: &str,
    pool: &str,
) -> (Balancer, SocketAddr) {
    let entries: Vec<(String, SocketAddr)> = backends
        .iter()
        .enumerate()
        .map(|(i, addr)| (format!("b{i}"), *addr))
        .collect();
    let retries = if pool.contains("retries") {
        ""
    } else {
        "retries = { attempts = 0 }"
    };
    let text = ConfigText::new(&entries)
        .listener(listener)
        .extra(&format!(
            "{pool}\n{retries}\n\n\
             [pools.web.active]\nkind = \"none\"\n\n\
             [pools.web.passive]\nconsecutive_errors = 1\nmax_ejected_percent = 100\n\n\
             [pools.web.timeouts]\n{timeouts}\n"
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    (balancer, addr)
}

/// What backend `index` of pool `web` has been charged with (every outcome fed to it).
fn charged(balancer: &Balancer, index: usize) -> Vec<Outcome> {
    balancer.pool("web").expect("pool web").backends[index]
        .traffic
        .recent()
}

/// The outcomes of backend `index` that are errors (not a status below 500).
fn errors(balancer: &Balancer, index: usize) -> Vec<Outcome> {
    charged(balancer, index)
        .into_iter()
        .filter(|o| !matches!(o, Outcome::Status(code) if *code < 500))
        .collect()
}

/// A backend that answers every request on its connection with `answer`, verbatim.
async fn answering(answer: &'static [u8]) -> RawBackend {
    RawBackend::serving(move |mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            if read_body(&mut stream, &mut buf, &head).await.is_none()
                || stream.write_all(answer).await.is_err()
            {
                return;
            }
        }
    })
    .await
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n";
