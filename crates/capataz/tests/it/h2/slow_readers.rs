//! HTTP/2 clients that do not read their answers (a stream window of 0, announced in their
//! SETTINGS): each such answer holds a backend connection, so it ends once the client has taken
//! nothing of it for the pool's `timeouts.body_idle` (the stream reset, `CANCEL`; the backend
//! connection closed; the client charged, not the backend), and one client connection's
//! streams hold at most `max_backend_connections` backend connections at once. A client that
//! reads slowly but steadily is not cut.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::{balancer, charged};
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::h2frames::{
    frame, handshake_with, headers, read_frame, request_block, settings, CANCEL, DATA, HEADERS,
    RST_STREAM, WINDOW_UPDATE,
};
use crate::support::raw::{read_head, RawBackend};
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// SETTINGS_INITIAL_WINDOW_SIZE.
const INITIAL_WINDOW_SIZE: u16 = 4;

/// A keep-alive backend whose every answer is `size` bytes of body.
async fn sized_backend(size: usize) -> RawBackend {
    RawBackend::start(move |mut stream, hits| async move {
        let mut buf = Vec::new();
        while read_head(&mut stream, &mut buf).await.is_some() {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 64 * 1024];
            let mut left = size;
            while left > 0 {
                let n = left.min(chunk.len());
                if stream.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                left -= n;
            }
        }
    })
    .await
}

/// A client connection whose streams start with a window of 0: it reads nothing of any answer
/// until it says so.
async fn shut_window_client(addr: std::net::SocketAddr) -> (OwnedReadHalf, OwnedWriteHalf) {
    let (read, write, _) = handshake_with(addr, settings(&[(INITIAL_WINDOW_SIZE, 0)])).await;
    (read, write)
}

/// Opens `count` GET streams (1, 3, 5, ...) at once.
async fn open_streams(write: &mut OwnedWriteHalf, count: u32) {
    let mut burst = Vec::new();
    for i in 0..count {
        burst.extend(headers(
            2 * i + 1,
            &request_block("GET", "app.test", "/"),
            true,
            true,
        ));
    }
    write.write_all(&burst).await.expect("open the streams");
}

/// Reads frames until `streams` streams have been reset (returned: stream and code), checking
/// at every answer head that no more than `most` answered streams are still open (an answer
/// holds a backend connection until its stream ends).
async fn until_reset(read: &mut OwnedReadHalf, streams: usize, most: usize) -> Vec<(u32, u32)> {
    let mut open = Vec::new();
    let mut resets = Vec::new();
    let reading = async {
        while resets.len() < streams {
            let frame = read_frame(read).await.expect("the connection stays open");
            match frame.kind {
                HEADERS => {
                    open.push(frame.stream);
                    assert!(
                        open.len() <= most,
                        "answers open at once: {open:?} (at most {most})"
                    );
                }
                RST_STREAM => {
                    let code = u32::from_be_bytes(frame.payload[..4].try_into().unwrap());
                    open.retain(|s| *s != frame.stream);
                    resets.push((frame.stream, code));
                }
                DATA => panic!("data on a shut window: {frame:?}"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(DEADLINE, reading)
        .await
        .unwrap_or_else(|_| panic!("{streams} streams reset in time; resets so far: {resets:?}"));
    resets
}

#[tokio::test]
async fn h2_clients_that_read_nothing_no_longer_pin_backend_connections() {
    let backend = sized_backend(4 << 20).await;
    let logs = LogDir::new();
    let path = logs.path("access.log");
    let (balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        &format!("idle_timeout = \"60s\"\n{}", table(&path, "json", "")),
        "timeouts.body_idle = \"2s\"",
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (mut read, mut write) = shut_window_client(addr).await;
        open_streams(&mut write, 10).await;
        clients.push(tokio::spawn(async move {
            let resets = until_reset(&mut read, 10, 10).await;
            (resets, read, write)
        }));
    }
    for client in clients {
        let (resets, _read, _write) = client.await.expect("the client's task");
        assert!(resets.iter().all(|&(_, code)| code == CANCEL), "{resets:?}");
    }
    // Every backend connection let go (closed: an answer not read to its end is not reused).
    wait_until("the backend connections closed", || backend.closed() == 20).await;
    assert_eq!(backend.accepted(), 20);
    // The client's doing: the backend was charged its answers' statuses only.
    let outcomes = charged(&balancer, 0);
    assert_eq!(outcomes.len(), 20, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| *o == capataz_health::Outcome::Status(200)),
        "{outcomes:?}"
    );
    for line in wait_json(&path, 20).await {
        assert_eq!(
            (&line["status"], &line["ended_by"], &line["phase"]),
            (&200.into(), &"client".into(), &"body".into()),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_client_reading_slowly_but_steadily_gets_its_whole_answer() {
    let size = 48 * 1024;
    let backend = sized_backend(size).await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("b0")], "", "timeouts.body_idle = \"2s\"").await;
    let (mut read, mut write) = shut_window_client(addr).await;
    open_streams(&mut write, 1).await;
    // 8 KiB of window every 500 ms: the answer takes longer than body_idle, each wait less.
    let opener = tokio::spawn(async move {
        for _ in 0..size / 8192 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let step = (8192u32).to_be_bytes();
            if write
                .write_all(&frame(WINDOW_UPDATE, 0, 1, &step))
                .await
                .is_err()
            {
                break;
            }
        }
        write
    });
    let mut received = 0;
    let whole = async {
        loop {
            let frame = read_frame(&mut read)
                .await
                .expect("the connection stays open");
            match frame.kind {
                DATA => {
                    received += frame.payload.len();
                    if frame.flags & 0x1 != 0 {
                        return;
                    }
                }
                RST_STREAM => panic!("the stream was reset after {received} bytes"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(DEADLINE, whole)
        .await
        .expect("the whole answer in time");
    assert_eq!(received, size);
    drop(opener.await);
}

#[tokio::test]
async fn streams_beyond_max_backend_connections_wait_for_one_to_be_let_go() {
    let backend = sized_backend(1 << 20).await;
    let (balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "[listeners.http2]\nmax_backend_connections = 3",
        "timeouts.body_idle = \"1s\"",
    )
    .await;
    let (mut read, mut write) = shut_window_client(addr).await;
    open_streams(&mut write, 7).await;
    // Three answers at a time: each batch is reset once its client has taken nothing of it
    // for body_idle, letting the next streams through.
    let resets = until_reset(&mut read, 7, 3).await;
    assert_eq!(resets.len(), 7);
    assert_eq!(backend.hits(), 7);
    wait_until("the backend connections closed", || backend.closed() == 7).await;
    assert_eq!(charged(&balancer, 0).len(), 7);
    drop(write);
}

/// A POST stream of `length` bytes of body, its body to follow.
fn post_headers(stream: u32, length: usize) -> Vec<u8> {
    let block = crate::support::h2frames::hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "app.test"),
        (":path", "/upload"),
        ("content-length", &length.to_string()),
    ]);
    headers(stream, &block, false, true)
}

/// Found by review: a stream waiting for one of `max_backend_connections` does not read its
/// body, and what its client sent of it meanwhile counts against the connection's window. A
/// client uploading on more streams than the cap (a browser sending several files, a gRPC
/// client) fills the connection window with the waiting streams' bodies, and the stream that
/// holds the backend connection can no longer receive its own body: it waits until
/// `request_body_timeout` (408), then the next one does the same. The stream holding the slot
/// must be able to finish its upload.
#[tokio::test]
async fn uploads_waiting_for_a_backend_connection_do_not_starve_the_one_that_has_it() {
    let backend = crate::support::raw::length_backend().await;
    let (_balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "request_body_timeout = \"3s\"\n\
         [listeners.http2]\nmax_backend_connections = 1\n\
         initial_connection_window_size = 65535\ninitial_stream_window_size = 65535",
        "",
    )
    .await;
    let (mut read, mut write, _) = handshake_with(addr, settings(&[])).await;
    // Stream 1 takes the one backend connection, its body still to come.
    write.write_all(&post_headers(1, 1000)).await.unwrap();
    wait_until("stream 1 connected to the backend", || {
        backend.accepted() == 1
    })
    .await;
    // Stream 3 waits for it, its whole body sent: the connection's window is used up.
    let mut burst = post_headers(3, 65535);
    let body = vec![b'y'; 65535];
    let mut chunks = body.chunks(16384).peekable();
    while let Some(chunk) = chunks.next() {
        burst.extend(crate::support::h2frames::data(
            3,
            chunk,
            chunks.peek().is_none(),
        ));
    }
    write.write_all(&burst).await.unwrap();
    // A client keeping to flow control sends stream 1's body once the connection's window
    // opens again.
    let answered = async {
        let mut sent = false;
        loop {
            let frame = read_frame(&mut read)
                .await
                .expect("the connection stays open");
            match (frame.kind, frame.stream) {
                (WINDOW_UPDATE, 0) if !sent => {
                    write
                        .write_all(&crate::support::h2frames::data(1, &[b'x'; 1000], true))
                        .await
                        .unwrap();
                    sent = true;
                }
                (HEADERS, 1) => return (sent, frame.payload),
                (RST_STREAM, 1) => return (sent, Vec::new()),
                _ => {}
            }
        }
    };
    let (sent, head) = tokio::time::timeout(DEADLINE, answered)
        .await
        .expect("stream 1 answered in time");
    assert!(
        sent,
        "stream 1 was answered (or reset) before the connection's window let its body through: \
         the waiting stream's body held it"
    );
    // `:status: 200`, the static table's index 8.
    assert_eq!(head.first(), Some(&0x88), "{head:?}");
    drop(write);
}

/// Review: streams the client cancels while they wait for a backend connection give up their
/// place and take none: once the holder lets its connection go, the next stream gets it, and
/// the cancelled ones never reach the backend.
#[tokio::test]
async fn streams_cancelled_while_waiting_for_a_backend_connection_leak_no_slot() {
    let backend = sized_backend(1 << 20).await;
    let (_balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "[listeners.http2]\nmax_backend_connections = 1",
        "timeouts.body_idle = \"1s\"",
    )
    .await;
    let (mut read, mut write) = shut_window_client(addr).await;
    // Stream 1 holds the one backend connection; 3 and 5 wait, and are cancelled.
    open_streams(&mut write, 3).await;
    wait_until("stream 1 at the backend", || backend.hits() == 1).await;
    let mut cancels = crate::support::h2frames::rst_stream(3, CANCEL);
    cancels.extend(crate::support::h2frames::rst_stream(5, CANCEL));
    write.write_all(&cancels).await.unwrap();
    assert_eq!(until_reset(&mut read, 1, 1).await, vec![(1, CANCEL)]);
    // The slot is free again: a new stream gets it.
    write
        .write_all(&headers(
            7,
            &request_block("GET", "app.test", "/"),
            true,
            true,
        ))
        .await
        .unwrap();
    assert_eq!(until_reset(&mut read, 1, 1).await, vec![(7, CANCEL)]);
    assert_eq!(
        backend.hits(),
        2,
        "the cancelled streams never reached the backend"
    );
    drop(write);
}
