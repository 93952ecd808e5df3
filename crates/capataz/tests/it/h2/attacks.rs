//! The known attacks on HTTP/2 servers, as raw frames: each must end the connection (or be
//! held to the client's own pace) within a deadline, with bounded work and memory.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{balancer, silent_backend};
use crate::support::cases;
use crate::support::h2frames::{
    continuation, data, flood, handshake, headers, ping, read_frame, read_to_end, request_block,
    rst_stream, setting, settings, CANCEL, ENHANCE_YOUR_CALM, PREFACE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
};
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// REFUSED_STREAM.
const REFUSED_STREAM: u32 = 7;

#[tokio::test]
async fn rapid_reset_in_one_burst_gets_a_goaway_and_reaches_few_backends() {
    let backend = silent_backend().await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    // HEADERS then RST_STREAM, 10,000 streams, written as fast as the socket takes them.
    let mut burst = Vec::new();
    for i in 0..10_000u32 {
        let id = 2 * i + 1;
        burst.extend(headers(
            id,
            &request_block("GET", "app.test", "/"),
            true,
            true,
        ));
        burst.extend(rst_stream(id, CANCEL));
    }
    let writer = tokio::spawn(async move {
        let _ = flood(&mut write, &burst, burst.len(), Duration::from_secs(2)).await;
        write
    });
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert!(ending.closed, "the connection ends: {ending:?}");
    assert_eq!(
        ending.goaways.last(),
        Some(&ENHANCE_YOUR_CALM),
        "{ending:?}"
    );
    drop(writer.await.unwrap());
    // Streams reset before hyper took them never reach a backend; those it took are few.
    assert!(
        backend.hits() <= 150,
        "backend saw {} requests",
        backend.hits()
    );
}

#[tokio::test]
async fn rapid_reset_of_requests_already_forwarded_drops_the_connection() {
    // Each stream is cancelled only once its request reached the backend: h2's own limit on
    // streams reset before they were accepted never applies, capataz's cancel limit does.
    let backend = silent_backend().await;
    let (_balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "[listeners.http2]\nmax_concurrent_streams = 10",
        "",
    )
    .await;
    let (mut read, mut write, _) = handshake(addr).await;
    let reader = tokio::spawn(async move { read_to_end(&mut read, DEADLINE).await });
    let mut cancelled = 0u64;
    for i in 0..1_000u32 {
        let id = 2 * i + 1;
        let frame = headers(id, &request_block("GET", "app.test", "/"), true, true);
        if write.write_all(&frame).await.is_err() {
            break;
        }
        // Until the request reaches the backend, or the connection is dropped.
        let reached = tokio::time::timeout(DEADLINE, async {
            while backend.hits() <= u64::from(i) && !reader.is_finished() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        if reached.is_err() || reader.is_finished() {
            break;
        }
        if write.write_all(&rst_stream(id, CANCEL)).await.is_err() {
            break;
        }
        cancelled += 1;
    }
    let ending = reader.await.unwrap();
    assert!(ending.closed, "the connection ends: {ending:?}");
    assert!(
        ending.answered.is_empty(),
        "no request was answered: {ending:?}"
    );
    // The limit is max_concurrent_streams cancels beyond the answered requests (none here):
    // the 11th cancel drops the connection (a request or two more may be on their way while
    // the 11th stream's task sees its reset).
    assert!(
        (11..=14).contains(&backend.hits()),
        "backend saw {} requests, client cancelled {cancelled}",
        backend.hits()
    );
}

/// The GOAWAY a flood must end with.
enum Goaway {
    /// ENHANCE_YOUR_CALM, the last one sent.
    Calm,
    /// Any.
    Any,
}

/// What a flood must have left behind at the backend.
enum After {
    /// No request reached it.
    NoRequest,
    /// Nothing was charged to it (a cancelled upload is the client's doing).
    NothingCharged,
}

/// A flood of frames on stream 1, opened by `opening`: the server ends the connection with a
/// GOAWAY before taking 64 MiB of it.
struct StreamFlood {
    /// The backend reads request bodies (`raw::length_backend`) instead of only heads.
    reads_bodies: bool,
    opening: Vec<u8>,
    /// Sent a thousand at a time, as fast as the server takes them.
    frame: Vec<u8>,
    goaway: Goaway,
    after: After,
}

#[tokio::test]
async fn a_flood_of_frames_on_one_stream_gets_a_goaway() {
    let get = request_block("GET", "app.test", "/");
    // One header field whose value never ends, 16 KB per frame.
    let mut endless = vec![0x00, 0x01, b'x', 0x7f];
    endless.extend([0xff, 0xff, 0xff, 0x0f]); // length 2^28 or so
    let cases = [
        (
            "empty CONTINUATION frames",
            StreamFlood {
                reads_bodies: false,
                opening: headers(1, &get, true, false),
                frame: continuation(1, &[], false),
                goaway: Goaway::Calm,
                after: After::NoRequest,
            },
        ),
        (
            "large CONTINUATION frames, bounded by max_header_bytes",
            StreamFlood {
                reads_bodies: false,
                opening: [
                    headers(1, &get, true, false),
                    continuation(1, &endless, false),
                ]
                .concat(),
                frame: continuation(1, &[b'a'; 16_000], false),
                goaway: Goaway::Any,
                after: After::NoRequest,
            },
        ),
        (
            "empty DATA frames",
            StreamFlood {
                reads_bodies: true,
                opening: headers(1, &request_block("POST", "app.test", "/"), false, true),
                frame: data(1, &[], false),
                goaway: Goaway::Calm,
                after: After::NothingCharged,
            },
        ),
    ];
    cases::each(cases, |case| async move {
        let backend = if case.reads_bodies {
            crate::support::raw::length_backend().await
        } else {
            silent_backend().await
        };
        let (balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
        let (mut read, mut write, _) = handshake(addr).await;
        write.write_all(&case.opening).await.unwrap();
        let chunk: Vec<u8> = (0..1000).flat_map(|_| case.frame.clone()).collect();
        let writer = tokio::spawn(async move {
            flood(&mut write, &chunk, 64 << 20, Duration::from_secs(2)).await
        });
        let ending = read_to_end(&mut read, DEADLINE).await;
        let sent = writer.await.unwrap();
        assert!(ending.closed, "{ending:?}");
        match case.goaway {
            Goaway::Calm => assert_eq!(
                ending.goaways.last(),
                Some(&ENHANCE_YOUR_CALM),
                "{ending:?}"
            ),
            Goaway::Any => assert!(!ending.goaways.is_empty(), "{ending:?}"),
        }
        assert!(
            sent < 64 << 20,
            "the server stopped taking frames: {sent} bytes"
        );
        match case.after {
            After::NoRequest => assert_eq!(backend.hits(), 0),
            After::NothingCharged => assert_eq!(super::charged(&balancer, 0), []),
        }
    })
    .await;
}

/// A flood of `frame` from a client that never reads: the server answers one at a time,
/// stops reading when its answers back up, and closes the connection once nothing has moved
/// for `idle_timeout`. What it took is bounded by the socket buffers.
async fn unread_flood(frame: Vec<u8>) {
    let backend = silent_backend().await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("b0")], "idle_timeout = \"300ms\"", "").await;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let mut start = PREFACE.to_vec();
    start.extend(settings(&[]));
    write.write_all(&start).await.unwrap();
    let chunk: Vec<u8> = (0..1000).flat_map(|_| frame.clone()).collect();
    let sent = flood(&mut write, &chunk, 512 << 20, Duration::from_secs(1)).await;
    assert!(
        sent < 128 << 20,
        "the server stopped reading: {sent} bytes taken"
    );
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert!(ending.closed, "the connection ends: {ending:?}");
}

#[tokio::test]
async fn a_flood_from_a_client_that_never_reads_is_bounded_and_closed() {
    let cases = [
        ("PING", ping(*b"flooding")),
        (
            "SETTINGS",
            settings(&[(SETTINGS_MAX_CONCURRENT_STREAMS, 100)]),
        ),
    ];
    cases::each(cases, unread_flood).await;
}

#[tokio::test]
async fn pings_from_a_reading_client_are_answered_at_its_pace() {
    let backend = silent_backend().await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    let chunk: Vec<u8> = (0..1000).flat_map(|_| ping(*b"12345678")).collect();
    write.write_all(&chunk).await.unwrap();
    let mut acks = 0;
    while acks < 1000 {
        let frame = tokio::time::timeout(DEADLINE, read_frame(&mut read))
            .await
            .expect("acks keep coming")
            .expect("the connection stays open");
        if frame.kind == crate::support::h2frames::PING {
            assert_eq!(frame.payload, b"12345678");
            acks += 1;
        }
    }
}

#[tokio::test]
async fn streams_beyond_max_concurrent_streams_are_refused() {
    let backend = silent_backend().await;
    let (_balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "[listeners.http2]\nmax_concurrent_streams = 2",
        "",
    )
    .await;
    let (mut read, mut write, server) = handshake(addr).await;
    assert_eq!(setting(&server, SETTINGS_MAX_CONCURRENT_STREAMS), Some(2));
    let block = request_block("GET", "app.test", "/");
    for id in [1, 3] {
        write
            .write_all(&headers(id, &block, true, true))
            .await
            .unwrap();
    }
    wait_until("two requests at the backend", || backend.hits() == 2).await;
    // Fifty more while those two are open: each refused, none forwarded.
    let mut more = Vec::new();
    for i in 0..50u32 {
        more.extend(headers(5 + 2 * i, &block, true, true));
    }
    write.write_all(&more).await.unwrap();
    let mut refused = 0;
    while refused < 50 {
        let frame = tokio::time::timeout(DEADLINE, read_frame(&mut read))
            .await
            .expect("resets within the deadline")
            .expect("the connection stays open");
        if frame.kind == crate::support::h2frames::RST_STREAM {
            assert_eq!(frame.payload, REFUSED_STREAM.to_be_bytes(), "{frame:?}");
            refused += 1;
        }
    }
    assert_eq!(backend.hits(), 2);
    // A body for a refused stream is ignored too, and the two open streams live on.
    write.write_all(&data(5, b"x", true)).await.unwrap();
    drop(write);
    let _ = read_to_end(&mut read, Duration::from_millis(200)).await;
    assert_eq!(backend.hits(), 2);
}

#[tokio::test]
async fn pings_do_not_keep_an_idle_connection_open() {
    let backend = silent_backend().await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("b0")], "idle_timeout = \"300ms\"", "").await;
    let (read, mut write, _) = handshake(addr).await;
    let reader = tokio::spawn(async move {
        let mut read = read;
        read_to_end(&mut read, DEADLINE).await
    });
    // A PING every 50 ms, acknowledgements read, and no stream: still idle.
    let mut pings = 0;
    while !reader.is_finished() && pings < 400 {
        if write.write_all(&ping(*b"stayhere")).await.is_err() {
            break;
        }
        pings += 1;
        // The pace is the subject: pings spaced well within the idle timeout, in wall time.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ending = reader.await.unwrap();
    assert!(ending.closed, "{ending:?}");
    assert_eq!(
        ending.goaways.first(),
        Some(&crate::support::h2frames::NO_ERROR)
    );
    assert!(pings < 400, "closed after {pings} pings");
}

#[tokio::test]
async fn a_stream_of_refused_streams_gets_a_goaway() {
    let backend = silent_backend().await;
    let (_balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "[listeners.http2]\nmax_concurrent_streams = 1",
        "",
    )
    .await;
    let (mut read, mut write, _) = handshake(addr).await;
    let block = request_block("GET", "app.test", "/");
    write
        .write_all(&headers(1, &block, true, true))
        .await
        .unwrap();
    wait_until("one request at the backend", || backend.hits() == 1).await;
    let mut more = Vec::new();
    for i in 0..2_000u32 {
        more.extend(headers(3 + 2 * i, &block, true, true));
    }
    let writer =
        tokio::spawn(
            async move { flood(&mut write, &more, more.len(), Duration::from_secs(2)).await },
        );
    let ending = read_to_end(&mut read, DEADLINE).await;
    let _sent = writer.await.unwrap();
    assert!(ending.closed, "{ending:?}");
    assert_eq!(
        ending.goaways.last(),
        Some(&ENHANCE_YOUR_CALM),
        "{ending:?}"
    );
    assert_eq!(backend.hits(), 1);
}

/// Regression: a client that never answers the PING of a drain's first GOAWAY (last stream
/// 2^31-1, after which h2 waits for that answer before its final GOAWAY) and goes on opening
/// streams, one always in progress, had them all served for the whole drain (until the
/// shutdown's deadline, the old process of an upgrade forwarding them to the backends all
/// along). Now dropped a few watcher periods (1 s here) after the GOAWAY's grace second.
#[tokio::test]
async fn a_client_that_ignores_the_drains_goaway_cannot_keep_opening_streams() {
    // Each answer takes 300 ms: the client always has streams in progress.
    let sims = crate::support::balancer::backends(&["slow"]).await;
    sims[0].set_traffic(capataz::sim::Mode::Delay(Duration::from_millis(300), 200));
    let (balancer, addr, _events) = balancer(&crate::support::balancer::pairs(&sims), "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    let shutdown = tokio::spawn(balancer.shutdown(Duration::from_secs(120)));
    let goaway = tokio::time::timeout(DEADLINE, async {
        loop {
            let frame = read_frame(&mut read).await.expect("a frame");
            if frame.kind == crate::support::h2frames::GOAWAY {
                return frame;
            }
        }
    })
    .await
    .expect("the drain's GOAWAY");
    assert_eq!(goaway.payload[..4], [0x7f, 0xff, 0xff, 0xff], "{goaway:?}");
    // A stream every 100 ms, the PING never answered, for at most 10 s.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = answered.clone();
    let reader = tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut read).await {
            if frame.kind == crate::support::h2frames::HEADERS {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    let began = std::time::Instant::now();
    for i in 0..100u32 {
        pace.tick().await;
        let frame = headers(
            2 * i + 1,
            &request_block("GET", "app.test", "/"),
            true,
            true,
        );
        if write.write_all(&frame).await.is_err() || reader.is_finished() {
            break;
        }
    }
    let open_for = began.elapsed();
    let closed = tokio::time::timeout(Duration::from_secs(1), reader)
        .await
        .is_ok();
    let answered = answered.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        closed && open_for < Duration::from_secs(8),
        "{answered} streams answered after the GOAWAY; closed: {closed}, after {open_for:?}"
    );
    let _ = tokio::time::timeout(DEADLINE, shutdown).await;
}
