//! Request heads refused before the proxy sees them, as over HTTP/2: `Content-Length` fields
//! that do not state one number are malformed (RFC 9114 section 4.1.2), their stream reset
//! with `H3_MESSAGE_ERROR` as h2 resets the same head with `PROTOCOL_ERROR`, never relayed;
//! what the access log and the metrics say of refused heads agrees (a 431 counted, no line
//! for any of them, one line per request the proxy answered).

use http::{Method, Request};

use super::oversized_head::{first_frame, headers_frame, STATUS_431};
use super::{h3_balancer, json_log, udp_addr, SITE};
use crate::support::access_log::{lines, wait_json, LogDir};
use crate::support::balancer::{metrics_text, ConfigText};
use crate::support::h3client::{client_config, connect, read_answer, H3Client};
use crate::support::raw::length_backend;
use crate::support::tls::Pki;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// `Content-Length` fields h2 refuses over HTTP/2: each list is one request's fields.
const NOT_ONE_LENGTH: [&[&str]; 6] = [
    &["5", "6"],
    &["5, 6"],
    &["5, 5"],
    &["abc"],
    &["+5"],
    &["5", "abc"],
];

/// A POST of five bytes to `/upload` with `lengths` as its `Content-Length` fields.
fn upload(lengths: &[&str]) -> Request<()> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("https://{SITE}/upload"));
    for length in lengths {
        request = request.header("content-length", *length);
    }
    request.body(()).unwrap()
}

/// Sends each of [`NOT_ONE_LENGTH`] with five bytes of body: every stream must be reset with
/// `H3_MESSAGE_ERROR`, none answered.
async fn send_not_one_length(client: &mut H3Client) {
    for lengths in NOT_ONE_LENGTH {
        let mut stream = client.start(upload(lengths), Some(b"hello")).await.unwrap();
        let answer = tokio::time::timeout(DEADLINE, read_answer(&mut stream)).await;
        let answer = answer.expect("the request was held");
        match answer {
            Ok(answer) => panic!(
                "{lengths:?} answered {}: {}",
                answer.head.status(),
                answer.text()
            ),
            Err(error) => assert!(error.contains("H3_MESSAGE_ERROR"), "{lengths:?}: {error}"),
        }
    }
}

#[tokio::test]
async fn conflicting_content_lengths_reset_the_http3_stream_before_any_backend() {
    let pki = Pki::new();
    let backend = length_backend().await;
    let config = ConfigText::new(&[backend.entry("a")]).extra("active.kind = \"none\"\n");
    let (balancer, _) = h3_balancer(&pki, config, Some(""), "").await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    send_not_one_length(&mut client).await;
    assert_eq!(
        backend.accepted(),
        0,
        "a malformed request reached the backend"
    );
    // Equal fields state one length, as over HTTP/2: relayed, on the same connection.
    let answer = client
        .exchange(upload(&["5", "5"]), b"hello")
        .await
        .unwrap();
    assert_eq!(answer.head.status(), 200);
    assert_eq!(answer.text(), "5");
}

/// The sum of `capataz_client_requests_total`'s series on `page`.
fn client_requests(page: &str) -> u64 {
    page.lines()
        .filter(|line| line.starts_with("capataz_client_requests_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn refused_http3_heads_are_counted_as_over_http2_and_the_access_log_agrees() {
    let pki = Pki::new();
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let backend = length_backend().await;
    let config = ConfigText::new(&[backend.entry("a")]).extra("active.kind = \"none\"\n");
    let listener = format!("max_header_bytes = 4096\n{}", json_log(&log));
    let (balancer, _) = h3_balancer(&pki, config, Some(""), &listener).await;
    let addr = udp_addr(&balancer);
    // A head over `max_header_bytes` (h3's own client keeps to the limit, so written by
    // hand): answered 431 by h3.
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let raw = endpoint
        .connect_with(client_config(&pki), addr, SITE)
        .unwrap()
        .await
        .expect("QUIC connection");
    let mut control = raw.open_uni().await.unwrap();
    control.write_all(&[0x00, 0x04, 0x00]).await.unwrap();
    let (mut send, mut recv) = raw.open_bi().await.unwrap();
    send.write_all(&headers_frame("x-big", &[b'v'; 5000]))
        .await
        .unwrap();
    send.finish().unwrap();
    let (kind, payload) = tokio::time::timeout(DEADLINE, first_frame(&mut recv))
        .await
        .expect("an answer in time");
    assert_eq!((kind, payload.as_slice()), (0x01, &STATUS_431[..]));
    // Malformed lengths: reset, not answered.
    let mut client = connect(&pki, addr, SITE).await.unwrap();
    send_not_one_length(&mut client).await;
    // Two requests the proxy answers.
    let answer = client.exchange(upload(&["5"]), b"hello").await.unwrap();
    assert_eq!(answer.text(), "5");
    assert_eq!(client.get(SITE, "/").await.unwrap().head.status(), 200);

    // The metrics: the 431 under no route and method `other`, the two answers; the resets
    // count nothing (no answer was sent).
    let refused = "capataz_client_requests_total{listener=\"listener-0\",route=\"\",pool=\"\",\
                   method=\"other\",class=\"4xx\",answered_by=\"capataz\"} 1";
    wait_until("the 431 counted", || {
        metrics_text(&balancer).contains(refused)
    })
    .await;
    let page = metrics_text(&balancer);
    assert_eq!(client_requests(&page), 3, "{page}");
    // The access log: a line per request the proxy answered, none for a refused head, as
    // over HTTP/1.1 and HTTP/2.
    let logged = wait_json(&log, 2).await;
    for line in &logged {
        assert_eq!(line["protocol"], "HTTP/3.0", "{line}");
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["ended_by"], "-", "{line}");
    }
    assert_eq!(
        lines(&log).len() as u64,
        client_requests(&page) - 1,
        "{logged:?}"
    );
}
