//! Third-party HTTP/2 clients through capataz: `curl --http2-prior-knowledge` (curl built
//! with nghttp2) and `h2load` (many streams per connection; Debian's `nghttp2-client`,
//! installed by `.ci/deps/nghttp2.sh`). A missing tool fails its test, saying how to install
//! it (`support::tools::require_tool`).

use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::Command;

use super::{balancer, echo_backend};
use crate::support::balancer::{backends, pairs};
use crate::support::tools::require_tool;
use crate::support::DEADLINE;

/// This machine's curl, which must speak HTTP/2 (Debian's does: `.ci/deps/curl.sh`).
async fn curl_with_http2() -> PathBuf {
    let curl = require_tool("curl", "curl");
    let out = Command::new(&curl)
        .arg("--version")
        .output()
        .await
        .expect("curl --version runs");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.contains("HTTP2"),
        "{} does not speak HTTP/2 (no HTTP2 among its features): install a curl built with \
         nghttp2, as Debian's (.ci/deps/curl.sh)\n{version}",
        curl.display()
    );
    curl
}

#[tokio::test]
async fn curl_with_prior_knowledge_gets_and_posts_through_capataz() {
    let curl = curl_with_http2().await;
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let url = format!("http://{addr}/curl/path?q=1");
    let curl = &curl;
    let run = |args: Vec<String>| async move {
        let out = tokio::time::timeout(
            DEADLINE,
            Command::new(curl).args(&args).stdin(Stdio::null()).output(),
        )
        .await
        .expect("curl finishes")
        .expect("curl runs");
        assert!(out.status.success(), "curl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let get = run(vec![
        "-sS".into(),
        "--http2-prior-knowledge".into(),
        "-H".into(),
        "Host: app.test".into(),
        "-w".into(),
        "\n%{http_version} %{http_code}".into(),
        url.clone(),
    ])
    .await;
    assert!(get.starts_with("GET /curl/path?q=1 HTTP/1.1\r\n"), "{get}");
    assert!(
        get.to_ascii_lowercase().contains("\r\nhost: app.test"),
        "{get}"
    );
    assert!(get.ends_with("body=0\n2 200"), "{get}");
    let post = run(vec![
        "-sS".into(),
        "--http2-prior-knowledge".into(),
        "--data-binary".into(),
        "0123456789".into(),
        "-w".into(),
        "\n%{http_version} %{http_code}".into(),
        url,
    ])
    .await;
    assert!(
        post.starts_with("POST /curl/path?q=1 HTTP/1.1\r\n"),
        "{post}"
    );
    assert!(post.ends_with("body=10\n2 200"), "{post}");
    assert_eq!(backend.hits(), 2);
}

#[tokio::test]
async fn h2load_with_many_streams_per_connection_gets_every_answer() {
    let h2load = require_tool("h2load", "nghttp2");
    let sims = backends(&["a", "b", "c"]).await;
    let (_balancer, addr, _events) = balancer(&pairs(&sims), "", "").await;
    // 4 connections, 25 streams at once on each, 2,000 requests.
    let out = tokio::time::timeout(
        DEADLINE,
        Command::new(&h2load)
            .args(["-n", "2000", "-c", "4", "-m", "25"])
            .arg(format!("http://{addr}/load"))
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("h2load finishes")
    .expect("h2load runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        report.contains("2000 done, 2000 succeeded, 0 failed, 0 errored, 0 timeout"),
        "{report}"
    );
    assert!(report.contains("status codes: 2000 2xx"), "{report}");
    let hits: Vec<u64> = sims.iter().map(|b| b.traffic_hits()).collect();
    assert_eq!(hits.iter().sum::<u64>(), 2000, "{hits:?}");
}
