//! Active checks of a Unix socket backend (`address = "unix:/run/app.sock"`): every kind a
//! TCP backend has (plain and checked `http`, `http` over h2c, `grpc`, `tcp` with or without
//! an exchange), the same requests, rules and one deadline, over a `UnixStream`. A missing
//! socket file or one nobody listens on is [`Outcome::Refused`], as a closed port is. The
//! default `Host` is `localhost` (what `curl --unix-socket` sends): a socket has no host name.

use std::io;
use std::path::Path;

use capataz_health::{Outcome, ProbeOutcome};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::{classify_error, content, http2, status_line, tcp_exchange, H2Probe, HttpProbe};
use crate::config::{ActiveCheckConfig, CheckKind};

/// The `Host` a probe of a Unix socket backend sends when the pool sets none.
pub const UNIX_PROBE_HOST: &str = "localhost";

/// How one pool probes its backends, as the health runtime planned it.
#[derive(Clone, Copy, Debug)]
pub struct UnixProbe<'a> {
    /// The pool's active check.
    pub active: &'a ActiveCheckConfig,
    /// The `Host` (or `:authority`) sent.
    pub host: &'a str,
    /// Whether an `http` or `grpc` check runs over HTTP/2 (h2c).
    pub over_h2: bool,
    /// Whether an `http` check has a configured request or content rules.
    pub checked: bool,
}

/// One probe of the socket at `path`, `preamble` (a pool's PROXY protocol header) written
/// first when not empty, within the check's timeout.
pub async fn probe_unix(probe: UnixProbe<'_>, path: &Path, preamble: &[u8]) -> ProbeOutcome {
    let timeout = probe.active.timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    match tokio::time::timeout(timeout, exchange(probe, path, preamble, deadline)).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => classify_error(&error).into(),
        Err(_elapsed) => Outcome::Timeout.into(),
    }
}

async fn exchange(
    probe: UnixProbe<'_>,
    path: &Path,
    preamble: &[u8],
    deadline: tokio::time::Instant,
) -> io::Result<ProbeOutcome> {
    let mut stream = UnixStream::connect(path).await?;
    if !preamble.is_empty() {
        stream.write_all(preamble).await?;
    }
    let active = probe.active;
    if probe.over_h2 {
        let h2 = H2Probe::new(active, probe.host, false);
        return Ok(Box::pin(http2::over(&h2, stream)).await);
    }
    match active.kind {
        CheckKind::Http if probe.checked => {
            let http = HttpProbe::new(active, probe.host);
            Box::pin(content::exchange_on(&http, stream)).await
        }
        CheckKind::Http => Ok(status_line(stream, &active.path, probe.host).await?.into()),
        CheckKind::Tcp => match &active.tcp_exchange {
            Some(tcp) => tcp_exchange::exchange_on(stream, tcp, deadline).await,
            None => Ok(Outcome::Connected.into()),
        },
        CheckKind::Grpc => {
            let grpc = H2Probe::grpc("", probe.host, false);
            Ok(Box::pin(http2::over(&grpc, stream)).await)
        }
        CheckKind::None => Ok(Outcome::Status(200).into()),
    }
}
