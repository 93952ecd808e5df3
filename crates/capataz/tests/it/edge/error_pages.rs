//! `[listeners.error_pages]`: capataz's own 404, 502, 503 and 504 get the configured page,
//! with the headers capataz sends kept; a backend's own answers are relayed untouched.

use capataz::health::Notice;
use capataz::sim::Mode;

use super::*;

/// A page file for `status` in `dir`, its text naming the status.
fn page_file(dir: &std::path::Path, status: u16) -> std::path::PathBuf {
    let path = dir.join(format!("{status}.html"));
    std::fs::write(&path, format!("<h1>custom {status}</h1>\n")).expect("write page");
    path
}

#[tokio::test]
async fn error_pages_replace_capatazs_own_answers_and_never_a_backends() {
    let dir = TempDir::new("error-pages");
    let b = backends(&["a"]).await;
    let listener = format!(
        r#"
  [[listeners.routes]]
  path_prefix = "/app"
  pool = "web"

  [listeners.error_pages]
  404 = {{ body = "no such page", content_type = "text/plain" }}
  502 = {{ file = "{}" }}
  503 = {{ file = "{}" }}
  504 = {{ file = "{}" }}
"#,
        page_file(dir.path(), 502).display(),
        page_file(dir.path(), 503).display(),
        page_file(dir.path(), 504).display(),
    );
    let pool = format!(
        "when_all_down = \"reject\"\nretry_after = \"7s\"\n[pools.web.timeouts]\n\
         response_header = \"300ms\"\n[pools.web.retries]\nattempts = 1\n{FAST_CHECKS}"
    );
    let text = ConfigText::sims(&b)
        .listener(&listener)
        .extra(&pool)
        .build();
    let (balancer, mut rx) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);

    // A backend's own 503 and 404 are relayed as they are.
    b[0].set_traffic(Mode::Status(503));
    let answer = client.get("/app").await;
    assert_eq!((answer.status, answer.backend.as_deref()), (503, Some("a")));
    assert!(!answer.text().contains("custom"), "{}", answer.text());
    b[0].set_traffic(Mode::Status(404));
    let answer = client.get("/app").await;
    assert_eq!((answer.status, answer.backend.as_deref()), (404, Some("a")));
    assert_ne!(answer.text(), "no such page");

    // No route: capataz's 404, with the inline page.
    let answer = client.get("/elsewhere").await;
    assert_eq!((answer.status, answer.backend.as_deref()), (404, None));
    assert_eq!(answer.text(), "no such page");
    assert_eq!(answer.content_type(), "text/plain");

    // A malformed answer: capataz's 502.
    b[0].set_traffic(Mode::Garbage);
    let answer = client.get("/app").await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.text(), "<h1>custom 502</h1>\n");
    assert_eq!(answer.content_type(), "text/html; charset=utf-8");

    // No answer within response_header: capataz's 504.
    b[0].set_traffic(Mode::Hang);
    let answer = client.get("/app").await;
    assert_eq!(answer.status, 504);
    assert_eq!(answer.text(), "<h1>custom 504</h1>\n");

    // Every backend DOWN under reject: capataz's 503, its Retry-After kept.
    b[0].set_traffic(Mode::Status(200));
    b[0].set_health(Mode::Status(503));
    wait_for(&mut rx, "all down", |e| matches!(e, Notice::AllDown { .. })).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let answer = client.get("/app").await;
    assert_eq!((answer.status, answer.backend.as_deref()), (503, None));
    assert_eq!(answer.text(), "<h1>custom 503</h1>\n");
    assert_eq!(answer.headers.get("retry-after").unwrap(), "7");
    assert_eq!(
        answer.headers.get("content-length").unwrap(),
        &"<h1>custom 503</h1>\n".len().to_string()
    );
}
