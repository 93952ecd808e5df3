//! Path rewriting per route (`strip_prefix`, `replace_prefix`, `regex_rewrite`): the backend
//! gets the new path and the query as sent, over HTTP/1.1 and HTTP/2; a rewrite that leaves
//! no path gets capataz's 500.

use bytes::Bytes;
use http::Method;

use super::*;
use crate::support::balancer::start;
use crate::support::client::Client;
use crate::support::h2client;

#[tokio::test]
async fn routes_rewrite_the_path_their_backends_get_and_keep_the_query() {
    let echo = echo_backend("web1").await;
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
h2c = true

  [[listeners.routes]]
  path_prefix = "/api"
  strip_prefix = true
  pool = "web"

  [[listeners.routes]]
  path_prefix = "/old/"
  replace_prefix = "/new/"
  pool = "web"

  [[listeners.routes]]
  path_regex = "/v[0-9]+/.*"
  regex_rewrite = {{ pattern = "^/v([0-9]+)/(.*)", substitution = "/svc/$2/version/$1" }}
  pool = "web"

  [[listeners.routes]]
  path_prefix = "/bad/"
  regex_rewrite = {{ pattern = "^/bad/", substitution = "" }}
  pool = "web"

  [[listeners.routes]]
  pool = "web"

{}"#,
        pool("web", echo.addr)
    );
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut client = Client::strict(addr);
    let mut h2 = h2client::connect(addr).await;
    let cases = [
        ("/api/users?id=7&x", "/users?id=7&x"),
        ("/api", "/"),
        ("/apiary", "/ary"),
        ("/old/a/b?q", "/new/a/b?q"),
        ("/v2/items?page=3", "/svc/items/version/2?page=3"),
        ("/other%2Fpath?x=/api", "/other%2Fpath?x=/api"),
    ];
    for (sent, got) in cases {
        let answer = client.send("GET", sent, "app.test", Bytes::new()).await;
        assert_eq!(answer.status, 200, "{sent}");
        let head = String::from_utf8(answer.body.to_vec()).unwrap();
        assert_eq!(
            head.lines().next(),
            Some(format!("GET {got} HTTP/1.1").as_str()),
            "{sent}"
        );
        let answer = h2
            .send(h2client::request(
                Method::GET,
                "app.test",
                sent,
                h2client::empty(),
            ))
            .await
            .expect("an HTTP/2 answer");
        let head = answer.text();
        assert_eq!(
            head.lines().next(),
            Some(format!("GET {got} HTTP/1.1").as_str()),
            "h2 {sent}"
        );
        // The host stays what the client sent.
        assert_eq!(echoed(&head, "host"), ["app.test"], "h2 {sent}");
    }
    let hits = echo.hits();
    let answer = client.send("GET", "/bad/x", "app.test", Bytes::new()).await;
    assert_eq!(answer.status, 500);
    assert_eq!(echo.hits(), hits, "a failed rewrite sends nothing");
}
