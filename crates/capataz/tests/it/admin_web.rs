//! The admin API against web pages and hostile values: a loopback admin listener without a
//! token must not be writable from a cross-site form nor readable through DNS rebinding, and no
//! admin value can crash the process.
//!
//! Loopback only, ephemeral ports, raw HTTP/1.1 so every header is the test's choice.

use std::net::SocketAddr;
use std::time::Duration;

use capataz::server::Balancer;

use crate::support::balancer::{self, ConfigText};
use crate::support::blocking;
use crate::support::raw::send_head;

/// A balancer with an admin listener (`admin_lines` added to its table) and one pool over a
/// `200 ok` backend, without probes.
async fn start(admin_lines: &str) -> Balancer {
    let text = ConfigText::new(&[("b1".to_owned(), blocking::backend())])
        .admin(admin_lines)
        .extra("active.kind = \"none\"")
        .build();
    let (balancer, _events) = balancer::start(&text).await;
    balancer
}

async fn override_of_b1(admin: SocketAddr) -> String {
    let (status, answer) = send_head(
        admin,
        &format!("GET /status/web/b1 HTTP/1.1\r\nhost: {admin}"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let body = &answer[answer.find("\r\n\r\n").expect("a body") + 4..];
    let json: serde_json::Value = serde_json::from_str(body).expect("JSON status");
    json["override"].to_string()
}

#[tokio::test]
async fn a_cross_site_form_post_set_an_override_without_a_token() {
    let balancer = start("").await;
    let admin = balancer.admin_addr().expect("admin runs");
    let before = override_of_b1(admin).await;
    let (status, answer) = send_head(
        admin,
        &format!(
            "POST /backends/web/b1/down HTTP/1.1\r\nhost: {admin}\r\n\
             origin: http://evil.example\r\ncontent-type: application/x-www-form-urlencoded"
        ),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    // The same form from a page that hides its Origin: the content type gives it away.
    let (status, answer) = send_head(
        admin,
        &format!(
            "POST /backends/web/b1/down HTTP/1.1\r\nhost: {admin}\r\n\
             content-type: text/plain"
        ),
    )
    .await;
    assert_eq!(status, 415, "{answer}");
    assert_eq!(override_of_b1(admin).await, before, "no override was set");
    // A same-origin write (the listener's own page) and capataz's own client still work.
    let (status, answer) = send_head(
        admin,
        &format!(
            "POST /backends/web/b1/drain HTTP/1.1\r\nhost: localhost:{}\r\n\
             origin: http://localhost:{}",
            admin.port(),
            admin.port()
        ),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    capataz::ctl::request(admin, http::Method::POST, "/backends/web/b1/clear", None)
        .await
        .expect("capataz ctl still works");
    capataz::ctl::request(admin, http::Method::GET, "/status", None)
        .await
        .expect("capataz status still works");
    balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_dns_rebinding_host_read_the_status_without_a_token() {
    let balancer = start("").await;
    let admin = balancer.admin_addr().expect("admin runs");
    for path in ["/status", "/", "/metrics", "/events"] {
        let (status, answer) = send_head(
            admin,
            &format!(
                "GET {path} HTTP/1.1\r\nhost: rebind.evil.example:{}",
                admin.port()
            ),
        )
        .await;
        assert_eq!(status, 421, "{path}: {answer}");
        assert!(!answer.contains("\"pools\""), "{answer}");
    }
    for host in [
        admin.to_string(),
        format!("localhost:{}", admin.port()),
        format!("127.0.0.1:{}", admin.port()),
    ] {
        let (status, answer) =
            send_head(admin, &format!("GET /status HTTP/1.1\r\nhost: {host}")).await;
        assert_eq!(status, 200, "{host}: {answer}");
    }
    balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn allowed_hosts_and_the_token_let_other_names_in() {
    let balancer = start(
        r#"token = "s3cret"
open_read_only = true
allowed_hosts = ["lb1.internal"]"#,
    )
    .await;
    let admin = balancer.admin_addr().expect("admin runs");
    let get = |host: &str| format!("GET /status HTTP/1.1\r\nhost: {host}");
    assert_eq!(send_head(admin, &get("lb1.internal:9999")).await.0, 200);
    assert_eq!(send_head(admin, &get("LB1.internal")).await.0, 200);
    assert_eq!(send_head(admin, &get("rebind.evil.example")).await.0, 421);
    // With the token no page can have sent the request: any Host is fine.
    let with_token = format!("{}\r\nauthorization: Bearer s3cret", get("lb1.example.com"));
    assert_eq!(send_head(admin, &with_token).await.0, 200);
    // Without it a write is still 401 first.
    let post = format!("POST /backends/web/b1/down HTTP/1.1\r\nhost: {admin}");
    assert_eq!(send_head(admin, &post).await.0, 401);
    balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn an_override_ttl_of_u64_max_seconds_crashed_the_admin_api() {
    let balancer = start("").await;
    let admin = balancer.admin_addr().expect("admin runs");
    for ttl in [
        "18446744073709551615s",
        "9223372036854775807s",
        "8761h",
        "99999999999h",
    ] {
        let (status, answer) = send_head(
            admin,
            &format!("POST /backends/web/b1/down?ttl={ttl} HTTP/1.1\r\nhost: {admin}"),
        )
        .await;
        assert_eq!(status, 400, "{ttl}: {answer}");
        assert!(
            answer.contains("maximum") || answer.contains("not a duration"),
            "{answer}"
        );
    }
    let (status, answer) = send_head(
        admin,
        &format!("POST /backends/web/b1/down?ttl=8760h HTTP/1.1\r\nhost: {admin}"),
    )
    .await;
    assert_eq!(status, 200, "the maximum itself is fine: {answer}");
    // And the process still answers.
    let (status, _) = send_head(admin, &format!("GET /status HTTP/1.1\r\nhost: {admin}")).await;
    assert_eq!(status, 200);
    balancer.shutdown(Duration::from_secs(1)).await;
}
