//! What capataz says about TCP sessions (the access log, the metrics, `/status`) against what
//! the sessions really moved.

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{config, greeting, refused_port, to_end, Greeter};
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::balancer::{metrics_text, start};

/// The value of the series `name{labels}` on a metrics page.
fn series(page: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    page.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in\n{page}"))
        .trim()
        .parse()
        .expect("a number")
}

#[tokio::test]
async fn the_access_log_metrics_and_status_say_what_each_session_moved() {
    let a = Greeter::start("a").await;
    let dead_port = refused_port();
    let dead = dead_port.addr;
    let dir = LogDir::new();
    let log = dir.path("tcp.log");
    let listener = format!("idle_timeout = \"300ms\"\n{}", table(&log, "json", ""));
    let pool = "active.kind = \"none\"\npassive.consecutive_errors = 10";
    let (balancer, _) = start(&config(&[("dead", dead), ("a", a.addr)], &listener, pool)).await;
    let addr = balancer.local_addrs()[0];
    // 1: to `dead` first (round robin), refused, retried on `a`: a big upload, echoed.
    let mut one = TcpStream::connect(addr).await.unwrap();
    assert_eq!(greeting(&mut one).await, "a");
    let upload = vec![b'x'; 100_000];
    let (mut read, mut write) = one.split();
    let send = async {
        write.write_all(&upload).await.unwrap();
        write.shutdown().await.unwrap();
    };
    let mut echoed = Vec::new();
    let receive = tokio::io::AsyncReadExt::read_to_end(&mut read, &mut echoed);
    let (_, received) = tokio::join!(send, receive);
    received.unwrap();
    assert_eq!(echoed.len(), 100_000 + "bye a\n".len());
    drop(one);
    // 2: straight to `a`; a small exchange.
    let mut two = TcpStream::connect(addr).await.unwrap();
    assert_eq!(greeting(&mut two).await, "a");
    two.write_all(b"ping\n").await.unwrap();
    two.shutdown().await.unwrap();
    assert_eq!(to_end(&mut two).await.unwrap(), b"ping\nbye a\n");
    // 3: `dead`, then `a`; the client sends nothing and the idle timeout closes it.
    let mut three = TcpStream::connect(addr).await.unwrap();
    assert_eq!(greeting(&mut three).await, "a");
    assert_eq!(to_end(&mut three).await.unwrap_or_default(), b"");
    let lines = wait_json(&log, 3).await;
    let fields = |line: &Value| {
        (
            line["backend"].as_str().unwrap().to_owned(),
            line["attempts"].as_u64().unwrap(),
            line["bytes_in"].as_u64().unwrap(),
            line["bytes"].as_u64().unwrap(),
            line["ended_by"].as_str().unwrap().to_owned(),
            line["phase"].as_str().unwrap().to_owned(),
        )
    };
    let got: Vec<_> = lines.iter().map(fields).collect();
    let want =
        |b: &str, n, i, o, e: &str, p: &str| (b.to_owned(), n, i, o, e.to_owned(), p.to_owned());
    assert_eq!(
        got,
        [
            want("a", 2, 100_000, 2 + 100_000 + 6, "client", "-"),
            want("a", 1, 5, 2 + 5 + 6, "client", "-"),
            want("a", 2, 0, 2, "timeout", "idle"),
        ]
    );
    for line in &lines {
        assert_eq!(line["protocol"], "TCP");
        assert_eq!(line["status"], Value::Null);
        assert_eq!(line["pool"], "db");
        assert_eq!(line["method"], "-");
    }
    let idle = lines[2]["duration"].as_f64().unwrap();
    assert!(
        idle >= 0.3,
        "closed at the idle timeout, not before: {idle}"
    );
    let page = metrics_text(&balancer);
    let a_labels = "pool=\"db\",backend=\"a\"";
    assert_eq!(series(&page, "capataz_tcp_sessions_total", a_labels), 3.0);
    let to_backend = format!("{a_labels},direction=\"to_backend\"");
    let to_client = format!("{a_labels},direction=\"to_client\"");
    assert_eq!(
        series(&page, "capataz_tcp_bytes_total", &to_backend),
        100_005.0
    );
    assert_eq!(
        series(&page, "capataz_tcp_bytes_total", &to_client),
        100_023.0
    );
    let dead_errors = "pool=\"db\",backend=\"dead\",class=\"error\"";
    assert_eq!(series(&page, "capataz_requests_total", dead_errors), 2.0);
    let status = capataz::status::page(&balancer.pools(), "now", None, &[]).expect("a status page");
    let status: Value = serde_json::from_slice(&status).expect("JSON");
    assert_eq!(status["pools"][0]["protocol"], "tcp");
}
