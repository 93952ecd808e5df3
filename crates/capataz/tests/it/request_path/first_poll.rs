//! A backend body that breaks at the very first read capataz makes of it (after the head was
//! read, so `proxy::forward` saw nothing wrong): the client still gets the status line and
//! headers, then a cut body, never a bare close.

use capataz_health::Outcome;
use tokio::io::AsyncWriteExt;

use super::{balancer, charged, GET};
use crate::support::raw::{find, raw_roundtrip, read_body, read_head, RawBackend};

/// capataz reads a backend's head with a first read of at most 2048 bytes
/// (`upstream::FIRST_READ`), so a head of exactly that size is read alone, whatever follows it
/// in the same segment; the bytes after it wait in the socket for the body's first poll.
const FIRST_READ: usize = 2048;

/// A chunked answer's head padded to exactly `FIRST_READ` bytes.
fn padded_head() -> Vec<u8> {
    let start = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Pad: ";
    let end = "\r\n\r\n";
    let pad = FIRST_READ - start.len() - end.len();
    let head = format!("{start}{}{end}", "p".repeat(pad));
    assert_eq!(head.len(), FIRST_READ);
    head.into_bytes()
}

/// A backend that answers each request with a chunked head of exactly `FIRST_READ` bytes and a
/// malformed chunk size in the same write, so that the head read takes the head alone and the
/// body's first poll meets the bad bytes; then it holds the connection open (capataz, not the
/// backend, ends the exchange).
async fn breaking_backend() -> RawBackend {
    RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        if let Some(head) = read_head(&mut stream, &mut buf).await {
            if read_body(&mut stream, &mut buf, &head).await.is_some() {
                let mut answer = padded_head();
                answer.extend_from_slice(b"zz\r\nnot a chunk\r\n");
                let _ = stream.write_all(&answer).await;
                let _ = stream.flush().await;
            }
        }
        let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut [0u8; 1]).await;
    })
    .await
}

/// Regression ("never a bare close with no status"): the body's first poll failed
/// with nothing flushed, and hyper then wrote nothing at all. The head and a malformed chunk
/// size go out in one write, so they arrive together, deterministically: the head read takes
/// the head alone and the first poll of the body meets the bad bytes.
#[tokio::test]
async fn a_body_broken_at_its_first_poll_still_gets_the_status_line() {
    let backend = breaking_backend().await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    let answer = raw_roundtrip(addr, GET).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\n"),
        "the status line, not a bare close: {text:?}"
    );
    let end = find(&answer, b"\r\n\r\n").expect("a whole head");
    let head = text[..end].to_ascii_lowercase();
    assert!(head.contains("x-pad: ppp"), "the headers: {head}");
    assert!(
        !answer.ends_with(b"0\r\n\r\n"),
        "the body is cut, not ended: {text:?}"
    );
    // As for any body that breaks: a reset, charged to the backend.
    assert_eq!(charged(&balancer, 0), [Outcome::Reset]);
}

/// The same over TLS: the client's writes go through the TLS stream after being put off to
/// the end of the turn; the head still reaches the client before the connection ends.
#[tokio::test]
async fn a_body_broken_at_its_first_poll_still_gets_the_status_line_over_tls() {
    use tokio::io::AsyncReadExt;
    let backend = breaking_backend().await;
    let pki = crate::support::tls::Pki::new();
    let (cert, key) = pki.server("first-poll", &["localhost"], None);
    let listener = crate::support::tls::Pki::listener(&[(&cert, &key)], "");
    let (_balancer, addr) = balancer(&[backend.addr], &listener, "").await;
    for _ in 0..20 {
        let mut stream = crate::support::tls::Client::trusting(&pki)
            .connect(addr, "localhost")
            .await
            .expect("TLS handshake");
        stream.write_all(GET).await.expect("request");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\n"),
            "the status line, not a bare close: {text:?}"
        );
    }
}
