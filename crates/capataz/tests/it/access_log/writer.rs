//! The writer: a stalled one costs lines (counted), never a request; a reload reopens.

use std::io::Read;
use std::time::Duration;

use crate::support::access_log::{lines, table, wait_lines, LogDir};
use crate::support::balancer::{backends, parse, ConfigText};
use crate::support::client::{exchange, Client};
use crate::support::wait::{until_ok, POLL};

/// The value of `capataz_access_log_dropped_total` for the balancer's first listener.
async fn dropped(admin: std::net::SocketAddr) -> u64 {
    let metrics = exchange(admin, "GET", "/metrics", &admin.to_string(), &[]).await;
    metrics
        .text()
        .lines()
        .find(|l| l.starts_with("capataz_access_log_dropped_total{listener=\"listener-0\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .map(|n| n.parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_stalled_writer_drops_and_counts_lines_and_slows_no_request() {
    let sims = backends(&["a"]).await;
    let dir = LogDir::new();
    let fifo = dir.path("fifo");
    // A FIFO nobody reads: the writer's open blocks (on the blocking pool) until a reader
    // comes, so the buffer of one line fills at once.
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let config = ConfigText::sims(&sims)
        .admin("")
        .listener(&table(&fifo, "text", "buffer = 1"));
    let (balancer, _) = crate::support::balancer::start(&config.build()).await;
    let addr = balancer.local_addrs()[0];
    let admin = balancer.admin_addr().unwrap();
    let mut client = Client::new(addr);
    let requests = 40;
    let started = tokio::time::Instant::now();
    for _ in 0..requests {
        assert_eq!(client.get("/").await.status, 200);
    }
    // Forty requests on loopback: far below a second each, whatever the log does.
    assert!(started.elapsed() < Duration::from_secs(10));
    // At most one line in the writer's hands and one in the buffer: the rest are dropped
    // (each counted when its body ends, just after its client read it).
    let count = until_ok("the lines dropped", POLL, async || {
        match dropped(admin).await {
            count if count >= requests - 2 => Ok(count),
            count => Err(format!("dropped {count}")),
        }
    })
    .await;
    assert!(count <= requests, "dropped {count}");
    // A reader comes: the lines that were kept come out.
    let reader = tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(&fifo).expect("open the FIFO");
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while !got.contains(&b'\n') {
            match file.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    });
    let text = tokio::time::timeout(crate::support::DEADLINE, reader)
        .await
        .expect("the kept lines within the deadline")
        .unwrap();
    assert!(text.contains("\"GET / HTTP/1.1\" 200"), "{text}");
}

#[tokio::test]
async fn a_reload_reopens_the_file_after_a_rotation_and_loses_no_line() {
    let sims = backends(&["a"]).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let rotated = dir.path("access.log.1");
    let config = ConfigText::sims(&sims).listener(&table(&path, "json", ""));
    let text = config.build();
    let (balancer, addr) = logging_text(&text).await;
    assert_eq!(exchange(addr, "GET", "/before", "a", &[]).await.status, 200);
    wait_lines(&path, 1).await;
    std::fs::rename(&path, &rotated).unwrap();
    balancer.reload(&parse(&text)).await.expect("reload");
    // The reload reopens at once: the new file exists before any new line.
    crate::support::wait::wait_until("the new file", || path.exists()).await;
    assert_eq!(exchange(addr, "GET", "/after", "a", &[]).await.status, 200);
    let new = wait_lines(&path, 1).await;
    assert_eq!(new.len(), 1);
    assert!(new[0].contains("\"/after\""), "{}", new[0]);
    let old = lines(&rotated);
    assert_eq!(old.len(), 1);
    assert!(old[0].contains("\"/before\""), "{}", old[0]);
}

#[tokio::test]
async fn requests_in_flight_across_a_reload_keep_their_lines() {
    let sims = backends(&["a"]).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let config = ConfigText::sims(&sims).listener(&table(&path, "json", ""));
    let text = config.build();
    let (balancer, addr) = logging_text(&text).await;
    let mut client = Client::new(addr);
    for round in 0..3 {
        for _ in 0..5 {
            assert_eq!(client.get("/").await.status, 200);
        }
        balancer.reload(&parse(&text)).await.expect("reload");
        wait_lines(&path, 5 * (round + 1)).await;
    }
    assert_eq!(lines(&path).len(), 15);
}

async fn logging_text(text: &str) -> (capataz::server::Balancer, std::net::SocketAddr) {
    let (balancer, _) = crate::support::balancer::start(text).await;
    let addr = balancer.local_addrs()[0];
    (balancer, addr)
}

/// Shutdown waits for the access log to write the lines of the requests it served, even when
/// the log is behind: here a FIFO whose reader starts reading only as shutdown begins, so most
/// lines are still waiting in the writer's buffer. The runtime is dropped as soon as shutdown
/// returns (as `capataz run` exits): a line still waiting then would be lost.
#[test]
fn shutdown_writes_every_waiting_line_before_it_returns() {
    let dir = LogDir::new();
    let fifo = dir.path("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    // The reader opens the FIFO at once (so the writer's open succeeds) but reads only when
    // told; a pipe holds 64 KiB, a few hundred lines, so the writer soon waits.
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let reader_fifo = fifo.clone();
    let reader = std::thread::spawn(move || {
        let mut file = std::fs::File::open(&reader_fifo).expect("open the FIFO");
        wait_go.recv().expect("told to read");
        let mut text = String::new();
        file.read_to_string(&mut text)
            .expect("read the FIFO to its end");
        text
    });
    let requests = 1500;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let sims = backends(&["a"]).await;
        let config = ConfigText::sims(&sims).listener(&table(&fifo, "text", ""));
        let (balancer, _) = crate::support::balancer::start(&config.build()).await;
        let mut client = Client::new(balancer.local_addrs()[0]);
        for _ in 0..requests {
            assert_eq!(client.get("/").await.status, 200);
        }
        drop(client);
        go.send(()).unwrap();
        balancer.shutdown(Duration::from_secs(30)).await;
    });
    drop(runtime);
    let text = reader.join().expect("the reader");
    let lines = text
        .lines()
        .filter(|l| l.contains("\"GET / HTTP/1.1\" 200"))
        .count();
    assert_eq!(
        lines, requests,
        "lines written by the time shutdown returned"
    );
}
