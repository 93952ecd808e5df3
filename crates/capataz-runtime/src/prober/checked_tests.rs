//! Checked HTTP probes (configured request, header and body rules) and agent checks against
//! loopback backends that answer well, badly, partly, endlessly or not at all.

use std::net::SocketAddr;
use std::time::Duration;

use capataz_health::{Mismatch, Outcome, ProbeOutcome, Snippet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::{agent_once, probe_checked, HttpProbe};

const GENEROUS: Duration = Duration::from_secs(5);

/// The probe a pool with these `[pools.web.active]` lines sends, with `Host: svc`.
fn probe_for(active: &str) -> HttpProbe {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
         backends = [{{ address = \"127.0.0.1:9\" }}]\n[pools.web.active]\n{active}\n"
    );
    let config = crate::config::parse_str(&text, "<test>").expect("valid test config");
    HttpProbe::new(&config.pools[0].active, "svc")
}

/// A one-shot backend: reads the request head (and a `Content-Length` body), writes `parts`
/// one after the other, then holds the connection open (`hang`) or closes it. The receiver
/// yields the request bytes.
async fn backend(parts: Vec<Vec<u8>>, hang: bool) -> (SocketAddr, oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                if request.len() >= end + 4 + length {
                    break;
                }
            }
            let n = stream.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            request.extend_from_slice(&chunk[..n]);
        }
        let _ = tx.send(request);
        for part in parts {
            if stream.write_all(&part).await.is_err() {
                return;
            }
        }
        if hang {
            let _ = stream.read(&mut chunk).await;
        }
    });
    (addr, rx)
}

async fn check(active: &str, answer: &[u8]) -> ProbeOutcome {
    let (addr, _) = backend(vec![answer.to_vec()], false).await;
    probe_checked(&probe_for(active), addr, GENEROUS, None).await
}

fn lacks(text: &str) -> Option<Mismatch> {
    Some(Mismatch::BodyLacks(Snippet::new(text)))
}

#[tokio::test]
async fn body_contains_passes_on_a_length_framed_body_that_holds_the_text() {
    let outcome = check(
        "body_contains = \"ok\"",
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nstatus: ok\n",
    )
    .await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Status(200)));
}

#[tokio::test]
async fn body_contains_finds_text_split_across_chunks_and_reads() {
    let (addr, _) = backend(
        vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nrea".to_vec(),
            b"\r\n2\r\ndy\r\n0\r\n\r\n".to_vec(),
        ],
        true,
    )
    .await;
    let outcome = probe_checked(
        &probe_for("body_contains = \"ready\""),
        addr,
        GENEROUS,
        None,
    )
    .await;
    assert_eq!(outcome.mismatch, None, "{outcome}");
}

#[tokio::test]
async fn body_without_the_text_is_a_mismatch_with_its_status() {
    let outcome = check(
        "body_contains = \"ok\"",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nstatus: degraded\n",
    )
    .await;
    assert_eq!(outcome.outcome, Outcome::Status(200));
    assert_eq!(outcome.mismatch, lacks("ok"));
    assert_eq!(outcome.to_string(), "HTTP 200, body did not contain \"ok\"");
}

#[tokio::test]
async fn body_not_contains_fails_when_the_forbidden_text_is_there() {
    let outcome = check(
        "body_not_contains = \"maintenance\"",
        b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\nmaintenance mode",
    )
    .await;
    assert_eq!(
        outcome.mismatch,
        Some(Mismatch::BodyHas(Snippet::new("maintenance")))
    );
}

#[tokio::test]
async fn only_the_first_body_limit_bytes_are_read_even_from_an_endless_body() {
    // The text sits past the limit, and the body never ends: the probe stops at the limit
    // and judges what it read, long before its deadline.
    let mut head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n".to_vec();
    head.extend(std::iter::repeat_n(b'x', 64));
    let (addr, _) = backend(vec![head, b"ok".to_vec()], true).await;
    let probe = probe_for("body_contains = \"ok\"\nbody_limit = 64");
    let started = tokio::time::Instant::now();
    let outcome = probe_checked(&probe, addr, GENEROUS, None).await;
    assert_eq!(outcome.mismatch, lacks("ok"));
    assert!(started.elapsed() < GENEROUS / 2);
}

#[tokio::test]
async fn a_stalled_body_times_out_and_a_cut_body_is_a_reset() {
    let (addr, _) = backend(
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhalf".to_vec()],
        true,
    )
    .await;
    let probe = probe_for("body_contains = \"ok\"");
    let outcome = probe_checked(&probe, addr, Duration::from_millis(200), None).await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Timeout));
    let outcome = check(
        "body_contains = \"ok\"",
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhalf",
    )
    .await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Reset));
}

#[tokio::test]
async fn an_unexpected_status_is_judged_without_reading_the_body() {
    let (addr, _) = backend(
        vec![b"HTTP/1.1 500 Oops\r\nContent-Length: 50\r\n\r\n".to_vec()],
        true,
    )
    .await;
    let outcome = probe_checked(&probe_for("body_contains = \"ok\""), addr, GENEROUS, None).await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Status(500)));
}

#[tokio::test]
async fn malformed_status_lines_and_chunks_are_malformed() {
    let outcome = check("body_contains = \"ok\"", b"HTTP/1.1 2000 OK\r\n\r\n").await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Malformed));
    let outcome = check(
        "body_contains = \"ok\"",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Malformed));
    let (addr, _) = backend(vec![], false).await;
    let outcome = probe_checked(&probe_for("body_contains = \"ok\""), addr, GENEROUS, None).await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Reset));
}

#[tokio::test]
async fn interim_answers_are_skipped() {
    let outcome = check(
        "body_contains = \"ok\"",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    )
    .await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Status(200)));
}

#[tokio::test]
async fn expected_header_absent_or_without_its_text_is_a_mismatch() {
    let rules = "expect_header = \"X-Ready\"\nexpect_header_contains = \"yes\"";
    let outcome = check(rules, b"HTTP/1.1 200 OK\r\nx-ready: yes please\r\n\r\n").await;
    assert_eq!(outcome.mismatch, None);
    let outcome = check(rules, b"HTTP/1.1 200 OK\r\nX-Ready: no\r\n\r\n").await;
    assert_eq!(
        outcome.to_string(),
        "HTTP 200, header \"x-ready\" did not contain \"yes\""
    );
    let outcome = check(rules, b"HTTP/1.1 200 OK\r\n\r\n").await;
    assert_eq!(
        outcome.mismatch,
        Some(Mismatch::HeaderAbsent(Snippet::new("x-ready")))
    );
}

#[tokio::test]
async fn the_configured_method_headers_and_body_are_sent_exactly() {
    let (addr, request) = backend(vec![b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()], false).await;
    let probe = probe_for(
        "method = \"POST\"\nbody = \"ping\"\nheaders = { X-Probe = \"1\", Authorization = \"Bearer t\" }",
    );
    let outcome = probe_checked(&probe, addr, GENEROUS, None).await;
    assert_eq!(outcome, ProbeOutcome::from(Outcome::Status(204)));
    let expected = format!(
        "POST /healthz HTTP/1.1\r\nHost: svc\r\nUser-Agent: {}\r\nConnection: close\r\n\
         Authorization: Bearer t\r\nX-Probe: 1\r\nContent-Length: 4\r\n\r\nping",
        super::USER_AGENT
    );
    assert_eq!(String::from_utf8(request.await.unwrap()).unwrap(), expected);
    assert_eq!(probe.request(), expected.as_bytes());
}

async fn agent_answering(bytes: &'static [u8], hang: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let _ = stream.write_all(bytes).await;
        if hang {
            let mut buf = [0u8; 16];
            let _ = stream.read(&mut buf).await;
        }
    });
    addr
}

#[tokio::test]
async fn agent_reads_one_line_and_failures_are_no_input() {
    let addr = agent_answering(b"up, 50%\nignored\n", true).await;
    let report = agent_once(addr, GENEROUS).await.expect("a report");
    assert_eq!(report.weight_percent, Some(50));
    // A line ended by the close counts.
    let addr = agent_answering(b"drain", false).await;
    assert!(agent_once(addr, GENEROUS).await.is_some());
    // Garbage, an endless line, a silent agent, a refused connection: nothing.
    let addr = agent_answering(b"hello there\n", false).await;
    assert_eq!(agent_once(addr, GENEROUS).await, None);
    let endless: &'static [u8] = Box::leak(vec![b'u'; 4096].into_boxed_slice());
    let addr = agent_answering(endless, true).await;
    assert_eq!(agent_once(addr, GENEROUS).await, None);
    let addr = agent_answering(b"", true).await;
    assert_eq!(agent_once(addr, Duration::from_millis(100)).await, None);
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    assert_eq!(agent_once(addr, GENEROUS).await, None);
}
