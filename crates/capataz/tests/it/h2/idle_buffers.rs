//! The patched h2 (`vendor/h2`, CAPATAZ.md) frees a connection's read and write buffers
//! whenever it is idle (no stream, everything flushed) and allocates them again for the next
//! frame. These tests drive a connection through such idle moments at the points where a
//! buffer could still hold something: a frame's first bytes read but not its end, a header
//! block whose CONTINUATION has not come yet, an answer held by a closed flow-control window,
//! PINGs one at a time, a GOAWAY from the client, and `h2c` backend connections between
//! requests. Pauses only give the server time to read what was sent and go idle; no result
//! depends on them (each waits on frames or counts, with a deadline).

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::{balancer, echo_backend};
use crate::support::h2frames::{
    self, continuation, frame, handshake, handshake_with, headers, ping, read_frame, read_to_end,
    request_block, settings, Frame, DATA, END_STREAM, GOAWAY, NO_ERROR, PING, WINDOW_UPDATE,
};
use crate::support::raw::{ok_answer, read_body, read_head, RawBackend};
use crate::support::DEADLINE;

/// Long enough for the balancer to read what was just sent and go back to waiting.
const PAUSE: Duration = Duration::from_millis(30);

/// `:status: 200` as h2's HPACK encoder writes it (static table index 8, indexed).
const STATUS_200: u8 = 0x88;

/// Reads frames until one satisfies `want`, failing on the deadline or the end of the
/// connection; the frames skipped are returned with it.
async fn read_until(read: &mut OwnedReadHalf, want: impl Fn(&Frame) -> bool) -> Vec<Frame> {
    let mut seen = Vec::new();
    loop {
        let frame = tokio::time::timeout(DEADLINE, read_frame(read))
            .await
            .unwrap_or_else(|_| panic!("no awaited frame within the deadline: {seen:?}"))
            .unwrap_or_else(|| panic!("the connection ended: {seen:?}"));
        let done = want(&frame);
        seen.push(frame);
        if done {
            return seen;
        }
    }
}

/// A PING with `payload`, and its acknowledgement read: once it is, the balancer has read
/// everything sent before it and flushed its answer (and, with no stream open, gone idle).
async fn ping_barrier(read: &mut OwnedReadHalf, write: &mut OwnedWriteHalf, payload: [u8; 8]) {
    write.write_all(&ping(payload)).await.expect("send a PING");
    let seen = read_until(read, |f| f.kind == PING).await;
    let ack = seen.last().unwrap();
    assert_eq!(
        (ack.flags, ack.payload.as_slice()),
        (h2frames::ACK, &payload[..])
    );
}

/// The whole answer on `stream`: its HEADERS (checked to be a 200) and its DATA to END_STREAM.
async fn answer_body(read: &mut OwnedReadHalf, stream: u32) -> Vec<u8> {
    let seen = read_until(read, |f| f.kind == h2frames::HEADERS && f.stream == stream).await;
    let head = seen.last().unwrap();
    assert_eq!(head.payload.first(), Some(&STATUS_200), "{head:?}");
    let mut body = Vec::new();
    if head.flags & END_STREAM != 0 {
        return body;
    }
    loop {
        let seen = read_until(read, |f| f.kind == DATA && f.stream == stream).await;
        let data = seen.last().unwrap();
        body.extend_from_slice(&data.payload);
        if data.flags & END_STREAM != 0 {
            return body;
        }
    }
}

/// Writes `bytes` in the pieces cut at `cuts`, pausing after each but the last.
async fn write_in_pieces(write: &mut OwnedWriteHalf, bytes: &[u8], cuts: &[usize]) {
    let mut from = 0;
    for &to in cuts.iter().chain([bytes.len()].iter()) {
        write
            .write_all(&bytes[from..to])
            .await
            .expect("write a piece");
        from = to;
        if to < bytes.len() {
            tokio::time::sleep(PAUSE).await;
        }
    }
}

#[tokio::test]
async fn a_head_arriving_in_pieces_on_an_idle_connection_is_answered_whole() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    ping_barrier(&mut read, &mut write, *b"idle-0-0").await;
    for (round, stream) in [1u32, 3, 5, 7].into_iter().enumerate() {
        let path = format!("/pieces/{round}");
        let mut block = request_block("GET", "app.test", &path);
        block.extend(h2frames::hpack(&[("x-round", &"r".repeat(3000 + round))]));
        // HEADERS with the first part of the block, CONTINUATION with the rest: between them
        // the balancer has read a whole frame, has no stream yet, and waits.
        let half = block.len() / 2;
        let mut bytes = headers(stream, &block[..half], true, false);
        let head_len = bytes.len();
        bytes.extend(continuation(stream, &block[half..], true));
        // Cut inside the first frame's 9-byte head, inside its payload, right after it (the
        // header block incomplete), and inside the CONTINUATION frame's head and payload.
        let cuts = [4, 9 + 100, head_len, head_len + 5, head_len + 600];
        write_in_pieces(&mut write, &bytes, &cuts).await;
        let body = String::from_utf8(answer_body(&mut read, stream).await).expect("text");
        assert!(
            body.starts_with(&format!("GET {path} HTTP/1.1\r\n")),
            "{body}"
        );
        assert!(body.contains(&"r".repeat(3000 + round)), "round {round}");
        assert!(body.ends_with("body=0"), "{body}");
        // Idle again (the stream is over, its answer flushed) before the next request.
        ping_barrier(&mut read, &mut write, *b"idle-0-1").await;
    }
    assert_eq!(backend.hits(), 4);
}

/// A backend answering every request with `size` bytes of a repeating pattern.
async fn large_backend(size: usize) -> RawBackend {
    RawBackend::start(move |mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if read_body(&mut stream, &mut buf, &head).await.is_none() {
                return;
            }
            let body: String = (0..size)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            if stream.write_all(ok_answer(&body).as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

/// A WINDOW_UPDATE of `increment` on `stream` (0: the connection).
fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

#[tokio::test]
async fn a_large_answer_held_by_a_closed_window_comes_whole_as_it_opens() {
    const SIZE: usize = 200_000;
    let backend = large_backend(SIZE).await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("big")], "", "").await;
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: no stream may carry DATA until its window is opened.
    let (mut read, mut write, _) = handshake_with(addr, settings(&[(0x4, 0)])).await;
    for (round, id) in [1u32, 3].into_iter().enumerate() {
        write
            .write_all(&headers(
                id,
                &request_block("GET", "app.test", "/big"),
                true,
                true,
            ))
            .await
            .unwrap();
        let seen = read_until(&mut read, |f| f.kind == h2frames::HEADERS && f.stream == id).await;
        assert_eq!(seen.last().unwrap().payload.first(), Some(&STATUS_200));
        // The answer waits on the window: no DATA before a PING's acknowledgement.
        let seen = {
            write.write_all(&ping(*b"window-0")).await.unwrap();
            read_until(&mut read, |f| f.kind == PING).await
        };
        assert!(
            seen.iter().all(|f| f.kind != DATA),
            "DATA with a closed window: {seen:?}"
        );
        // Opened a few odd-sized steps at a time, with pauses, to the end.
        let mut body = Vec::new();
        let mut granted = 0usize;
        let mut ended = false;
        while !ended {
            tokio::time::sleep(PAUSE).await;
            let step = 7_001 + 1_000 * round;
            granted += step;
            let mut updates = window_update(id, step as u32);
            updates.extend(window_update(0, step as u32));
            write.write_all(&updates).await.unwrap();
            while body.len() < granted.min(SIZE) {
                let seen = read_until(&mut read, |f| f.kind == DATA && f.stream == id).await;
                let data = seen.last().unwrap();
                body.extend_from_slice(&data.payload);
                ended = data.flags & END_STREAM != 0;
                if ended {
                    break;
                }
            }
            assert!(
                body.len() <= granted,
                "{} bytes past a window of {granted}",
                body.len()
            );
            if body.len() == SIZE && !ended {
                // END_STREAM may come on an empty DATA frame.
                let seen = read_until(&mut read, |f| f.kind == DATA && f.stream == id).await;
                let data = seen.last().unwrap();
                body.extend_from_slice(&data.payload);
                ended = data.flags & END_STREAM != 0;
            }
        }
        assert_eq!(body.len(), SIZE, "round {round}");
        assert!(body == pattern(SIZE), "round {round}: the body differs");
    }
    assert_eq!(backend.hits(), 2);
}

#[tokio::test]
async fn pings_one_at_a_time_on_an_idle_connection_are_each_answered_and_it_serves_after() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    // Each PING reaches an idle connection (buffers freed after the previous answer) and
    // must be answered with its own payload, the connection kept.
    for i in 0..2_000u64 {
        ping_barrier(&mut read, &mut write, i.to_be_bytes()).await;
    }
    // Empty SETTINGS and connection WINDOW_UPDATEs on the idle connection: acknowledged or
    // taken silently, the connection kept.
    for _ in 0..200 {
        let mut some = settings(&[]);
        some.extend(window_update(0, 1));
        write.write_all(&some).await.unwrap();
    }
    ping_barrier(&mut read, &mut write, *b"lastping").await;
    write
        .write_all(&headers(
            1,
            &request_block("GET", "app.test", "/after"),
            true,
            true,
        ))
        .await
        .unwrap();
    let body = String::from_utf8(answer_body(&mut read, 1).await).unwrap();
    assert!(body.starts_with("GET /after HTTP/1.1\r\n"), "{body}");
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn a_goaway_from_the_client_on_an_idle_connection_closes_it_cleanly() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    write
        .write_all(&headers(
            1,
            &request_block("GET", "app.test", "/one"),
            true,
            true,
        ))
        .await
        .unwrap();
    let body = String::from_utf8(answer_body(&mut read, 1).await).unwrap();
    assert!(body.starts_with("GET /one HTTP/1.1\r\n"), "{body}");
    ping_barrier(&mut read, &mut write, *b"idlenow!").await;
    // GOAWAY, last stream 1, NO_ERROR, from the client on the idle connection.
    let mut payload = 1u32.to_be_bytes().to_vec();
    payload.extend(NO_ERROR.to_be_bytes());
    write
        .write_all(&frame(GOAWAY, 0, 0, &payload))
        .await
        .unwrap();
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert!(
        ending.closed,
        "the balancer closes the connection: {ending:?}"
    );
    assert!(
        ending.goaways.iter().all(|&code| code == NO_ERROR),
        "{ending:?}"
    );
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn answer_heads_larger_than_the_write_buffer_come_whole_after_idle_moments() {
    // A 40 KB answer head: h2 writes it as HEADERS then CONTINUATION frames, the rest of the
    // block pending in its encoder between flushes of its 16 KB write buffer.
    let backend = RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let n = hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) as usize;
            if read_body(&mut stream, &mut buf, &head).await.is_none() {
                return;
            }
            let pad = char::from(b'a' + (n % 26) as u8)
                .to_string()
                .repeat(40_000 + n);
            let answer = format!("HTTP/1.1 200 OK\r\nX-Pad: {pad}\r\nContent-Length: 2\r\n\r\nok");
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("pad")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    for (n, id) in [1u32, 3, 5, 7].into_iter().enumerate() {
        ping_barrier(&mut read, &mut write, *b"beforeit").await;
        write
            .write_all(&headers(
                id,
                &request_block("GET", "app.test", "/pad"),
                true,
                true,
            ))
            .await
            .unwrap();
        // HEADERS without END_HEADERS, then CONTINUATION frames to END_HEADERS: the block whole.
        let seen = read_until(&mut read, |f| f.kind == h2frames::HEADERS && f.stream == id).await;
        let first = seen.last().unwrap();
        assert_eq!(first.payload.first(), Some(&STATUS_200));
        let mut block = first.payload.clone();
        let mut flags = first.flags;
        while flags & h2frames::END_HEADERS == 0 {
            let next = tokio::time::timeout(DEADLINE, read_frame(&mut read))
                .await
                .expect("the rest of the block in time")
                .expect("the connection stays open");
            assert_eq!((next.kind, next.stream), (h2frames::CONTINUATION, id));
            block.extend_from_slice(&next.payload);
            flags = next.flags;
        }
        // The value is sent as a literal (too large for HPACK's table), possibly Huffman-coded:
        // its length at least shows it whole (Huffman codes a letter in at least 5 bits).
        assert!(
            block.len() > (40_000 + n) * 5 / 8,
            "{} bytes of block",
            block.len()
        );
        let body = answer_body_after_head(&mut read, id).await;
        assert_eq!(body, b"ok");
    }
    // And decoded by hyper's client, one request at a time on one connection: the value whole.
    // (hyper's client takes heads up to 16 KB unless told more.)
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .max_header_list_size(1 << 20)
            .handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/2 handshake");
    let mut conn = crate::support::h2client::H2Conn {
        sender,
        conn: tokio::spawn(conn),
    };
    for n in 4..8usize {
        let answer = conn.get("app.test", "/pad").await;
        let pad = char::from(b'a' + (n % 26) as u8)
            .to_string()
            .repeat(40_000 + n);
        assert_eq!(answer.header("x-pad"), Some(pad.as_str()), "request {n}");
        assert_eq!(answer.body.as_ref(), b"ok");
    }
    assert_eq!(backend.hits(), 8);
}

/// The DATA of `stream` to END_STREAM, its head already read.
async fn answer_body_after_head(read: &mut OwnedReadHalf, stream: u32) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let seen = read_until(read, |f| f.kind == DATA && f.stream == stream).await;
        let data = seen.last().unwrap();
        body.extend_from_slice(&data.payload);
        if data.flags & END_STREAM != 0 {
            return body;
        }
    }
}

#[tokio::test]
async fn a_large_answer_to_a_client_that_reads_late_comes_whole_and_the_connection_serves_on() {
    // The client opens its windows wide and reads nothing for a while once the request is at
    // the backend: h2's write buffer stays half-written while the sockets are full, and if the
    // answer's end reaches h2 before the client reads, its last DATA frame (END_STREAM) waits
    // there with its stream over: no stream, but not flushed (the connection is not idle).
    const SIZE: usize = 8 << 20;
    let backend = large_backend(SIZE).await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("big")], "", "").await;
    let mut start = settings(&[(0x4, (1 << 31) - 1)]);
    start.extend(window_update(0, (1 << 31) - 1 - 65_535));
    let (mut read, mut write, _) = handshake_with(addr, start).await;
    for (round, id) in [1u32, 3].into_iter().enumerate() {
        write
            .write_all(&headers(
                id,
                &request_block("GET", "app.test", "/big"),
                true,
                true,
            ))
            .await
            .unwrap();
        crate::support::wait::wait_until("the request at the backend", || {
            backend.hits() == round as u64 + 1
        })
        .await;
        // Long enough for the answer to fill the sockets between them; not needed for the
        // result, which is read whole in any case.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let body = answer_body(&mut read, id).await;
        assert_eq!(body.len(), SIZE, "round {round}");
        assert!(body == pattern(SIZE), "round {round}: the body differs");
        ping_barrier(&mut read, &mut write, *b"afterbig").await;
    }
}
