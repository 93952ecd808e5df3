//! The IO half of active checks: one probe.
//!
//! The health engine decides what a probe's [`Outcome`] means and when each backend is probed
//! (its schedule: random first phase, jitter, slot grid); this module only produces the
//! outcome, and the health runtime's driver calls it when the schedule says. Keeping the socket
//! work here and the scheduling elsewhere means each probe is a plain `async fn` that tests can
//! drive against a loopback listener.
//!
//! Invariants:
//! - One deadline covers a whole probe (connect, write, and reading the status line); a probe
//!   never takes much longer than its timeout, whatever the backend does.
//! - A plain HTTP probe reads at most [`MAX_STATUS_LINE`] bytes and only up to the first `\n`:
//!   the headers and body are never read, and the connection is closed right after. A probe
//!   with a configured request or content rules ([`HttpProbe`], `content.rs`) reads the head
//!   within [`MAX_PROBE_HEAD`] bytes and, only for a body rule, the body up to its limit.
//! - Every failure maps to exactly one [`Outcome`]; nothing here panics on what a backend sends.
//! - Probes are cheap for the backend's host: due times fall on a slot grid (the engine's
//!   [`PROBE_SLOT`](capataz_health::schedule::PROBE_SLOT)) so probes leave in batches, and an
//!   HTTP probe's request carries the handshake's last ACK, so a sleeping backend is woken about
//!   once per batch rather than twice per probe.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use capataz_health::{parse_status_line, Outcome, ProbeOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::CheckKind;
use crate::tls::backend::Connector;

mod agent;
#[cfg(test)]
mod checked_tests;
mod content;
mod http2;
mod tcp_exchange;
#[cfg(test)]
mod tests;
mod unix;

pub use agent::agent_once;
pub use content::{probe_checked, probe_checked_sending, request_bytes, HttpProbe, MAX_PROBE_HEAD};
pub use http2::{
    decode_health_response, encode_health_request, probe_h2, H2Probe, MAX_GRPC_MESSAGE,
};
pub use unix::{probe_unix, UnixProbe, UNIX_PROBE_HOST};

/// The longest status line read, line ending included; a longer one is [`Outcome::Malformed`].
pub const MAX_STATUS_LINE: usize = 1024;

/// The `User-Agent` every HTTP probe sends.
pub const USER_AGENT: &str = concat!("capataz/", env!("CARGO_PKG_VERSION"));

/// Runs one active check against `addr` and says what it came to.
///
/// - [`CheckKind::Http`] opens a fresh connection, writes exactly
///   `GET <path> HTTP/1.1\r\nHost: <host>\r\nUser-Agent: capataz/<version>\r\nConnection: close\r\n\r\n`,
///   reads only the status line, and judges it with [`parse_status_line`]: a well-formed line is
///   [`Outcome::Status`], anything else [`Outcome::Malformed`] (a backend answering the word
///   `TIMEOUT` is malformed, not a timeout).
/// - [`CheckKind::Tcp`] passes when the connection is established: [`Outcome::Connected`],
///   which passes whatever `expect` says (there is no status to judge); a failure maps like an
///   HTTP probe's.
/// - [`CheckKind::Grpc`] runs the gRPC health check of the server as a whole (service `""`)
///   over HTTP/2, by prior knowledge or over TLS by `tls`, as [`probe_h2`] does; a pool that
///   names a service or speaks HTTP/2 for its `http` probe uses [`H2Probe`] and [`probe_h2`].
/// - [`CheckKind::None`] is `Status(200)` at once (the runtime never probes such pools).
///
/// Failures: the deadline passing is [`Outcome::Timeout`]; a refused connection is
/// [`Outcome::Refused`]; a reset, a broken pipe, or the end of the stream before any byte (an
/// empty reply) is [`Outcome::Reset`]. If the stream ends after some bytes but before a `\n`,
/// those bytes are judged as the status line: the backend did say something, and it is almost
/// always malformed (only a complete status line without its line ending passes). An OS-level
/// timeout is [`Outcome::Timeout`]; any other error (unreachable network or host, ...) is
/// [`Outcome::Refused`], the backend could not be reached.
///
/// `path` and `host` are written verbatim; the configuration guarantees they hold no control
/// bytes.
///
/// This is the outcome alone, without [`probe_once_over`]'s content match: a gRPC check's
/// serving status other than `SERVING` is only in that mismatch, so the health runtime always
/// uses [`probe_once_over`] (or [`probe_h2`]).
pub async fn probe_once(
    kind: CheckKind,
    addr: SocketAddr,
    path: &str,
    host: &str,
    timeout: Duration,
) -> Outcome {
    probe_once_over(kind, addr, path, host, timeout, None)
        .await
        .outcome
}

/// [`probe_once`], with an HTTP probe over TLS by `tls` when given (a pool that speaks TLS to
/// its backends probes them with the same settings: CA, name, verification, ALPN). The
/// handshake is inside the probe's one deadline; a handshake rustls refuses (a certificate
/// not trusted or not for the backend's name, a protocol refused) is [`Outcome::Tls`], a
/// connection reset or closed during it is [`Outcome::Reset`].
pub async fn probe_once_over(
    kind: CheckKind,
    addr: SocketAddr,
    path: &str,
    host: &str,
    timeout: Duration,
    tls: Option<&Connector>,
) -> ProbeOutcome {
    probe_once_sending(kind, addr, path, host, timeout, tls, &[]).await
}

/// [`probe_once_over`], writing `preamble` first on the connection (before TLS too) when it is
/// not empty: the PROXY protocol header (`LOCAL` or `UNKNOWN`) of a pool that sends one to its
/// backends. A `tcp` probe writes it and then closes.
pub async fn probe_once_sending(
    kind: CheckKind,
    addr: SocketAddr,
    path: &str,
    host: &str,
    timeout: Duration,
    tls: Option<&Connector>,
    preamble: &[u8],
) -> ProbeOutcome {
    let attempt = async {
        match kind {
            CheckKind::Grpc => {
                let probe = H2Probe::grpc("", host, tls.is_some());
                // Boxed, as the TLS exchange below: the plain probe's future stays small
                // (about 1 KB beside 9), which matters for every probe under way.
                return Ok(Box::pin(probe_h2(&probe, addr, timeout, tls)).await);
            }
            CheckKind::Http => http_probe(addr, path, host, tls, preamble).await,
            CheckKind::Tcp if tls.is_some() => Box::pin(tcp_over_tls(addr, preamble, tls)).await,
            CheckKind::Tcp if preamble.is_empty() => TcpStream::connect(addr)
                .await
                .map(|_connected| Outcome::Connected),
            CheckKind::Tcp => connect(addr, preamble)
                .await
                .map(|_connected| Outcome::Connected),
            CheckKind::None => Ok(Outcome::Status(200)),
        }
        .map(ProbeOutcome::from)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => classify_error(&error).into(),
        Err(_elapsed) => Outcome::Timeout.into(),
    }
}

/// A `tcp` check with `send` or `expect_text` against `addr`, `preamble` written first (see
/// `tcp_exchange.rs`), over TLS by `tls` when given, within `timeout`; failures map as
/// [`probe_once`]'s.
pub async fn probe_tcp_exchange(
    addr: SocketAddr,
    timeout: Duration,
    preamble: &[u8],
    exchange: &crate::config::TcpExchange,
    tls: Option<&Connector>,
) -> ProbeOutcome {
    let deadline = tokio::time::Instant::now() + timeout;
    match tcp_exchange::probe(addr, preamble, exchange, deadline, tls).await {
        Ok(outcome) => outcome,
        Err(error) => classify_error(&error).into(),
    }
}

/// A `tcp` check of a pool that speaks TLS to its backends: the connect and a full handshake
/// (the pool's CA, name and client certificate), as HAProxy's `check-ssl` in `mode tcp`; a
/// handshake rustls refuses is [`Outcome::Tls`].
async fn tcp_over_tls(
    addr: SocketAddr,
    preamble: &[u8],
    tls: Option<&Connector>,
) -> io::Result<Outcome> {
    let stream = connect(addr, preamble).await?;
    let Some(tls) = tls else {
        return Ok(Outcome::Connected);
    };
    match tls.connect_probe(stream).await {
        Ok(_session) => Ok(Outcome::Connected),
        Err(error) if error.kind() == io::ErrorKind::InvalidData => Ok(Outcome::Tls),
        Err(error) => Err(error),
    }
}

/// The bytes of an HTTP probe's request.
pub fn probe_request(path: &str, host: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

async fn http_probe(
    addr: SocketAddr,
    path: &str,
    host: &str,
    tls: Option<&Connector>,
    preamble: &[u8],
) -> io::Result<Outcome> {
    let stream = connect(addr, preamble).await?;
    match tls {
        None => status_line(stream, path, host).await,
        Some(tls) => Box::pin(status_line_over_tls(tls, stream, path, host)).await,
    }
}

/// [`status_line`] after a TLS handshake on `stream`.
async fn status_line_over_tls(
    tls: &Connector,
    stream: TcpStream,
    path: &str,
    host: &str,
) -> io::Result<Outcome> {
    match tls.connect_probe(stream).await {
        Ok(stream) => status_line(stream, path, host).await,
        Err(error) if error.kind() == io::ErrorKind::InvalidData => Ok(Outcome::Tls),
        Err(error) => Err(error),
    }
}

/// Sends the probe's request on `stream` and reads the status line only.
async fn status_line<S>(mut stream: S, path: &str, host: &str) -> io::Result<Outcome>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(&probe_request(path, host)).await?;
    stream.flush().await?;
    let mut buf = [0u8; MAX_STATUS_LINE];
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            if len == 0 {
                return Ok(Outcome::Reset);
            }
            // The stream ended mid-line: judge what did arrive (see `probe_once`).
            return Ok(judge_line(&buf[..len]));
        }
        let fresh = &buf[len..len + n];
        if let Some(newline) = fresh.iter().position(|&b| b == b'\n') {
            return Ok(judge_line(&buf[..len + newline]));
        }
        len += n;
        if len == MAX_STATUS_LINE {
            return Ok(Outcome::Malformed);
        }
    }
    // `stream` is dropped here, closing the connection without reading the rest.
}

/// A probe's connection: Nagle off, and on Linux the handshake's last ACK held back to leave
/// with the request (or with `preamble`, written first when not empty).
async fn connect(addr: SocketAddr, preamble: &[u8]) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // One small write; do not let Nagle hold it back.
    let _ = socket.set_nodelay(true);
    // Delay the handshake's last ACK so that it leaves with the request, as HAProxy does for
    // checks that send data: the backend then wakes once per probe (connection and request
    // together) instead of twice. Best effort; without it the probe works the same.
    #[cfg(target_os = "linux")]
    let _ = socket2::SockRef::from(&socket).set_tcp_quickack(false);
    let mut stream = socket.connect(addr).await?;
    if !preamble.is_empty() {
        stream.write_all(preamble).await?;
    }
    Ok(stream)
}

/// Judges a status line without its `\n`; one trailing `\r` is stripped.
fn judge_line(line: &[u8]) -> Outcome {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    match parse_status_line(line) {
        Some(code) => Outcome::Status(code),
        None => Outcome::Malformed,
    }
}

fn classify_error(error: &io::Error) -> Outcome {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => Outcome::Refused,
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Outcome::Reset,
        io::ErrorKind::TimedOut => Outcome::Timeout,
        _ => Outcome::Refused,
    }
}
