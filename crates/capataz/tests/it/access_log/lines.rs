//! One line per request, with the right fields, whatever the protocol.

use serde_json::Value;

use super::logging;
use crate::support::access_log::{wait_json, wait_lines, LogDir};
use crate::support::balancer::{backends, ConfigText};
use crate::support::cases;
use crate::support::client::{exchange, Client};
use crate::support::tls::{self as tls_support, Pki};
use crate::support::{h2client, raw};

/// How a JSON line case sends its one request; each is answered 200.
enum Request {
    /// GET `target` over HTTP/1.1 with `headers`.
    Http1(&'static str, &'static [(&'static str, &'static str)]),
    /// GET `/` over TLS to `site.test` (the listener's certificate's name).
    Tls,
    /// GET `target` over h2c.
    H2c(&'static str),
    /// These bytes, as they are.
    Raw(&'static [u8]),
}

/// Sends `request` to `addr`: the body's length where the case checks `bytes` (HTTP/1.1).
async fn send(addr: std::net::SocketAddr, request: &Request, pki: &Pki) -> Option<usize> {
    match request {
        Request::Http1(target, headers) => {
            let answer = exchange(addr, "GET", target, "app.test", headers).await;
            assert_eq!(answer.status, 200);
            return Some(answer.body.len());
        }
        Request::Tls => {
            let client = tls_support::Client::trusting(pki);
            let mut stream = client.connect(addr, "site.test").await.expect("handshake");
            let (head, _) = tls_support::get(&mut stream, "site.test")
                .await
                .expect("an answer");
            assert!(head.starts_with("http/1.1 200"), "{head}");
        }
        Request::H2c(target) => {
            let mut conn = h2client::connect(addr).await;
            assert_eq!(conn.get("app.test", target).await.status, 200);
        }
        Request::Raw(bytes) => {
            let reply = raw::raw_roundtrip(addr, bytes).await;
            assert_eq!(
                raw::status_of(&reply),
                Some(200),
                "{}",
                String::from_utf8_lossy(&reply)
            );
        }
    }
    None
}

/// The fields a line must have, and their values.
type Fields = Vec<(&'static str, Value)>;

#[tokio::test]
async fn a_request_is_one_json_line_with_its_fields() {
    let cases: [(&str, (Request, Fields)); 4] = [
        (
            "HTTP/1.1",
            (
                Request::Http1(
                    "/hello?x=1",
                    &[("user-agent", "probe/1"), ("referer", "http://r.test/")],
                ),
                vec![
                    ("method", "GET".into()),
                    ("target", "/hello?x=1".into()),
                    ("protocol", "HTTP/1.1".into()),
                    ("status", 200.into()),
                    ("client", "127.0.0.1".into()),
                    ("user_agent", "probe/1".into()),
                    ("referer", "http://r.test/".into()),
                    ("route", "/".into()),
                    ("pool", "web".into()),
                    ("backend", "a".into()),
                    ("attempts", 1.into()),
                    ("ended_by", "-".into()),
                    ("phase", "-".into()),
                    ("tls_version", Value::Null),
                ],
            ),
        ),
        (
            "over TLS: the version and the server name",
            (
                Request::Tls,
                vec![
                    ("tls_version", "TLSv1.3".into()),
                    ("sni", "site.test".into()),
                    ("status", 200.into()),
                ],
            ),
        ),
        (
            "over h2c: HTTP/2 and the path",
            (
                Request::H2c("/two?q=2"),
                vec![
                    ("protocol", "HTTP/2.0".into()),
                    ("target", "/two?q=2".into()),
                    ("backend", "a".into()),
                    ("ended_by", "-".into()),
                ],
            ),
        ),
        (
            "injected quotes and bytes parse back",
            (
                Request::Raw(HOSTILE),
                vec![
                    ("target", "/a?c=%0D%0A".into()),
                    (
                        "user_agent",
                        "evil\" ended_by=client phase=body \\\tend".into(),
                    ),
                    ("ended_by", "-".into()),
                ],
            ),
        ),
    ];
    cases::each(cases, |(request, fields)| async move {
        let sims = backends(&["a"]).await;
        let pki = Pki::new();
        let listener = match request {
            Request::Tls => {
                let (cert, key) = pki.server("site", &["site.test"], None);
                Pki::listener(&[(&cert, &key)], "")
            }
            Request::H2c(_) => "h2c = true".to_owned(),
            Request::Http1(..) | Request::Raw(_) => String::new(),
        };
        let dir = LogDir::new();
        let path = dir.path("access.log");
        let (_balancer, addr) = logging(ConfigText::sims(&sims), &path, "json", &listener).await;
        let bytes = send(addr, &request, &pki).await;
        let lines = wait_json(&path, 1).await;
        assert_eq!(lines.len(), 1);
        let line = &lines[0];
        for (field, value) in fields {
            assert_eq!(line[field], value, "{field}");
        }
        if let Some(bytes) = bytes {
            assert_eq!(line["bytes"], bytes as u64);
        }
        assert!(line["duration"].as_f64().unwrap() >= 0.0);
    })
    .await;
}

#[tokio::test]
async fn a_text_line_is_combined_like_then_capatazs_fields() {
    let sims = backends(&["a"]).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (_balancer, addr) = logging(ConfigText::sims(&sims), &path, "text", "").await;
    let answer = exchange(addr, "GET", "/x", "app.test", &[("user-agent", "ua")]).await;
    let lines = wait_lines(&path, 1).await;
    let line = &lines[0];
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    let expected = format!(
        "] \"GET /x HTTP/1.1\" 200 {} - \"ua\" listener=listener-0 route=\"/\" pool=web \
         backend=a attempts=1 ended_by=- phase=- duration=",
        answer.body.len()
    );
    assert!(line.contains(&expected), "{line}");
    assert!(line.contains(" tls=- sni=- client_port="), "{line}");
    assert!(line.ends_with(" truncated=false reason=-"), "{line}");
}

#[tokio::test]
async fn a_line_per_request_on_a_keep_alive_connection() {
    let sims = backends(&["a", "b"]).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (_balancer, addr) = logging(ConfigText::sims(&sims), &path, "json", "").await;
    let mut client = Client::new(addr);
    for i in 0..5 {
        assert_eq!(client.get(&format!("/n{i}")).await.status, 200);
    }
    let lines = wait_json(&path, 5).await;
    let mut targets: Vec<&str> = lines
        .iter()
        .map(|l| l["target"].as_str().unwrap())
        .collect();
    targets.sort();
    assert_eq!(targets, ["/n0", "/n1", "/n2", "/n3", "/n4"]);
}

/// A head with a quote, a backslash and a tab in a header (hyper refuses a quote or
/// a backslash in the target itself, and control bytes, 400, before the proxy sees them): the log keeps the
/// request on one line of its own fields.
const HOSTILE: &[u8] = b"GET /a?c=%0D%0A HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\
    User-Agent: evil\" ended_by=client phase=body \\\tend\r\n\r\n";

#[tokio::test]
async fn injected_quotes_and_bytes_stay_escaped_on_one_text_line() {
    let sims = backends(&["a"]).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (_balancer, addr) = logging(ConfigText::sims(&sims), &path, "text", "").await;
    let reply = raw::raw_roundtrip(addr, HOSTILE).await;
    assert_eq!(
        raw::status_of(&reply),
        Some(200),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let lines = wait_lines(&path, 1).await;
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert!(line.contains("\"GET /a?c=%0D%0A HTTP/1.1\""), "{line}");
    assert!(
        line.contains("\"evil\\x22 ended_by=client phase=body \\x5C\\x09end\""),
        "{line}"
    );
    // The real fields, once each.
    assert_eq!(line.matches(" ended_by=-").count(), 1, "{line}");
    // Only the quotes capataz writes: around the request, referer-less, the agent, route
    // and SNI-less fields.
    assert_eq!(line.matches('"').count(), 6, "{line}");
}

#[tokio::test]
async fn a_target_longer_than_the_bound_is_cut_and_marked() {
    let sims = backends(&["a"]).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (_balancer, addr) = logging(ConfigText::sims(&sims), &path, "json", "").await;
    let target = format!("/{}", "t".repeat(8000));
    let answer = exchange(addr, "GET", &target, "app.test", &[]).await;
    assert_eq!(answer.status, 200);
    let line = &wait_json(&path, 1).await[0];
    let logged = line["target"].as_str().unwrap();
    assert_eq!(logged.len(), capataz::access_log::MAX_FIELD);
    assert!(logged.ends_with("..."));
    assert_eq!(line["truncated"], true);
}
