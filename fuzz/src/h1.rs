//! Checks for the `h1_response` target: capataz's reading of a backend's answer (`capataz_h1`)
//! on any bytes, arriving in pieces of any size.
//!
//! The first byte picks the request method (GET or HEAD) and the size of the pieces the rest
//! arrives in. The head parser must not panic, must take exactly a complete head off the
//! buffer, and must agree with itself whatever the pieces; the framing must not panic; a
//! chunked body must not yield more bytes than arrived, nor data from an empty buffer.

use bytes::BytesMut;
use capataz_h1::body::{BodyError, BodyReader, Step};
use capataz_h1::chunked::{Decoded, Decoder};
use capataz_h1::framing::{self, BodyLength, Framing};
use capataz_h1::head;
use http::Method;

/// The same limit as capataz's backend connections.
const MAX_HEAD: usize = 65536;

/// Runs every check on one input; panics on the first violation.
pub fn check(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let method = if first & 1 == 0 {
        Method::GET
    } else {
        Method::HEAD
    };
    let step = usize::from(first >> 1) % 16 + 1;

    // Whole, then in pieces: the same verdict.
    let mut whole = BytesMut::from(rest);
    let at_once = head::parse(&mut whole, MAX_HEAD);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let in_pieces = loop {
        let parsed = head::parse(&mut buf, MAX_HEAD);
        match parsed {
            Ok(None) if fed < rest.len() => {
                let end = (fed + step).min(rest.len());
                buf.extend_from_slice(&rest[fed..end]);
                fed = end;
            }
            other => break other,
        }
    };
    match (&at_once, &in_pieces) {
        (Ok(Some(a)), Ok(Some(b))) => {
            assert_eq!((a.status, a.version), (b.status, b.version));
            assert_eq!(a.headers, b.headers);
            // What is left is the same tail of the input.
            assert!(
                rest.ends_with(&whole),
                "the whole-input parse left {whole:?}"
            );
            assert!(
                rest[..fed].ends_with(&buf),
                "the piecewise parse left {buf:?}"
            );
            assert_eq!(
                rest.len() - whole.len(),
                fed - buf.len(),
                "different head lengths"
            );
        }
        (Ok(None), Ok(None)) => assert_eq!(whole.len(), rest.len()),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("whole: {a:?}, in pieces: {b:?}"),
    }
    let Ok(Some(head)) = at_once else {
        return;
    };
    let Ok(framing) = framing::response(&method, &head) else {
        return;
    };
    if method == Method::HEAD {
        assert_eq!(framing.body, BodyLength::Empty);
    }
    // The body reader (every framing): whole or in pieces, the same body, end and reuse.
    let body = whole.to_vec();
    assert_eq!(read_body(framing, &body, body.len().max(1)), read_body(framing, &body, step));
    if framing.body != BodyLength::Chunked {
        return;
    }
    // The body, in pieces.
    let body = whole.to_vec();
    let mut decoder = Decoder::default();
    let mut buf = BytesMut::new();
    let (mut fed, mut out) = (0, 0);
    loop {
        let before = buf.len();
        match decoder.decode(&mut buf) {
            Ok(Decoded::Data(data)) => {
                assert!(
                    !data.is_empty() && data.len() <= before,
                    "data from nothing"
                );
                out += data.len();
                assert!(out <= fed, "more bytes out than in");
            }
            Ok(Decoded::NeedMore) if fed < body.len() => {
                let end = (fed + step).min(body.len());
                buf.extend_from_slice(&body[fed..end]);
                fed = end;
            }
            Ok(Decoded::NeedMore) | Ok(Decoded::End(_)) | Err(_) => return,
        }
    }
}

/// Reads `body` framed as `framing` says, fed `step` bytes at a time then the end of the
/// stream: the body, how it ended, and whether the connection would be reused.
fn read_body(framing: Framing, body: &[u8], step: usize) -> (Vec<u8>, Result<(), BodyError>, bool) {
    let mut reader = BodyReader::new(framing);
    let mut buf = BytesMut::new();
    let (mut fed, mut out) = (0, Vec::new());
    let end = loop {
        if reader.is_done() {
            break Ok(());
        }
        let before = buf.len();
        match reader.decode(&mut buf) {
            Ok(Step::Data(data)) => {
                assert!(!data.is_empty() && data.len() <= before, "data from nothing");
                out.extend_from_slice(&data);
            }
            Ok(Step::End) => break Ok(()),
            Ok(Step::NeedMore) if fed < body.len() => {
                let end = (fed + step).min(body.len());
                buf.extend_from_slice(&body[fed..end]);
                fed = end;
            }
            Ok(Step::NeedMore) => break reader.handle_eof(),
            Err(error) => break Err(error),
        }
    };
    assert!(out.len() <= body.len(), "more bytes out than in");
    // Whatever followed the body arrives before the connection is judged.
    buf.extend_from_slice(&body[fed..]);
    let reusable = reader.reusable(&buf);
    (out, end, reusable)
}
