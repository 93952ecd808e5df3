//! The IO half of active checks: one probe, and the random delays and slot grid that time them.
//!
//! The health engine decides what a probe's [`Outcome`] means; this module only produces the
//! outcome, and the health runtime decides when to call it. Keeping the socket work here and the
//! scheduling loop elsewhere means each probe is a plain `async fn` that tests can drive against
//! a loopback listener.
//!
//! Invariants:
//! - One deadline covers a whole probe (connect, write, and reading the status line); a probe
//!   never takes much longer than its timeout, whatever the backend does.
//! - An HTTP probe reads at most [`MAX_STATUS_LINE`] bytes and only up to the first `\n`: the
//!   headers and body are never read, and the connection is closed right after.
//! - Every failure maps to exactly one [`Outcome`]; nothing here panics on what a backend sends.
//! - The random numbers come from `fastrand` (the crate's one random source, see
//!   [`Rng`]). They spread probes apart; they are not for anything that needs to be
//!   unpredictable.
//! - Probes are cheap for the backend's host: due times fall on a slot grid ([`PROBE_SLOT`]) so
//!   probes leave in batches, and an HTTP probe's request carries the handshake's last ACK, so a
//!   sleeping backend is woken about once per batch rather than twice per probe.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use capataz_health::{parse_status_line, Outcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::CheckKind;

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
/// - [`CheckKind::Tcp`] passes when the connection is established. Since [`Outcome`] has no
///   "connected" variant, success is a synthetic `Status(200)`, which the default probe rule
///   (200-399) passes; a failure maps like an HTTP probe's.
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
pub async fn probe_once(
    kind: CheckKind,
    addr: SocketAddr,
    path: &str,
    host: &str,
    timeout: Duration,
) -> Outcome {
    let attempt = async {
        match kind {
            CheckKind::Http => http_probe(addr, path, host).await,
            CheckKind::Tcp => TcpStream::connect(addr)
                .await
                .map(|_connected| Outcome::Status(200)),
            CheckKind::None => Ok(Outcome::Status(200)),
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => classify_error(&error),
        Err(_elapsed) => Outcome::Timeout,
    }
}

/// The bytes of an HTTP probe's request.
pub fn probe_request(path: &str, host: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

async fn http_probe(addr: SocketAddr, path: &str, host: &str) -> io::Result<Outcome> {
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
    stream.write_all(&probe_request(path, host)).await?;
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

/// The random source probe timing draws from: `fastrand`'s generator (wyrand). Not
/// cryptographic. Each probe loop forks its own from the calling thread's generator
/// (`Rng::new()`), so one `fastrand::seed` in a test makes every phase and jitter repeat.
pub use fastrand::Rng;

/// The slot grid of probe due times (at most; see [`align_to_slot`]). Probes of any backends due
/// in the same slot start on one timer tick and their connects leave back to back in one runtime
/// poll, so a sleeping backend host is woken about once per batch rather than once per probe (on
/// loopback that wake-up is charged to the balancer's `connect()` and `send()`). 10 ms is 1 % of
/// a 1 s interval: the jitter and the random first phase still spread probes evenly at the
/// 100 ms scale.
pub const PROBE_SLOT: Duration = Duration::from_millis(10);

/// `due` rounded to the nearest multiple of the probe slot, and never before `now`.
///
/// The slot is [`PROBE_SLOT`] or 1 % of `interval`, whichever is shorter, so short intervals are
/// not distorted; rounding to the nearest boundary keeps the mean interval unchanged. Below a
/// millisecond (the runtime timer's resolution) `due` is returned as it is.
pub fn align_to_slot(due: Duration, now: Duration, interval: Duration) -> Duration {
    let slot = PROBE_SLOT.min(interval / 100);
    if slot < Duration::from_millis(1) {
        return due;
    }
    let slot = nanos(slot);
    let due_ns = nanos(due);
    let aligned = due_ns.saturating_add(slot / 2) / slot * slot;
    let aligned = if aligned < nanos(now) {
        aligned.saturating_add(slot)
    } else {
        aligned
    };
    Duration::from_nanos(aligned)
}

/// The delay before a backend's first probe: uniform in [0, `interval`), so that backends
/// configured together are not probed in lockstep. Zero for a zero interval.
pub fn first_delay(interval: Duration, rng: &mut Rng) -> Duration {
    match nanos(interval) {
        0 => Duration::ZERO,
        interval => Duration::from_nanos(rng.u64(..interval)),
    }
}

/// One interval with jitter: uniform in [`interval` * (1 - `jitter`), `interval` * (1 + `jitter`)].
///
/// `jitter` is a fraction; it is clamped to [0, 1], and NaN counts as 0.
pub fn jittered(interval: Duration, jitter: f64, rng: &mut Rng) -> Duration {
    let jitter = if jitter > 0.0 { jitter.min(1.0) } else { 0.0 };
    let (low, high) = jitter_bounds(interval, jitter);
    Duration::from_nanos(rng.u64(low..=high))
}

/// The bounds of [`jittered`] in nanoseconds, both included.
fn jitter_bounds(interval: Duration, jitter: f64) -> (u64, u64) {
    let interval = nanos(interval) as f64;
    let low = (interval * (1.0 - jitter)).round() as u64;
    let high = (interval * (1.0 + jitter)).round() as u64;
    (low, high.max(low))
}

/// A duration in nanoseconds, saturating (at over 500 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::net::TcpListener;
    use tokio::sync::oneshot;

    const GENEROUS: Duration = Duration::from_secs(5);

    /// What the fake backend does once it has read the probe's request.
    enum Answer {
        /// Write these bytes and close.
        Bytes(&'static [u8]),
        /// Write these bytes and keep the connection open without answering more.
        BytesThenHang(Vec<u8>),
        /// Close right after accepting, without reading.
        CloseAtOnce,
    }

    /// A one-shot backend on loopback; the receiver yields the request bytes it read.
    async fn backend(answer: Answer) -> (SocketAddr, oneshot::Receiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            if let Answer::CloseAtOnce = answer {
                return;
            }
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&chunk[..n]);
            }
            let _ = tx.send(request);
            match answer {
                Answer::Bytes(bytes) => {
                    let _ = stream.write_all(bytes).await;
                }
                Answer::BytesThenHang(bytes) => {
                    let _ = stream.write_all(&bytes).await;
                    // Hold the connection until the prober closes it.
                    let _ = stream.read(&mut chunk).await;
                }
                Answer::CloseAtOnce => {}
            }
        });
        (addr, rx)
    }

    async fn http(answer: Answer) -> Outcome {
        let (addr, _request) = backend(answer).await;
        probe_once(CheckKind::Http, addr, "/healthz", "svc", GENEROUS).await
    }

    /// An address where nothing listens.
    async fn closed_port() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    }

    #[tokio::test]
    async fn status_lines_are_judged() {
        let ok = Answer::Bytes(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        assert_eq!(http(ok).await, Outcome::Status(200));
        let slow = Answer::Bytes(b"HTTP/1.1 503 Backend 200 ms slow\r\n\r\n");
        assert_eq!(http(slow).await, Outcome::Status(503));
        let bare_lf = Answer::Bytes(b"HTTP/1.0 404 Not Found\n\n");
        assert_eq!(http(bare_lf).await, Outcome::Status(404));
    }

    #[tokio::test]
    async fn garbage_is_malformed() {
        assert_eq!(
            http(Answer::Bytes(b"garbage\r\n\r\n")).await,
            Outcome::Malformed
        );
        assert_eq!(
            http(Answer::Bytes(b"TIMEOUT\r\n")).await,
            Outcome::Malformed
        );
        assert_eq!(
            http(Answer::Bytes(b"HTTP/1.1 200 OK\r\r\n")).await,
            Outcome::Malformed
        );
        assert_eq!(http(Answer::Bytes(b"\r\n")).await, Outcome::Malformed);
    }

    #[tokio::test]
    async fn an_overlong_line_is_malformed_without_waiting() {
        let long = [b"HTTP/1.1 200 ".as_slice(), &[b'x'; 2000]].concat();
        let started = Instant::now();
        assert_eq!(http(Answer::BytesThenHang(long)).await, Outcome::Malformed);
        assert!(started.elapsed() < GENEROUS);
    }

    #[tokio::test]
    async fn a_line_cut_short_by_eof_is_judged_as_it_is() {
        assert_eq!(
            http(Answer::Bytes(b"HTTP/1.1 20")).await,
            Outcome::Malformed
        );
        assert_eq!(
            http(Answer::Bytes(b"HTTP/1.1 200 OK")).await,
            Outcome::Status(200)
        );
    }

    #[tokio::test]
    async fn silence_is_a_timeout_within_the_deadline() {
        let (addr, _request) = backend(Answer::BytesThenHang(Vec::new())).await;
        let started = Instant::now();
        let timeout = Duration::from_millis(100);
        let outcome = probe_once(CheckKind::Http, addr, "/", "svc", timeout).await;
        assert_eq!(outcome, Outcome::Timeout);
        let elapsed = started.elapsed();
        assert!(elapsed >= timeout && elapsed < GENEROUS, "{elapsed:?}");
    }

    #[tokio::test]
    async fn a_partial_line_then_silence_is_a_timeout() {
        let (addr, _request) = backend(Answer::BytesThenHang(b"HTTP/1.1 2".to_vec())).await;
        let timeout = Duration::from_millis(100);
        let outcome = probe_once(CheckKind::Http, addr, "/", "svc", timeout).await;
        assert_eq!(outcome, Outcome::Timeout);
    }

    #[tokio::test]
    async fn closing_without_an_answer_is_a_reset() {
        assert_eq!(http(Answer::CloseAtOnce).await, Outcome::Reset);
        assert_eq!(http(Answer::Bytes(b"")).await, Outcome::Reset);
    }

    #[tokio::test]
    async fn nothing_listening_is_refused() {
        let addr = closed_port().await;
        let outcome = probe_once(CheckKind::Http, addr, "/", "svc", GENEROUS).await;
        assert_eq!(outcome, Outcome::Refused);
    }

    #[tokio::test]
    async fn the_request_is_exactly_as_specified() {
        let (addr, request) = backend(Answer::Bytes(b"HTTP/1.1 204 No Content\r\n\r\n")).await;
        let outcome = probe_once(
            CheckKind::Http,
            addr,
            "/health?deep=1",
            "api.test",
            GENEROUS,
        )
        .await;
        assert_eq!(outcome, Outcome::Status(204));
        let expected = format!(
            "GET /health?deep=1 HTTP/1.1\r\nHost: api.test\r\nUser-Agent: capataz/{}\r\n\
             Connection: close\r\n\r\n",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(String::from_utf8(request.await.unwrap()).unwrap(), expected);
    }

    #[tokio::test]
    async fn tcp_kind_passes_on_connect_and_fails_when_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // The kernel completes the handshake from the backlog; nobody needs to accept.
        let outcome = probe_once(CheckKind::Tcp, addr, "/", "svc", GENEROUS).await;
        assert_eq!(outcome, Outcome::Status(200));
        drop(listener);
        let outcome = probe_once(CheckKind::Tcp, addr, "/", "svc", GENEROUS).await;
        assert_eq!(outcome, Outcome::Refused);
    }

    #[tokio::test]
    async fn no_kind_passes_without_touching_the_network() {
        let addr = closed_port().await;
        let outcome = probe_once(CheckKind::None, addr, "/", "svc", GENEROUS).await;
        assert_eq!(outcome, Outcome::Status(200));
    }

    #[test]
    fn error_kinds_map_to_outcomes() {
        let check = |kind: io::ErrorKind, expected| {
            assert_eq!(classify_error(&kind.into()), expected, "{kind:?}");
        };
        check(io::ErrorKind::ConnectionRefused, Outcome::Refused);
        check(io::ErrorKind::ConnectionReset, Outcome::Reset);
        check(io::ErrorKind::ConnectionAborted, Outcome::Reset);
        check(io::ErrorKind::BrokenPipe, Outcome::Reset);
        check(io::ErrorKind::UnexpectedEof, Outcome::Reset);
        check(io::ErrorKind::TimedOut, Outcome::Timeout);
        check(io::ErrorKind::HostUnreachable, Outcome::Refused);
        check(io::ErrorKind::NetworkUnreachable, Outcome::Refused);
        check(io::ErrorKind::AddrNotAvailable, Outcome::Refused);
    }

    const SAMPLES: u32 = 20_000;

    #[test]
    fn first_delay_is_uniform_below_the_interval() {
        let mut rng = Rng::with_seed(7);
        let interval = Duration::from_secs(2);
        let (mut min, mut max, mut sum) = (interval, Duration::ZERO, Duration::ZERO);
        for _ in 0..SAMPLES {
            let delay = first_delay(interval, &mut rng);
            assert!(delay < interval, "{delay:?}");
            min = min.min(delay);
            max = max.max(delay);
            sum += delay;
        }
        let mean = (sum / SAMPLES).as_secs_f64();
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!(
            min < interval / 100 && max > interval * 99 / 100,
            "{min:?} {max:?}"
        );
        assert_eq!(first_delay(Duration::ZERO, &mut rng), Duration::ZERO);
    }

    #[test]
    fn jittered_stays_within_its_bounds_and_covers_them() {
        let mut rng = Rng::with_seed(11);
        let interval = Duration::from_secs(2);
        let (low, high) = (Duration::from_millis(1800), Duration::from_millis(2200));
        let (mut min, mut max, mut sum) = (high, low, Duration::ZERO);
        for _ in 0..SAMPLES {
            let delay = jittered(interval, 0.1, &mut rng);
            assert!(low <= delay && delay <= high, "{delay:?}");
            min = min.min(delay);
            max = max.max(delay);
            sum += delay;
        }
        let mean = (sum / SAMPLES).as_secs_f64();
        assert!((mean - 2.0).abs() < 0.01, "mean {mean}");
        let margin = Duration::from_millis(5);
        assert!(min < low + margin && max > high - margin, "{min:?} {max:?}");
    }

    #[test]
    fn jitter_edge_cases() {
        let mut rng = Rng::with_seed(3);
        let interval = Duration::from_millis(500);
        for jitter in [0.0, -1.0, f64::NAN] {
            assert_eq!(jittered(interval, jitter, &mut rng), interval, "{jitter}");
        }
        for _ in 0..1000 {
            assert!(jittered(interval, 5.0, &mut rng) <= interval * 2);
        }
        assert_eq!(jittered(Duration::ZERO, 0.5, &mut rng), Duration::ZERO);
        let huge = jittered(Duration::MAX, 0.5, &mut rng);
        assert!(huge >= Duration::from_nanos(u64::MAX / 2));
    }

    #[test]
    fn due_times_round_to_the_nearest_slot() {
        let ms = Duration::from_millis;
        let second = Duration::from_secs(1);
        let check = |due, now, interval, expected| {
            assert_eq!(
                align_to_slot(due, now, interval),
                expected,
                "{due:?} {now:?} {interval:?}"
            );
        };
        check(ms(1004), ms(0), second, ms(1000));
        check(ms(1005), ms(0), second, ms(1010));
        check(ms(1010), ms(0), second, ms(1010));
        // Never before now: a due time rounded into the past moves up one slot.
        check(ms(1003), ms(1002), second, ms(1010));
        check(ms(1003), ms(1000), second, ms(1000));
        // The slot is at most 1 % of the interval; under 1 ms nothing is rounded.
        check(ms(1003), ms(0), ms(200), ms(1004));
        let odd = Duration::from_micros(1_234_567);
        check(odd, ms(0), ms(30), odd);
        check(odd, ms(0), Duration::ZERO, odd);
    }

    #[test]
    fn aligned_due_times_keep_the_mean_interval() {
        let mut rng = Rng::with_seed(5);
        let interval = Duration::from_secs(1);
        let mut now = first_delay(interval, &mut rng);
        let start = now;
        for _ in 0..SAMPLES {
            let due = align_to_slot(now + jittered(interval, 0.1, &mut rng), now, interval);
            assert_eq!(nanos(due) % nanos(PROBE_SLOT), 0, "{due:?}");
            now = due;
        }
        let mean = ((now - start) / SAMPLES).as_secs_f64();
        assert!((mean - 1.0).abs() < 0.001, "mean {mean}");
    }

    #[test]
    fn probe_timing_repeats_from_a_seed() {
        let draws = |seed| {
            let mut rng = Rng::with_seed(seed);
            let interval = Duration::from_secs(1);
            let mut out = vec![first_delay(interval, &mut rng)];
            out.extend((0..8).map(|_| jittered(interval, 0.1, &mut rng)));
            out
        };
        assert_eq!(draws(42), draws(42));
        assert_ne!(draws(42), draws(43));
        // A generator forked from a seeded thread repeats too.
        let forked = |seed| {
            fastrand::seed(seed);
            let mut rng = Rng::new();
            first_delay(Duration::from_secs(1), &mut rng)
        };
        assert_eq!(forked(7), forked(7));
    }
}
