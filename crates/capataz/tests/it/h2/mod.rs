//! HTTP/2 from clients (h2c with prior knowledge) to HTTP/1.1 backends: the request path as
//! over HTTP/1.1 (routing by `:authority`, forwarded headers, framing of bodies, retries,
//! passive checks, timeouts, blame), and the known attacks on HTTP/2 servers sent as raw
//! frames (`support::h2frames`). Clients are hyper's (`support::h2client`), raw frames, and
//! `curl --http2-prior-knowledge`.

mod attacks;
mod content_length;
mod heads;
mod hosts;
mod idle_buffers;
mod requests;
mod resilience;
mod slow_readers;
mod third_party;
mod websocket;

use std::net::SocketAddr;

use capataz::health::Notice;
use capataz::server::Balancer;
use capataz_health::Outcome;
use tokio::io::AsyncWriteExt;
use tokio::sync::broadcast;

use crate::support::balancer::{start, ConfigText};
use crate::support::raw::{read_body, read_head, RawBackend};

/// A balancer whose one listener accepts h2c (plus `listener` lines) over pool `web` of
/// `backends`, no probes, the passive side ejecting on the first error (any charge shows),
/// and `pool` lines in `[pools.web]` (default: no retries).
async fn balancer(
    backends: &[(String, SocketAddr)],
    listener: &str,
    pool: &str,
) -> (Balancer, SocketAddr, broadcast::Receiver<Notice>) {
    let retries = if pool.contains("retries") {
        ""
    } else {
        "retries = { attempts = 0 }"
    };
    let text = ConfigText::new(backends)
        .listener(&format!("h2c = true\n{listener}"))
        .extra(&format!(
            "{pool}\n{retries}\n\n\
             [pools.web.active]\nkind = \"none\"\n\n\
             [pools.web.passive]\nconsecutive_errors = 1\nmax_ejected_percent = 100\n"
        ))
        .build();
    let (balancer, events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    (balancer, addr, events)
}

/// What backend `index` of pool `web` has been charged with (every outcome fed to it).
fn charged(balancer: &Balancer, index: usize) -> Vec<Outcome> {
    balancer.pool("web").expect("pool web").backends[index]
        .traffic
        .recent()
}

/// A keep-alive backend named `name` that answers each request with its head as received and
/// its body's length (`<head>\n\nbody=<n>`), chunked, with hop-by-hop fields that must never
/// reach an HTTP/2 client. It counts requests once their head is read.
async fn echo_backend(name: &'static str) -> RawBackend {
    RawBackend::start(move |mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let Some(body) = read_body(&mut stream, &mut buf, &head).await else {
                return;
            };
            let text = format!("{head}\n\nbody={}", body.len());
            let answer = format!(
                "HTTP/1.1 200 OK\r\nX-Backend: {name}\r\nConnection: keep-alive, x-hop\r\n\
                 Keep-Alive: timeout=5\r\nX-Hop: secret\r\nProxy-Connection: keep-alive\r\n\
                 Upgrade: h2c\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{text}\r\n0\r\n\r\n",
                text.len()
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// A backend that reads request heads, counts them, and never answers.
async fn silent_backend() -> RawBackend {
    RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while read_head(&mut stream, &mut buf).await.is_some() {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    })
    .await
}
