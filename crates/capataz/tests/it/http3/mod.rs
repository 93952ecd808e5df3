//! HTTP/3 on a TLS listener (`[listeners.tls.http3]`), end to end: a real HTTP/3 client
//! (quinn + h3, `support::h3client`) through capataz to HTTP/1.1 backends, compared with what
//! the backends saw, the access log and the metrics say.

mod client_gone;
mod config;
mod hostile;
mod initial_flood;
mod lifecycle;
mod limits;
mod oversized_head;
mod quic_metrics;
mod refused_heads;
mod requests;
mod retry_reload;
mod udp_port;

use std::net::SocketAddr;
use std::path::Path;

use capataz::health::Notice;
use capataz::server::Balancer;
use tokio::sync::broadcast;

use crate::support::balancer::{start, ConfigText};
use crate::support::tls::Pki;

/// The test certificate's name.
const SITE: &str = "site.test";

/// A balancer over `config` (its pool and extra tables) whose listener terminates TLS with a
/// certificate for [`SITE`] and serves HTTP/3 with `http3` in its `[listeners.tls.http3]`
/// (`None`: no HTTP/3), `listener_lines` added to the listener's table.
async fn h3_balancer(
    pki: &Pki,
    config: ConfigText,
    http3: Option<&str>,
    listener_lines: &str,
) -> (Balancer, broadcast::Receiver<Notice>) {
    let (cert, key) = pki.server("site", &[SITE], None);
    let http3 = match http3 {
        Some(lines) => format!("[listeners.tls.http3]\n{lines}\n"),
        None => String::new(),
    };
    let text = config
        .listener(&format!(
            "{listener_lines}\n{}{http3}",
            Pki::listener(&[(cert.as_path(), key.as_path())], "")
        ))
        .build();
    start(&text).await
}

/// The UDP address HTTP/3 is served on by default: the listener's TCP port.
fn udp_addr(balancer: &Balancer) -> SocketAddr {
    balancer.local_addrs()[0]
}

/// The access log table writing JSON to `path`.
fn json_log(path: &Path) -> String {
    crate::support::access_log::table(path, "json", "")
}
