//! A `tcp` check with an exchange (HAProxy's `tcp-check send` / `send-binary` then `tcp-check
//! expect string` / `rbinary "^..."`): connect, write `send`, and read until the answer holds
//! `expect_text` (anywhere in its first [`MAX_TCP_ANSWER`] bytes) or starts with
//! `expect_hex`'s bytes, all within the probe's one deadline; over TLS when the pool speaks
//! TLS to its backends.

use std::io;
use std::net::SocketAddr;

use capataz_health::{Mismatch, Outcome, ProbeOutcome, Snippet};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::config::{TcpExchange, TcpExpect, MAX_TCP_ANSWER};
use crate::tls::backend::Connector;

/// One exchange with the backend at `addr`, `preamble` (a PROXY protocol header) written
/// first. Passes (`Connected`) once `send` is written when nothing is expected, else once the
/// answer holds what is expected. An answer that ends, fills [`MAX_TCP_ANSWER`] bytes, or
/// (with `expect_hex`) starts otherwise, without it is a mismatch (`answer did not contain
/// "+PONG"`, `answer did not start with hex "52"`); a connection closed before any answer
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
        return exchange_on(stream, exchange, deadline).await;
    };
    let handshake = tokio::time::timeout_at(deadline, tls.connect_probe(stream));
    match handshake.await.map_err(|_| late())? {
        Ok(stream) => Box::pin(exchange_on(stream, exchange, deadline)).await,
        Err(error) if error.kind() == io::ErrorKind::InvalidData => Ok(Outcome::Tls.into()),
        Err(error) => Err(error),
    }
}

/// The exchange of [`probe`] on a connected `stream` (TCP, TLS, or a Unix socket's).
pub(super) async fn exchange_on<S>(
    mut stream: S,
    exchange: &TcpExchange,
    deadline: Instant,
) -> io::Result<ProbeOutcome>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let late = || io::Error::from(io::ErrorKind::TimedOut);
    if !exchange.send.is_empty() {
        let write = tokio::time::timeout_at(deadline, stream.write_all(&exchange.send));
        write.await.map_err(|_| late())??;
    }
    let Some(expected) = &exchange.expect else {
        return Ok(Outcome::Connected.into());
    };
    let lacks = Some(mismatch(expected));
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
        let seen = answer.len();
        answer.extend_from_slice(&chunk[..n]);
        match verdict(expected, &answer, seen) {
            Some(true) => return Ok(Outcome::Connected.into()),
            Some(false) => {
                return Ok(ProbeOutcome {
                    outcome: Outcome::Connected,
                    mismatch: lacks,
                })
            }
            None if n == 0 || answer.len() >= MAX_TCP_ANSWER => {
                return Ok(ProbeOutcome {
                    outcome: Outcome::Connected,
                    mismatch: lacks,
                })
            }
            None => {}
        }
    }
}

/// Whether `answer` (its first `seen` bytes already judged undecided) holds `expected`:
/// `Some(true)` yes, `Some(false)` it never can (a start that differs), `None` not yet.
fn verdict(expected: &TcpExpect, answer: &[u8], seen: usize) -> Option<bool> {
    match expected {
        TcpExpect::Text(text) => {
            // Only the new bytes, and the last `text.len() - 1` before them, can hold a match
            // not seen yet: linear in the bytes read.
            let from = seen.saturating_sub(text.len() - 1);
            contains(&answer[from..], text.as_bytes()).then_some(true)
        }
        TcpExpect::Prefix(start) => {
            let common = answer.len().min(start.len());
            if answer[..common] != start[..common] {
                Some(false)
            } else if common == start.len() {
                Some(true)
            } else {
                None
            }
        }
    }
}

/// The mismatch an answer without `expected` is recorded with.
fn mismatch(expected: &TcpExpect) -> Mismatch {
    match expected {
        TcpExpect::Text(text) => Mismatch::AnswerLacks(Snippet::new(text)),
        TcpExpect::Prefix(start) => {
            // Only the first bytes' digits fit in a snippet; no more are written.
            let hex: String = start
                .iter()
                .take(Snippet::MAX / 2 + 1)
                .map(|byte| format!("{byte:02x}"))
                .collect();
            Mismatch::AnswerStart(Snippet::new(&hex))
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

    #[test]
    fn a_start_in_hex_is_decided_as_soon_as_the_bytes_agree_or_differ() {
        let start = TcpExpect::Prefix(vec![b'R', 0, 0]);
        assert_eq!(verdict(&start, b"R", 0), None, "too short to say");
        assert_eq!(verdict(&start, b"R\0\0\0\x08", 1), Some(true));
        assert_eq!(verdict(&start, b"E", 0), Some(false), "no need to read on");
        assert_eq!(verdict(&start, b"R\0\x01", 0), Some(false));
        let text = TcpExpect::Text("+PONG".into());
        assert_eq!(verdict(&text, b"xx+PO", 0), None);
        assert_eq!(verdict(&text, b"xx+PONG", 5), Some(true), "across reads");
    }

    #[test]
    fn a_start_that_differs_is_named_by_its_hex_digits() {
        let start = TcpExpect::Prefix(vec![0x52, 0x0a]);
        assert_eq!(
            mismatch(&start).to_string(),
            "answer did not start with hex \"520a\""
        );
        let long = TcpExpect::Prefix(vec![0xab; 256]);
        assert_eq!(
            mismatch(&long).to_string(),
            format!("answer did not start with hex \"{}...\"", "ab".repeat(20))
        );
    }
}
