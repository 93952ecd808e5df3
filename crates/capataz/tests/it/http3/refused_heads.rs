//! Request heads refused before the proxy sees them, as over HTTP/2: `Content-Length` fields
//! that do not state one number, and connection-specific fields, are malformed (RFC 9114
//! sections 4.1.2 and 4.2), their stream reset with `H3_MESSAGE_ERROR` as h2 resets the same
//! head with `PROTOCOL_ERROR`, never relayed; what the access log and the metrics say of
//! refused heads agrees (a 431 counted, no line for any of them, one line per request the
//! proxy answered, capataz's own 404 included).

use http::{Method, Request};

use super::oversized_head::{RawH3, STATUS_431};
use super::{h3_balancer, json_log, udp_addr, SITE};
use crate::support::access_log::{lines, wait_json, LogDir};
use crate::support::balancer::{metrics_text, ConfigText};
use crate::support::h3client::{connect, read_answer, H3Client};
use crate::support::raw::length_backend;
use crate::support::tls::Pki;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// Heads h2 refuses over HTTP/2 as malformed: each is the fields of one POST of five bytes.
const MALFORMED: [&[(&str, &str)]; 12] = [
    &[("content-length", "5"), ("content-length", "6")],
    &[("content-length", "5, 6")],
    &[("content-length", "5, 5")],
    &[("content-length", "abc")],
    &[("content-length", "+5")],
    &[("content-length", "5"), ("content-length", "abc")],
    &[("content-length", "5"), ("transfer-encoding", "chunked")],
    &[("content-length", "5"), ("connection", "close")],
    &[("content-length", "5"), ("keep-alive", "timeout=5")],
    &[("content-length", "5"), ("proxy-connection", "keep-alive")],
    &[("content-length", "5"), ("upgrade", "websocket")],
    &[("content-length", "5"), ("te", "gzip")],
];

/// A POST to `/upload` with `fields`.
fn upload(fields: &[(&str, &str)]) -> Request<()> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("https://{SITE}/upload"));
    for (name, value) in fields {
        request = request.header(*name, *value);
    }
    request.body(()).unwrap()
}

/// Sends each of [`MALFORMED`] with five bytes of body: every stream must be reset with
/// `H3_MESSAGE_ERROR`, none answered.
async fn send_malformed(client: &mut H3Client) {
    for fields in MALFORMED {
        let mut stream = client.start(upload(fields), Some(b"hello")).await.unwrap();
        let answer = tokio::time::timeout(DEADLINE, read_answer(&mut stream)).await;
        let answer = answer.expect("the request was held");
        match answer {
            Ok(answer) => panic!(
                "{fields:?} answered {}: {}",
                answer.head.status(),
                answer.text()
            ),
            Err(error) => assert!(error.contains("H3_MESSAGE_ERROR"), "{fields:?}: {error}"),
        }
    }
}

/// One `Content-Length: 5`.
const FIVE: &[(&str, &str)] = &[("content-length", "5")];

#[tokio::test]
async fn conflicting_content_lengths_and_connection_fields_reset_the_http3_stream() {
    let pki = Pki::new();
    let backend = length_backend().await;
    let config = ConfigText::new(&[backend.entry("a")]).extra("active.kind = \"none\"\n");
    let (balancer, _) = h3_balancer(&pki, config, Some(""), "").await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    send_malformed(&mut client).await;
    assert_eq!(
        backend.accepted(),
        0,
        "a malformed request reached the backend"
    );
    // Equal fields state one length, and `TE: trailers` is allowed, as over HTTP/2: relayed,
    // on the same connection.
    let fields = [
        ("content-length", "5"),
        ("content-length", "5"),
        ("te", "trailers"),
    ];
    let answer = client.exchange(upload(&fields), b"hello").await.unwrap();
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
    // `/upload` routed to the backend, anything else capataz's 404.
    let listener = format!(
        "max_header_bytes = 4096\n{}[[listeners.routes]]\npath_prefix = \"/upload\"\n\
         pool = \"web\"\n",
        json_log(&log)
    );
    let (balancer, _) = h3_balancer(&pki, config, Some(""), &listener).await;
    let addr = udp_addr(&balancer);
    // A head over `max_header_bytes` (h3's own client keeps to the limit, so written by
    // hand): answered 431 by h3.
    let raw = RawH3::connect(&pki, addr).await;
    let (kind, payload) = raw.head("x-big", &[b'v'; 5000]).await;
    assert_eq!((kind, payload.as_slice()), (0x01, &STATUS_431[..]));
    // Malformed: reset, not answered.
    let mut client = connect(&pki, addr, SITE).await.unwrap();
    send_malformed(&mut client).await;
    // No route: capataz's own 404, from the proxy.
    let answer = client.get(SITE, "/elsewhere").await.unwrap();
    assert_eq!(answer.head.status(), 404);
    // Two requests the backend answers.
    let answer = client.exchange(upload(FIVE), b"hello").await.unwrap();
    assert_eq!(answer.text(), "5");
    assert_eq!(client.get(SITE, "/upload").await.unwrap().text(), "0");

    // The metrics: the 431 under no route and method `other`, the 404 and the two answers;
    // the resets count nothing (no answer was sent).
    let refused = "capataz_client_requests_total{listener=\"listener-0\",route=\"\",pool=\"\",\
                   method=\"other\",class=\"4xx\",answered_by=\"capataz\"} 1";
    wait_until("the 431 counted", || {
        metrics_text(&balancer).contains(refused)
    })
    .await;
    let page = metrics_text(&balancer);
    assert_eq!(client_requests(&page), 4, "{page}");
    // The access log: a line per request the proxy answered (capataz's 404 included), none
    // for a head refused before it, as over HTTP/1.1 and HTTP/2: every answer counted but
    // the 431 has its line.
    let logged = wait_json(&log, 3).await;
    let seen: Vec<_> = logged
        .iter()
        .map(|line| (line["status"].as_u64(), line["ended_by"].as_str()))
        .collect();
    let expected = [(404, "capataz"), (200, "-"), (200, "-")];
    let expected: Vec<_> = expected.iter().map(|(s, e)| (Some(*s), Some(*e))).collect();
    assert_eq!(seen, expected, "{logged:?}");
    assert!(
        logged.iter().all(|line| line["protocol"] == "HTTP/3.0"),
        "{logged:?}"
    );
    assert_eq!(
        lines(&log).len() as u64,
        client_requests(&page) - 1,
        "{logged:?}"
    );
}
