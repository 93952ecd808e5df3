//! A `content-length` that the body does not match is a stream error (RFC 9113 8.1.1), on
//! both of capataz's HTTP/2 sides: a client's request stream to capataz, and a backend's
//! answer to capataz as the HTTP/2 client. vendor/h2 patch 0013 looks the field up only in a
//! header block that noted one while it was decoded; these cases put the field wherever a
//! block can carry it (a HEADERS frame, a CONTINUATION, twice, by the static table's name)
//! and check that the stream is still reset with PROTOCOL_ERROR, as upstream h2 does. Also:
//! a connection whose streams are opened, reset and reopened many times still goes idle and
//! is closed once they are gone (the connection's idea of whether it has streams is not stale).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::balancer;
use crate::support::balancer::{start, ConfigText};
use crate::support::h2frames::{
    continuation, data, handshake, headers, hpack, read_frame, read_to_end, request_block,
    rst_stream, settings, settings_ack, CANCEL, DATA, END_STREAM, HEADERS, RST_STREAM, SETTINGS,
};
use crate::support::raw::length_backend;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// PROTOCOL_ERROR.
const PROTOCOL_ERROR: u32 = 1;

/// `content-length: <value>` as a literal without indexing whose name is the static table's
/// entry 28 (`content-length`), not a literal name.
fn indexed_name_content_length(value: &str) -> Vec<u8> {
    let mut out = vec![0x0f, 28 - 15, value.len() as u8];
    out.extend_from_slice(value.as_bytes());
    out
}

/// A POST's header block, then `extra` fields.
fn post_block(extra: &[(&str, &str)]) -> Vec<u8> {
    let mut block = request_block("POST", "app.test", "/upload");
    block.extend(hpack(extra));
    block
}

/// Writes `frames` on a new connection and returns what became of stream 1: the code of the
/// RST_STREAM it got, or `None` if it was answered to its end.
async fn fate(addr: SocketAddr, frames: &[u8]) -> Option<u32> {
    let (mut read, mut write, _) = handshake(addr).await;
    write.write_all(frames).await.expect("send the request");
    let ending = async {
        loop {
            let frame = read_frame(&mut read)
                .await
                .expect("the connection stays open until stream 1 ends");
            if frame.stream != 1 {
                continue;
            }
            match frame.kind {
                RST_STREAM => {
                    return Some(u32::from_be_bytes(frame.payload[..4].try_into().unwrap()))
                }
                HEADERS | DATA if frame.flags & END_STREAM != 0 => return None,
                _ => {}
            }
        }
    };
    tokio::time::timeout(DEADLINE, ending)
        .await
        .expect("stream 1 ends before the deadline")
}

#[tokio::test]
async fn request_bodies_that_do_not_match_their_content_length_reset_the_stream() {
    let backend = length_backend().await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
    let long = [b'x'; 10];
    let short = [b'x'; 3];
    let trailers = hpack(&[("x-trailer", "1")]);
    let cases: Vec<(&str, Vec<u8>, Option<u32>)> = vec![
        (
            "matching: answered",
            [
                headers(1, &post_block(&[("content-length", "5")]), false, true),
                data(1, &long[..5], true),
            ]
            .concat(),
            None,
        ),
        (
            "no content-length: answered",
            [
                headers(1, &post_block(&[]), false, true),
                data(1, &long, true),
            ]
            .concat(),
            None,
        ),
        (
            "longer",
            [
                headers(1, &post_block(&[("content-length", "5")]), false, true),
                data(1, &long, true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "shorter",
            [
                headers(1, &post_block(&[("content-length", "5")]), false, true),
                data(1, &short, true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "shorter, then trailers",
            [
                headers(1, &post_block(&[("content-length", "5")]), false, true),
                data(1, &short, false),
                headers(1, &trailers, true, true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "longer, the field in a CONTINUATION",
            [
                headers(1, &post_block(&[("accept", "*/*")]), false, false),
                continuation(1, &hpack(&[("content-length", "5")]), true),
                data(1, &long, true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "shorter, the field in a second CONTINUATION",
            [
                headers(1, &post_block(&[]), false, false),
                continuation(1, &hpack(&[("accept", "*/*")]), false),
                continuation(1, &hpack(&[("content-length", "5")]), true),
                data(1, &short, true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "longer, the name from the static table",
            [
                headers(
                    1,
                    &[post_block(&[]), indexed_name_content_length("5")].concat(),
                    false,
                    true,
                ),
                data(1, &long, true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "longer, the field twice",
            [
                headers(
                    1,
                    &post_block(&[("content-length", "5"), ("content-length", "5")]),
                    false,
                    true,
                ),
                data(1, &long, true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "two that differ",
            [
                headers(
                    1,
                    &post_block(&[("content-length", "5"), ("content-length", "6")]),
                    false,
                    true,
                ),
                data(1, &long[..5], true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "not a number",
            [
                headers(1, &post_block(&[("content-length", "5x")]), false, true),
                data(1, &long[..5], true),
            ]
            .concat(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "non-zero with END_STREAM on the head",
            headers(1, &post_block(&[("content-length", "5")]), true, true),
            Some(PROTOCOL_ERROR),
        ),
    ];
    for (name, frames, expected) in cases {
        assert_eq!(fate(addr, &frames).await, expected, "{name}");
    }
}

/// What an HTTP/2 backend speaking raw frames answers each request with: `content-length:
/// <declared>` and a body of `sent` bytes, with END_STREAM.
#[derive(Clone, Copy)]
struct Answer {
    declared: &'static str,
    sent: usize,
    /// The field in a CONTINUATION of its own rather than in the HEADERS frame.
    in_continuation: bool,
}

/// An h2c backend that answers every request as `answer` says and records each RST_STREAM
/// capataz sends it, with its code.
async fn raw_h2_backend(answer: Answer) -> (SocketAddr, Arc<Mutex<Vec<(u32, u32)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let resets = Arc::new(Mutex::new(Vec::new()));
    let seen = resets.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let (mut read, mut write) = stream.into_split();
                let mut preface = [0u8; 24];
                if read.read_exact(&mut preface).await.is_err() {
                    return;
                }
                if write.write_all(&settings(&[])).await.is_err() {
                    return;
                }
                while let Some(frame) = read_frame(&mut read).await {
                    let reply = match frame.kind {
                        SETTINGS if frame.flags & 1 == 0 => settings_ack(),
                        HEADERS => {
                            let status = hpack(&[(":status", "200")]);
                            let length = hpack(&[("content-length", answer.declared)]);
                            let head = if answer.in_continuation {
                                [
                                    headers(frame.stream, &status, false, false),
                                    continuation(frame.stream, &length, true),
                                ]
                                .concat()
                            } else {
                                headers(frame.stream, &[status, length].concat(), false, true)
                            };
                            [head, data(frame.stream, &vec![b'y'; answer.sent], true)].concat()
                        }
                        RST_STREAM if frame.payload.len() == 4 => {
                            let code = u32::from_be_bytes(frame.payload[..4].try_into().unwrap());
                            seen.lock().unwrap().push((frame.stream, code));
                            continue;
                        }
                        _ => continue,
                    };
                    if write.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, resets)
}

/// An HTTP/1.1 GET to `addr`, the answer read to its end (or to the deadline).
async fn get(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .expect("send the request");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn answers_from_an_h2_backend_that_do_not_match_their_content_length_are_reset() {
    let cases = [
        ("longer", "5", 10, false, true),
        ("shorter", "5", 3, false, true),
        ("longer, the field in a CONTINUATION", "5", 10, true, true),
        ("shorter, the field in a CONTINUATION", "5", 3, true, true),
        ("matching", "5", 5, false, false),
    ];
    for (name, declared, sent, in_continuation, reset) in cases {
        let (backend, resets) = raw_h2_backend(Answer {
            declared,
            sent,
            in_continuation,
        })
        .await;
        let text = ConfigText::new(&[("b0".to_string(), backend)])
            .extra(
                "protocol = \"h2c\"\nactive.kind = \"none\"\n\
                 passive.consecutive_errors = 1000\nretries = { attempts = 0 }\n",
            )
            .build();
        let (balancer, _events) = start(&text).await;
        let answer = get(balancer.local_addrs()[0]).await;
        if reset {
            wait_until(
                &format!("{name}: capataz resets the answer's stream"),
                || {
                    resets
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|&(_, code)| code == PROTOCOL_ERROR)
                },
            )
            .await;
            assert!(
                !answer.ends_with("\r\n\r\nyyyyy") || answer.starts_with("HTTP/1.1 5"),
                "{name}: {answer:?}"
            );
        } else {
            assert!(
                answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\nyyyyy"),
                "{name}: {answer:?}"
            );
            assert!(
                !resets
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|&(_, code)| code == PROTOCOL_ERROR),
                "{name}"
            );
        }
        balancer.shutdown(DEADLINE).await;
    }
}

#[tokio::test]
async fn streams_reset_and_reopened_many_times_leave_the_connection_idle_and_closed() {
    let backend = length_backend().await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("b0")], "idle_timeout = \"1s\"", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    let mut id = 1;
    for round in 0..30 {
        // A POST left open, cancelled by the client, then a POST answered on a new stream.
        let open = headers(id, &post_block(&[("content-length", "9")]), false, true);
        let cancel = rst_stream(id, CANCEL);
        let answered = [
            headers(id + 2, &post_block(&[("content-length", "4")]), false, true),
            data(id + 2, b"abcd", true),
        ]
        .concat();
        write
            .write_all(&[open, cancel, answered].concat())
            .await
            .expect("send a round");
        let ended = async {
            loop {
                let frame = read_frame(&mut read)
                    .await
                    .expect("the connection stays open");
                if frame.stream == id + 2 && frame.kind == DATA && frame.flags & END_STREAM != 0 {
                    break;
                }
                assert!(
                    !(frame.kind == RST_STREAM && frame.stream == id + 2),
                    "round {round}: {frame:?}"
                );
            }
        };
        tokio::time::timeout(DEADLINE, ended)
            .await
            .unwrap_or_else(|_| panic!("round {round}: stream {} answered", id + 2));
        id += 4;
    }
    // No stream left: the connection is idle, gets its GOAWAY and is closed.
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert!(ending.closed, "{ending:?}");
    assert_eq!(ending.goaways, [0], "{ending:?}");
}

#[tokio::test]
async fn a_drain_with_uploads_open_lets_them_finish_then_closes_the_connection() {
    let backend = length_backend().await;
    let (balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    // Three uploads, half sent: each reaches a backend connection of its own and waits there.
    let mut opened = Vec::new();
    for id in [1, 3, 5] {
        opened.extend(headers(
            id,
            &post_block(&[("content-length", "4")]),
            false,
            true,
        ));
        opened.extend(data(id, b"ab", false));
    }
    write.write_all(&opened).await.expect("open the uploads");
    wait_until("the three uploads reach the backend", || {
        backend.accepted() == 3
    })
    .await;
    let shutdown = tokio::spawn(balancer.shutdown(DEADLINE));
    // The drain's GOAWAY comes while the streams are open; the connection stays open.
    let goaway = tokio::time::timeout(DEADLINE, async {
        loop {
            let frame = read_frame(&mut read)
                .await
                .expect("the connection stays open");
            assert_ne!(frame.kind, RST_STREAM, "{frame:?}");
            if let Some(code) = frame.goaway_code() {
                return code;
            }
        }
    })
    .await
    .expect("a GOAWAY once the drain starts");
    assert_eq!(goaway, 0);
    // One upload is cancelled, the other two end: they are answered, then the connection,
    // with no stream left, is closed.
    let rest = [
        rst_stream(3, CANCEL),
        data(1, b"cd", true),
        data(5, b"cd", true),
    ]
    .concat();
    write.write_all(&rest).await.expect("end the uploads");
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert!(ending.closed, "{ending:?}");
    let mut answered = ending.answered.clone();
    answered.sort_unstable();
    assert_eq!(answered, [1, 5], "{ending:?}");
    assert!(ending.resets.is_empty(), "{ending:?}");
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .expect("the drain ends")
        .expect("the drain's task");
}
