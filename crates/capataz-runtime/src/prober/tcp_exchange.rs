//! A `tcp` check with an exchange (HAProxy's `tcp-check send` then `tcp-check expect
//! string`): connect, write `send`, and read until the answer holds `expect_text`, at most
//! [`MAX_TCP_ANSWER`] bytes, all within the probe's one deadline; over TLS when the pool
//! speaks TLS to its backends.

use std::io;
use std::net::SocketAddr;

use capataz_health::{Mismatch, Outcome, ProbeOutcome, Snippet};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::config::{TcpExchange, MAX_TCP_ANSWER};
use crate::tls::backend::Connector;

/// One exchange with the backend at `addr`, `preamble` (a PROXY protocol header) written
/// first. Passes (`Connected`) once `send` is written when nothing is expected, else once the
/// answer holds `expect_text`. An answer that ends, or fills [`MAX_TCP_ANSWER`] bytes, without
/// it is a mismatch (`answer did not contain "+PONG"`); a connection closed before any answer
/// is `Reset`; the deadline passing is `Timeout`, with that mismatch once some answer came.
/// Failures to connect or write map as any probe's (the caller classifies them).
/// Over TLS by `tls` when given: a handshake rustls refuses is `Tls`.
pub(super) async fn probe(
    addr: SocketAddr,
    preamble: &[u8],
    exchange: &TcpExchange,
    deadline: Instant,
    tls: Option<&Connector>,
) -> io::Result<ProbeOutcome> {
    let late = || io::Error::from(io::ErrorKind::TimedOut);
    let connect = tokio::time::timeout_at(deadline, super::connect(addr, preamble));
    let stream = connect.await.map_err(|_| late())??;
    let Some(tls) = tls else {
        return on(stream, exchange, deadline).await;
    };
    let handshake = tokio::time::timeout_at(deadline, tls.connect_probe(stream));
    match handshake.await.map_err(|_| late())? {
        Ok(stream) => Box::pin(on(stream, exchange, deadline)).await,
        Err(error) if error.kind() == io::ErrorKind::InvalidData => Ok(Outcome::Tls.into()),
        Err(error) => Err(error),
    }
}

/// The exchange on a connected `stream`.
async fn on<S>(mut stream: S, exchange: &TcpExchange, deadline: Instant) -> io::Result<ProbeOutcome>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let late = || io::Error::from(io::ErrorKind::TimedOut);
    if !exchange.send.is_empty() {
        let write = tokio::time::timeout_at(deadline, stream.write_all(&exchange.send));
        write.await.map_err(|_| late())??;
    }
    let Some(expected) = &exchange.expect_text else {
        return Ok(Outcome::Connected.into());
    };
    let lacks = Some(Mismatch::AnswerLacks(Snippet::new(expected)));
    let mut answer = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let room = MAX_TCP_ANSWER - answer.len();
        let read = stream.read(&mut chunk[..room.min(1024)]);
        let n = match tokio::time::timeout_at(deadline, read).await {
            Ok(read) => read?,
            Err(_) if answer.is_empty() => return Ok(Outcome::Timeout.into()),
            Err(_) => {
                return Ok(ProbeOutcome {
                    outcome: Outcome::Timeout,
                    mismatch: lacks,
                })
            }
        };
        if n == 0 && answer.is_empty() {
            return Ok(Outcome::Reset.into());
        }
        // Only the new bytes, and the last `expected.len() - 1` before them, can hold a match
        // not seen yet: linear in the bytes read.
        let from = answer.len().saturating_sub(expected.len() - 1);
        answer.extend_from_slice(&chunk[..n]);
        if contains(&answer[from..], expected.as_bytes()) {
            return Ok(Outcome::Connected.into());
        }
        if n == 0 || answer.len() >= MAX_TCP_ANSWER {
            return Ok(ProbeOutcome {
                outcome: Outcome::Connected,
                mismatch: lacks,
            });
        }
    }
}

/// Whether `haystack` holds `needle` (not empty), byte for byte.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_match_is_found_across_reads_and_never_past_the_bytes() {
        assert!(contains(b"+PONG\r\n", b"+PONG"));
        assert!(!contains(b"+PON", b"+PONG"));
        assert!(!contains(b"", b"x"));
    }
}
