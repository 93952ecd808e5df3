//! Redirect routes: answered by capataz with any 3xx and a `Location` built from the request,
//! without a pool; counted and logged under the route, over HTTP/1.1 and HTTP/2.

use bytes::Bytes;
use http::Method;

use super::*;
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::balancer::{metrics_text, start};
use crate::support::client::Client;
use crate::support::h2client;

#[tokio::test]
async fn redirect_routes_answer_without_a_pool() {
    let echo = echo_backend("web1").await;
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
h2c = true
{log_table}
  [[listeners.routes]]
  name = "to-https"
  host = "secure.test"
  redirect = {{ scheme = "https", status = 308 }}

  [[listeners.routes]]
  path_prefix = "/old/"
  redirect = {{ prefix = "/new/", status = 301 }}

  [[listeners.routes]]
  path = "/login"
  redirect = {{ host = "auth.test", port = 8443, path = "/signin", strip_query = true }}

  [[listeners.routes]]
  pool = "web"

{pool}"#,
        log_table = table(&log, "json", ""),
        pool = pool("web", echo.addr),
    );
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut client = Client::strict(addr);
    let mut h2 = h2client::connect(addr).await;
    let cases = [
        (
            "secure.test:8080",
            "/a/b?c=d",
            308,
            "https://secure.test/a/b?c=d",
        ),
        (
            "app.test:8080",
            "/old/x?y",
            301,
            "http://app.test:8080/new/x?y",
        ),
        (
            "app.test",
            "/login?next=/",
            302,
            "http://auth.test:8443/signin",
        ),
    ];
    for (host, path, status, location) in cases {
        let answer = client
            .send("POST", path, host, Bytes::from_static(b"body"))
            .await;
        assert_eq!(answer.status, status, "{host}{path}");
        assert_eq!(answer.headers["location"], location, "{host}{path}");
        let answer = h2
            .send(h2client::request(
                Method::GET,
                host,
                path,
                h2client::empty(),
            ))
            .await
            .expect("an HTTP/2 answer");
        assert_eq!(answer.status, status, "h2 {host}{path}");
        assert_eq!(answer.header("location"), Some(location), "h2 {host}{path}");
    }
    assert_eq!(echo.hits(), 0);
    let answer = client.get("/other").await;
    assert_eq!(answer.status, 200);
    // Counted under the route, answered by capataz, with no pool.
    let metrics = metrics_text(&balancer);
    assert!(metrics.contains(r#"route="to-https",pool="""#), "{metrics}");
    let lines = wait_json(&log, 7).await;
    assert_eq!(lines[0]["route"], "to-https");
    assert_eq!(lines[0]["status"], 308);
    assert!(lines[0]["pool"].is_null(), "{}", lines[0]);
    assert!(lines[0]["backend"].is_null(), "{}", lines[0]);
}
