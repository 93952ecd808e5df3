//! Routes tried in order, the first whose every matcher matches wins: methods, exact path,
//! path regex, header and query matchers, over HTTP/1.1 and HTTP/2.

use bytes::Bytes;
use capataz::sim::{Mode, SimBackend};
use http::Method;

use super::*;
use crate::support::balancer::{metrics_text, start};
use crate::support::client::Client;
use crate::support::h2client;
use crate::support::wait::wait_until;
use crate::support::{any, DEADLINE};

/// Four routes, each on a pool of its own, then a catch-all prefix.
async fn routed() -> (capataz::server::Balancer, Vec<RawBackend>) {
    let names = ["canary", "login", "items", "static"];
    let mut echoes = Vec::new();
    for name in names {
        echoes.push(echo_backend(name).await);
    }
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
h2c = true

  [[listeners.routes]]
  name = "canary"
  headers = [{{ name = "X-Canary", value = "1" }}, {{ name = "cookie", value_regex = ".*beta=on.*" }}]
  pool = "canary"

  [[listeners.routes]]
  methods = ["POST", "PUT"]
  path = "/login"
  pool = "login"

  [[listeners.routes]]
  path_regex = "/items/[0-9]+"
  query = [{{ name = "v", value = "2" }}, {{ name = "debug", present = true }}]
  pool = "items"

  [[listeners.routes]]
  path_prefix = "/static/"
  pool = "static"

{}{}{}{}"#,
        pool("canary", echoes[0].addr),
        pool("login", echoes[1].addr),
        pool("items", echoes[2].addr),
        pool("static", echoes[3].addr),
    );
    let (balancer, _rx) = start(&text).await;
    (balancer, echoes)
}

/// A request's method, path and extra header, and the backend expected (`None`: 404).
type Case = (
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
    Option<&'static str>,
);

const CASES: &[Case] = &[
    // The canary route needs its cookie too.
    (
        "GET",
        "/static/a.js",
        Some(("x-canary", "1")),
        Some("static"),
    ),
    ("GET", "/static/a.js", None, Some("static")),
    ("POST", "/login", None, Some("login")),
    ("PUT", "/login?next=/", None, Some("login")),
    // Wrong method, or not the exact path: no route.
    ("GET", "/login", None, None),
    ("POST", "/login/", None, None),
    ("GET", "/items/42?v=2&debug", None, Some("items")),
    ("GET", "/items/42?debug=1&v=2", None, Some("items")),
    // The regex must match the whole path; the query must hold both parameters.
    ("GET", "/items/42/x?v=2&debug", None, None),
    ("GET", "/items/42?v=3&debug", None, None),
    ("GET", "/items/42?v=2", None, None),
    ("GET", "/items/4x2?v=2&debug", None, None),
];

#[tokio::test]
async fn route_matchers_pick_the_first_route_whose_every_matcher_matches() {
    let (balancer, echoes) = routed().await;
    let addr = balancer.local_addrs()[0];
    let mut client = Client::strict(addr);
    let mut h2 = h2client::connect(addr).await;
    for (method, path, header, backend) in CASES {
        let mut request = http::Request::builder()
            .method(*method)
            .uri(*path)
            .header("host", "app.test");
        if let Some((name, value)) = header {
            request = request.header(*name, *value);
        }
        let answer = client.request(request.body(Bytes::new()).unwrap()).await;
        let status = if backend.is_some() { 200 } else { 404 };
        assert_eq!(answer.status, status, "HTTP/1.1 {method} {path}");
        assert_eq!(
            answer.backend.as_deref(),
            *backend,
            "HTTP/1.1 {method} {path}"
        );
        let mut request = h2client::request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            "app.test",
            path,
            h2client::empty(),
        );
        if let Some((name, value)) = header {
            request.headers_mut().insert(*name, value.parse().unwrap());
        }
        let answer = h2.send(request).await.expect("an HTTP/2 answer");
        assert_eq!(answer.status, status, "HTTP/2 {method} {path}");
        assert_eq!(
            answer.header("x-backend"),
            *backend,
            "HTTP/2 {method} {path}"
        );
    }
    // The canary needs both fields; one of several Cookie crumbs (HTTP/2) is enough.
    let canary = |cookies: &[&str]| {
        let mut request =
            h2client::request(Method::GET, "app.test", "/static/a.js", h2client::empty());
        request
            .headers_mut()
            .insert("x-canary", "1".parse().unwrap());
        for cookie in cookies {
            request
                .headers_mut()
                .append("cookie", cookie.parse().unwrap());
        }
        request
    };
    let answer = h2.send(canary(&["a=1", "beta=on"])).await.unwrap();
    assert_eq!(answer.header("x-backend"), Some("canary"));
    let answer = h2.send(canary(&["beta=off"])).await.unwrap();
    assert_eq!(answer.header("x-backend"), Some("static"));
    let answer = client
        .request(
            http::Request::builder()
                .uri("/x")
                .header("host", "app.test")
                .header("x-canary", "1")
                .header("cookie", "id=7; beta=on")
                .body(Bytes::new())
                .unwrap(),
        )
        .await;
    assert_eq!(answer.backend.as_deref(), Some("canary"));
    // What each backend was sent is what the counts say.
    let hits: Vec<u64> = echoes.iter().map(RawBackend::hits).collect();
    assert_eq!(hits, [2, 4, 4, 5]);
    // A named route is labelled by its name; the others by host and path prefix.
    let metrics = metrics_text(&balancer);
    assert!(
        metrics.contains(r#"route="canary",pool="canary""#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"route="/static/",pool="static""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_request_matching_a_route_whose_pool_is_down_gets_503_not_the_next_route() {
    let canary = SimBackend::start("canary1", any()).await.unwrap();
    let stable = SimBackend::start("stable1", any()).await.unwrap();
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"

  [[listeners.routes]]
  headers = [{{ name = "x-canary", present = true }}]
  pool = "canary"

  [[listeners.routes]]
  pool = "stable"

[pools.canary]
backends = [{{ name = "canary1", address = "{}" }}]
when_all_down = "reject"
[pools.canary.active]
path = "/healthz"
interval = "30ms"
timeout = "100ms"
rise = 1
fall = 1

[pools.stable]
backends = [{{ name = "stable1", address = "{}" }}]
[pools.stable.active]
kind = "none"
"#,
        canary.addr(),
        stable.addr()
    );
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let canary_request = || {
        http::Request::builder()
            .uri("/")
            .header("host", "app.test")
            .header("x-canary", "")
            .body(Bytes::new())
            .unwrap()
    };
    let answer = client.request(canary_request()).await;
    assert_eq!(answer.backend.as_deref(), Some("canary1"));
    canary.set_health(Mode::Status(500));
    let deadline = tokio::time::Instant::now() + DEADLINE;
    // Routing does not look at health: once the canary pool is down its requests get the
    // pool's 503 (`when_all_down = "reject"`), and the stable pool sees none of them.
    loop {
        let answer = client.request(canary_request()).await;
        if answer.status == 503 {
            assert_eq!(answer.backend, None);
            break;
        }
        assert_eq!(answer.backend.as_deref(), Some("canary1"));
        assert!(
            tokio::time::Instant::now() < deadline,
            "the canary never went down"
        );
    }
    assert_eq!(stable.traffic_hits(), 0);
    let answer = client.get("/").await;
    assert_eq!(answer.backend.as_deref(), Some("stable1"));
    // Back up: its requests go back to it.
    canary.set_health(Mode::Status(200));
    let mut back = false;
    while !back {
        back = client.request(canary_request()).await.backend.as_deref() == Some("canary1");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the canary never came back"
        );
    }
    wait_until("the stable pool got one request", || {
        stable.traffic_hits() == 1
    })
    .await;
}
