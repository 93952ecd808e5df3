//! Section 8: routes match host, then path prefix; the first match wins, else 404.

use super::*;

#[tokio::test]
async fn routes_match_host_then_path_prefix_first_match_wins_else_404() {
    let api = SimBackend::start("api1", any()).await.unwrap();
    let stat = SimBackend::start("static1", any()).await.unwrap();
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"

  [[listeners.routes]]
  host = "api.test"
  pool = "api"

  [[listeners.routes]]
  path_prefix = "/static"
  pool = "static"

[pools.api]
backends = [{{ name = "api1", address = "{}" }}]
[pools.api.active]
kind = "none"

[pools.static]
backends = [{{ name = "static1", address = "{}" }}]
[pools.static.active]
kind = "none"
"#,
        api.addr(),
        stat.addr()
    );
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let cases: [(&str, &str, u16, Option<&str>); 7] = [
        ("api.test", "/v1/users", 200, Some("api1")),
        // Both routes match; the first one listed wins.
        ("api.test", "/static/app.js", 200, Some("api1")),
        // Host is compared without case and port.
        ("API.Test:8080", "/x", 200, Some("api1")),
        ("www.test", "/static/app.js", 200, Some("static1")),
        ("www.test", "/static", 200, Some("static1")),
        ("www.test", "/other", 404, None),
        ("www.test", "/", 404, None),
    ];
    for (host, path, status, backend) in cases {
        let answer = client.send("GET", path, host, Bytes::new()).await;
        assert_eq!(answer.status, status, "{host} {path}");
        assert_eq!(answer.backend.as_deref(), backend, "{host} {path}");
    }
    assert_eq!(api.traffic_hits(), 3);
    assert_eq!(stat.traffic_hits(), 2);
}
