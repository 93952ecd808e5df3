//! Requests over HTTP/3 take the same path as HTTP/1.1 and HTTP/2 ones: routing, the pool's
//! balancing and health, the access log (protocol `HTTP/3.0`) and the metrics.

use http::{Method, Request, StatusCode};

use super::{h3_balancer, json_log, udp_addr, SITE};
use crate::support::access_log::{wait_json, LogDir};
use capataz::sim::Mode;
use capataz_health::State;

use crate::support::balancer::{backends, metrics_text, ConfigText, FAST_CHECKS};
use crate::support::events::{is_transition, wait_for};
use crate::support::h3client::connect;
use crate::support::tls::{get, Client, Pki};

#[tokio::test]
async fn a_get_over_http3_reaches_the_http1_backend_and_is_logged_as_http3() {
    let pki = Pki::new();
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let b = backends(&["a"]).await;
    let balancer = h3_balancer(&pki, ConfigText::sims(&b), Some(""), &json_log(&log))
        .await
        .0;
    let mut client = connect(&pki, udp_addr(&balancer), SITE)
        .await
        .expect("HTTP/3 connection");
    let answer = client.get(SITE, "/path?q=1").await.expect("answer");
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.text(), "a\n");
    assert_eq!(answer.header("x-backend"), Some("a"));
    // The backend got the authority as Host, and the forwarded fields of a TLS client.
    assert_eq!(answer.header("x-seen-host"), Some(SITE));
    assert_eq!(answer.header("x-seen-proto"), Some("https"));
    assert_eq!(answer.header("x-seen-xff"), Some("127.0.0.1"));
    // HTTP/3 answers do not advertise HTTP/3 again.
    assert_eq!(answer.header("alt-svc"), None);
    assert_eq!(b[0].traffic_hits(), 1);
    let line = &wait_json(&log, 1).await[0];
    assert_eq!(line["protocol"], "HTTP/3.0", "{line}");
    assert_eq!(line["target"], "/path?q=1", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["backend"], "a", "{line}");
    assert_eq!(line["tls_version"], "TLSv1.3", "{line}");
    assert_eq!(line["sni"], SITE, "{line}");
    assert_eq!(line["ended_by"], "-", "{line}");
    // Counted as the listener's answers and connections, as any other request.
    let metrics = metrics_text(&balancer);
    assert!(
        metrics.contains("capataz_client_connections_accepted_total{listener=\"listener-0\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn alt_svc_is_on_the_tcp_answers_only_when_http3_is_on() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    for (http3, want) in [
        (None, None),
        (Some(""), Some("ma=86400")),
        (Some("alt_svc_max_age = \"1h\""), Some("ma=3600")),
    ] {
        let (balancer, _) = h3_balancer(&pki, ConfigText::sims(&b), http3, "").await;
        let addr = balancer.local_addrs()[0];
        let mut stream = Client::trusting(&pki)
            .connect(addr, SITE)
            .await
            .expect("TLS");
        let (head, _) = get(&mut stream, SITE).await.expect("HTTP/1.1 answer");
        let alt_svc = head
            .lines()
            .find_map(|l| l.strip_prefix("alt-svc: "))
            .map(str::to_owned);
        match want {
            None => assert_eq!(alt_svc, None, "{head}"),
            Some(max_age) => assert_eq!(
                alt_svc,
                Some(format!("h3=\":{}\"; {max_age}", addr.port())),
                "{head}"
            ),
        }
    }
}

#[tokio::test]
async fn a_post_body_goes_to_the_backend_and_requests_round_robin_over_two_backends() {
    let pki = Pki::new();
    let b = backends(&["a", "b"]).await;
    let balancer = h3_balancer(&pki, ConfigText::sims(&b), Some(""), "")
        .await
        .0;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    let mut seen = Vec::new();
    for i in 0..4 {
        let body = vec![b'x'; 10_000 + i];
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("https://{SITE}/upload"))
            .header("content-length", body.len())
            .body(())
            .unwrap();
        let answer = client.exchange(request, &body).await.expect("answer");
        assert_eq!(answer.head.status(), StatusCode::OK);
        seen.push(answer.header("x-backend").unwrap().to_owned());
    }
    assert_eq!(seen, ["a", "b", "a", "b"]);
    assert_eq!((b[0].traffic_hits(), b[1].traffic_hits()), (2, 2));
}

#[tokio::test]
async fn a_down_backend_gets_no_http3_request() {
    let pki = Pki::new();
    let b = backends(&["a", "b"]).await;
    b[1].set_health(Mode::Status(500));
    let config = ConfigText::sims(&b).extra(FAST_CHECKS);
    let (balancer, mut events) = h3_balancer(&pki, config, Some(""), "").await;
    wait_for(&mut events, "b DOWN", |e| {
        is_transition(e, "b", State::Down)
    })
    .await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    let before = b[1].traffic_hits();
    for _ in 0..6 {
        let answer = client.get(SITE, "/").await.expect("answer");
        assert_eq!(answer.header("x-backend"), Some("a"));
    }
    assert_eq!(b[1].traffic_hits(), before, "the DOWN backend got traffic");
}

#[tokio::test]
async fn a_head_with_too_many_fields_gets_431_and_reaches_no_backend() {
    // (A head over `max_header_bytes` cannot be sent with this client: h3 checks the limit
    // the server announces in its SETTINGS before sending.)
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let config = ConfigText::sims(&b);
    let (balancer, _) = h3_balancer(&pki, config, Some(""), "").await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    let mut many = Request::get(format!("https://{SITE}/"));
    for i in 0..150 {
        many = many.header(format!("x-f{i}"), "v");
    }
    let answer = client
        .exchange(many.body(()).unwrap(), b"")
        .await
        .expect("answer");
    assert_eq!(
        answer.head.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(b[0].traffic_hits(), 0);
    // Counted as a refused head, as on HTTP/1.1.
    let metrics = metrics_text(&balancer);
    let refused = metrics.lines().find(|line| {
        line.starts_with("capataz_client_requests_total{")
            && line.contains("method=\"other\"")
            && line.contains("class=\"4xx\"")
            && line.contains("answered_by=\"capataz\"")
    });
    assert_eq!(
        refused.and_then(|l| l.rsplit(' ').next()),
        Some("1"),
        "{metrics}"
    );
    // The connection goes on.
    assert_eq!(
        client.get(SITE, "/").await.unwrap().head.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn an_http2_pool_answers_http3_clients_with_its_trailers() {
    use std::sync::Arc;

    use crate::support::backends_tls::{HttpBackend, Reply, Speaks};
    let backend = HttpBackend::start(
        "b",
        Speaks::H2,
        None,
        Arc::new(|_| {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-checksum", "abc123".parse().unwrap());
            Reply::Ok {
                status: 200,
                headers: vec![("trailer", "x-checksum".into())],
                body: bytes::Bytes::from_static(b"payload"),
                trailers: Some(trailers),
            }
        }),
    )
    .await;
    let pki = Pki::new();
    let config =
        ConfigText::new(&[backend.entry()]).extra("protocol = \"h2c\"\nactive.kind = \"none\"\n");
    let (balancer, _) = h3_balancer(&pki, config, Some(""), "").await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    let request = Request::get(format!("https://{SITE}/"))
        .header("te", "trailers")
        .body(())
        .unwrap();
    let answer = client.exchange(request, b"").await.expect("answer");
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.text(), "payload");
    let trailers = answer.trailers.expect("trailers");
    assert_eq!(trailers.get("x-checksum").unwrap(), "abc123");
    assert_eq!(backend.hits(), 1);
}
