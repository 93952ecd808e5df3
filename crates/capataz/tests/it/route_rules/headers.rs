//! Header rules (the listener's, then the route's: remove, set, add), variables, the
//! `Forwarded` element and the request id, as the backend receives them and as the client
//! and the access log see them, over HTTP/1.1 and HTTP/2.

use bytes::Bytes;
use http::Method;

use super::*;
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::balancer::start;
use crate::support::client::Client;
use crate::support::h2client;

#[tokio::test]
async fn header_rules_forwarded_and_request_id_reach_the_backend_the_client_and_the_log() {
    let echo = echo_backend("web1").await;
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
h2c = true
forwarded = "both"
request_id = {{ response = true }}

[listeners.request_headers]
remove = ["X-Secret"]
set = {{ "X-Env" = "prod", "X-Client" = "%{{client_ip}}:%{{client_port}} %{{scheme}} %{{host}} %{{pool}}", "X-Id" = "%{{request_id}}", "X-Sni" = "%{{tls_sni}}" }}
add = {{ "X-Via" = "capataz" }}

[listeners.response_headers]
set = {{ "X-Served-By" = "%{{backend}} for %{{request_id}}" }}
remove = ["X-Backend"]

{log_table}
  [[listeners.routes]]
  path_prefix = "/canary/"
  pool = "web"
  request_headers = {{ set = {{ "X-Env" = "canary" }}, remove = ["X-Via"] }}
  response_headers = {{ add = {{ "X-Route" = "canary" }} }}

  [[listeners.routes]]
  pool = "web"

{pool}"#,
        log_table = table(&log, "json", ""),
        pool = pool("web", echo.addr),
    );
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut client = Client::strict(addr);
    let request = http::Request::builder()
        .uri("/a?b=c")
        .header("host", "app.test:8080")
        .header("x-secret", "s3cret")
        .header("x-env", "client's")
        .header("x-via", "client")
        .header("forwarded", "for=198.51.100.1")
        .header("x-request-id", "given-id-1")
        .body(Bytes::new())
        .unwrap();
    let answer = client.request(request).await;
    assert_eq!(answer.status, 200);
    let head = String::from_utf8(answer.body.to_vec()).unwrap();
    assert!(echoed(&head, "x-secret").is_empty(), "{head}");
    assert_eq!(echoed(&head, "x-env"), ["prod"], "{head}");
    // `add` keeps what was there.
    assert_eq!(echoed(&head, "x-via"), ["client", "capataz"], "{head}");
    let port = client_port(&echoed(&head, "x-client"));
    assert_eq!(
        echoed(&head, "x-client"),
        [format!("127.0.0.1:{port} http app.test:8080 web").as_str()],
        "{head}"
    );
    // No TLS: %{tls_sni} renders empty and the field is not sent.
    assert!(echoed(&head, "x-sni").is_empty(), "{head}");
    assert_eq!(
        echoed(&head, "forwarded"),
        ["for=198.51.100.1, for=127.0.0.1;proto=http;host=\"app.test:8080\""],
        "{head}"
    );
    assert_eq!(echoed(&head, "x-forwarded-for"), ["127.0.0.1"], "{head}");
    // The client's own id is kept, sent on, returned, and usable in values.
    assert_eq!(echoed(&head, "x-request-id"), ["given-id-1"], "{head}");
    assert_eq!(echoed(&head, "x-id"), ["given-id-1"], "{head}");
    assert_eq!(answer.headers["x-request-id"], "given-id-1");
    assert_eq!(answer.headers["x-served-by"], "web1 for given-id-1");
    assert!(answer.headers.get("x-backend").is_none());
    assert!(answer.headers.get("x-route").is_none());

    // The route's rules run after the listener's; an id that is not sane is replaced.
    let mut h2 = h2client::connect(addr).await;
    let mut request = h2client::request(Method::GET, "app.test", "/canary/x", h2client::empty());
    request
        .headers_mut()
        .insert("x-request-id", "has space".parse().unwrap());
    let answer = h2.send(request).await.expect("an HTTP/2 answer");
    assert_eq!(answer.status, 200);
    let head = answer.text();
    assert_eq!(echoed(&head, "x-env"), ["canary"], "{head}");
    assert!(echoed(&head, "x-via").is_empty(), "{head}");
    let id = answer.header("x-request-id").expect("an id").to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(echoed(&head, "x-request-id"), [id.as_str()], "{head}");
    assert_eq!(
        echoed(&head, "forwarded"),
        ["for=127.0.0.1;proto=http;host=app.test"],
        "{head}"
    );
    assert_eq!(answer.header("x-route"), Some("canary"));

    // capataz's own answers carry the id too, and every line of the log has it.
    let answer = client.send("GET", "/x", "bad host", Bytes::new()).await;
    assert_eq!(answer.status, 400);
    let made = answer.headers["x-request-id"].to_str().unwrap().to_owned();
    let lines = wait_json(&log, 3).await;
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["given-id-1", id.as_str(), made.as_str()]);
}

/// The port in `["127.0.0.1:PORT ..."]`.
fn client_port(values: &[&str]) -> u16 {
    let first = values.first().expect("one value");
    let port = first.split_once(':').unwrap().1.split(' ').next().unwrap();
    port.parse().unwrap()
}

#[tokio::test]
async fn forwarded_none_adds_nothing_and_keep_incoming_false_replaces_the_id() {
    let echo = echo_backend("web1").await;
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
forwarded = "none"
request_id = {{ header = "X-Trace", keep_incoming = false }}

[listeners.request_headers]
set = {{ "X-Host" = "%{{host}}", "X-Trace-Copy" = "%{{request_id}}" }}

{pool}"#,
        pool = pool("web", echo.addr),
    );
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let request = http::Request::builder()
        .uri("/")
        .header("host", "app.test")
        .header("x-trace", "mine")
        .header("forwarded", "for=203.0.113.9")
        .body(Bytes::new())
        .unwrap();
    let answer = client.request(request).await;
    let head = String::from_utf8(answer.body.to_vec()).unwrap();
    assert_eq!(echoed(&head, "x-host"), ["app.test"], "{head}");
    // keep_incoming = false: the client's id is replaced.
    let trace = echoed(&head, "x-trace");
    assert_eq!(trace.len(), 1, "{head}");
    assert_ne!(trace[0], "mine");
    assert_eq!(echoed(&head, "x-trace-copy"), trace, "{head}");
    assert!(answer.headers.get("x-trace").is_none(), "response = false");
    assert_eq!(echoed(&head, "forwarded"), ["for=203.0.113.9"], "{head}");
    assert!(echoed(&head, "x-forwarded-for").is_empty(), "{head}");
}

/// `%{host}` in an answer's rule alone (no request rule, no `Forwarded`) still renders the
/// request's host: the host is kept for the answer whenever any rule names it.
#[tokio::test]
async fn a_response_rule_alone_renders_the_requests_host() {
    let echo = echo_backend("web1").await;
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
forwarded = "none"

[listeners.response_headers]
set = {{ "X-Asked-For" = "%{{host}}" }}

{pool}"#,
        pool = pool("web", echo.addr),
    );
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let request = http::Request::builder()
        .uri("/")
        .header("host", "app.test:8080")
        .body(Bytes::new())
        .unwrap();
    let answer = client.request(request).await;
    assert_eq!(answer.headers["x-asked-for"], "app.test:8080");
}
