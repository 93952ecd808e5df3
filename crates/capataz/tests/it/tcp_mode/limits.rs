//! Connection limits and the queue on a tcp pool (HAProxy's `maxconn` and `timeout queue` in
//! `mode tcp`): each backend holds at most `max_connections` sessions, the rest wait in the
//! pool's FIFO queue, a full queue or its timeout closes the client, and every slot comes
//! back when its session ends, however it ends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{config, greeting, to_end};
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::any;
use crate::support::balancer::{metrics_text, start};
use crate::support::wait::wait_until;
use capataz::server::Balancer;

/// A backend that counts its open sessions and the most it ever had at once: it greets each
/// with its name, echoes, and closes once the client has sent its FIN.
struct Counting {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Counting {
    async fn start(name: &'static str) -> Counting {
        let listener = TcpListener::bind(any()).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (open, most, accepted) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let counts = (open.clone(), most.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (open, most, accepted) = (counts.0.clone(), counts.1.clone(), counts.2.clone());
                accepted.fetch_add(1, Ordering::SeqCst);
                let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _ = stream.write_all(format!("{name}\n").as_bytes()).await;
                    let mut buf = [0; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        if stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    // Counted out before its side closes: a client that read the end knows
                    // the backend no longer holds the session.
                    open.fetch_sub(1, Ordering::SeqCst);
                    let _ = stream.shutdown().await;
                });
            }
        });
        Counting {
            addr,
            open,
            most,
            accepted,
            task,
        }
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pool's part of `/status`.
fn pool_status(balancer: &Balancer) -> Value {
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).expect("a status page");
    let status: Value = serde_json::from_slice(&page).expect("JSON");
    status["pools"][0].clone()
}

/// Sessions waiting in the pool's queue, as `/status` says.
fn queued(balancer: &Balancer) -> u64 {
    pool_status(balancer)["queue"]["length"]
        .as_u64()
        .expect("a queue")
}

/// Each backend's `in_flight`, as `/status` says.
fn in_flight(balancer: &Balancer) -> Vec<u64> {
    pool_status(balancer)["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["in_flight"].as_u64().expect("in_flight"))
        .collect()
}

/// Ends a session cleanly: the client's FIN, then everything until the backend's.
async fn finish(mut session: TcpStream) {
    session.shutdown().await.expect("shutdown");
    to_end(&mut session).await.expect("a clean end");
}

#[tokio::test]
async fn a_tcp_backend_never_holds_more_than_its_limit_and_a_queued_session_is_served_when_one_ends(
) {
    let a = Counting::start("a").await;
    let dir = LogDir::new();
    let log = dir.path("tcp.log");
    let pool =
        "max_connections = 2\nqueue_size = 8\nqueue_timeout = \"60s\"\nactive.kind = \"none\"";
    let text = config(&[("a", a.addr)], &table(&log, "json", ""), pool);
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut served = Vec::new();
    for _ in 0..2 {
        let mut session = TcpStream::connect(addr).await.unwrap();
        assert_eq!(greeting(&mut session).await, "a");
        served.push(session);
    }
    // Two more find the backend at its limit and wait, in order.
    let mut waiting = Vec::new();
    for n in 1..=2 {
        waiting.push(TcpStream::connect(addr).await.unwrap());
        wait_until("the session in the queue", || queued(&balancer) == n).await;
    }
    assert_eq!(
        (a.accepted(), a.open()),
        (2, 2),
        "the queued reached no backend"
    );
    assert_eq!(in_flight(&balancer), [2]);
    // One session ends: the oldest waiting one gets its slot.
    finish(served.remove(0)).await;
    let mut third = waiting.remove(0);
    assert_eq!(greeting(&mut third).await, "a");
    assert_eq!(queued(&balancer), 1, "the fourth still waits");
    finish(served.remove(0)).await;
    let mut fourth = waiting.remove(0);
    assert_eq!(greeting(&mut fourth).await, "a");
    finish(third).await;
    finish(fourth).await;
    wait_until("every slot given back", || in_flight(&balancer) == [0]).await;
    assert_eq!(a.most(), 2, "never more than its limit at once");
    assert_eq!(a.accepted(), 4);
    let lines = wait_json(&log, 4).await;
    let queued_lines = lines.iter().filter(|l| l["queued"].is_number()).count();
    assert_eq!(queued_lines, 2, "the two that waited say so: {lines:?}");
    for line in &lines {
        assert_eq!(line["backend"], "a");
        assert_eq!(line["ended_by"], "client");
    }
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_full_tcp_queue_closes_the_client_at_once_and_a_wait_ends_at_queue_timeout() {
    let a = Counting::start("a").await;
    let dir = LogDir::new();
    let log = dir.path("tcp.log");
    let pool = "max_connections = 1\nqueue_size = 1\nqueue_timeout = \"400ms\"\n\
                active.kind = \"none\"";
    let text = config(&[("a", a.addr)], &table(&log, "json", ""), pool);
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut held = TcpStream::connect(addr).await.unwrap();
    assert_eq!(greeting(&mut held).await, "a");
    let mut waiting = TcpStream::connect(addr).await.unwrap();
    wait_until("the session in the queue", || queued(&balancer) == 1).await;
    // The queue is full: closed at once, having reached no backend.
    let mut refused = TcpStream::connect(addr).await.unwrap();
    assert_eq!(to_end(&mut refused).await.unwrap_or_default(), b"");
    let first = wait_json(&log, 1).await;
    assert_eq!(
        (&first[0]["ended_by"], &first[0]["phase"]),
        (&Value::from("capataz"), &Value::from("queue"))
    );
    assert_eq!(first[0]["backend"], Value::Null);
    assert_eq!(first[0]["queued"], Value::Null, "it never waited");
    // The waiting one is closed at the queue's timeout.
    assert_eq!(to_end(&mut waiting).await.unwrap_or_default(), b"");
    let lines = wait_json(&log, 2).await;
    let timed_out = &lines[1];
    assert_eq!(
        (&timed_out["ended_by"], &timed_out["phase"]),
        (&Value::from("capataz"), &Value::from("queue"))
    );
    let waited = timed_out["queued"].as_f64().expect("queued=");
    assert!(waited >= 0.4, "waited the queue timeout: {waited}");
    assert_eq!(a.accepted(), 1, "only the held session reached the backend");
    let page = metrics_text(&balancer);
    for reason in ["full", "timeout"] {
        let series = format!("capataz_queue_rejected_total{{pool=\"db\",reason=\"{reason}\"}} 1");
        assert!(page.lines().any(|l| l == series), "{series} in\n{page}");
    }
    let errors = "capataz_requests_total{pool=\"db\",backend=\"a\",class=\"error\"}";
    assert!(!page
        .lines()
        .any(|l| l.starts_with(errors) && !l.ends_with(" 0")));
    finish(held).await;
    wait_until("the slot given back", || in_flight(&balancer) == [0]).await;
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

#[tokio::test]
async fn tcp_slots_come_back_when_clients_reset_served_or_queued() {
    let a = Counting::start("a").await;
    let pool =
        "max_connections = 2\nqueue_size = 8\nqueue_timeout = \"60s\"\nactive.kind = \"none\"";
    let (balancer, _) = start(&config(&[("a", a.addr)], "", pool)).await;
    let addr = balancer.local_addrs()[0];
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let mut session = TcpStream::connect(addr).await.unwrap();
        assert_eq!(greeting(&mut session).await, "a");
        sessions.push(session);
    }
    for n in 1..=3 {
        sessions.push(TcpStream::connect(addr).await.unwrap());
        wait_until("the session in the queue", || queued(&balancer) == n).await;
    }
    // Every client resets (RST on close).
    for session in sessions {
        session.set_zero_linger().unwrap();
        drop(session);
    }
    wait_until("every slot and place given back", || {
        in_flight(&balancer) == [0] && queued(&balancer) == 0 && a.open() == 0
    })
    .await;
    assert!(a.most() <= 2, "never more than its limit: {}", a.most());
    // The slots are usable again: two new sessions are served at once.
    let (mut one, mut two) = (
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    );
    assert_eq!(greeting(&mut one).await, "a");
    assert_eq!(greeting(&mut two).await, "a");
    assert_eq!(in_flight(&balancer), [2]);
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

/// A hashing tcp pool sends a client to its address's backend while that one has a free slot,
/// else to a backend below its limit; with both at their limits the session waits. Each
/// session's access log line says whether it got the address's owner on the ring (`kept`) or
/// was moved off it at its limit (`moved:at_limit`), and names the backend it got.
#[tokio::test]
async fn a_hashing_tcp_pool_moves_a_client_off_its_backend_at_its_limit() {
    let (a, b) = (Counting::start("a").await, Counting::start("b").await);
    let pool = "algorithm = \"hash\"\nmax_connections = 1\nqueue_timeout = \"60s\"\n\
                active.kind = \"none\"";
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let listener = table(&log, "json", "");
    let (balancer, _) = start(&config(&[("a", a.addr), ("b", b.addr)], &listener, pool)).await;
    let addr = balancer.local_addrs()[0];
    let mut home = TcpStream::connect(addr).await.unwrap();
    let home_name = greeting(&mut home).await;
    // Its backend again, once free.
    finish(home).await;
    wait_until("the slot given back", || in_flight(&balancer) == [0, 0]).await;
    let mut again = TcpStream::connect(addr).await.unwrap();
    assert_eq!(greeting(&mut again).await, home_name, "the same backend");
    // Its backend at its limit: the other one.
    let mut moved = TcpStream::connect(addr).await.unwrap();
    let moved_name = greeting(&mut moved).await;
    assert_ne!(moved_name, home_name);
    // Both at their limits: it waits, and gets the first slot freed.
    let mut third = TcpStream::connect(addr).await.unwrap();
    wait_until("the session in the queue", || queued(&balancer) == 1).await;
    finish(moved).await;
    assert_eq!(greeting(&mut third).await, moved_name);
    finish(third).await;
    finish(again).await;
    wait_until("every slot given back", || in_flight(&balancer) == [0, 0]).await;
    assert_eq!((a.most(), b.most()), (1, 1));
    // Home and again on the owner; moved and third off it (in any order: a line is written
    // as its session ends).
    let lines = wait_json(&log, 4).await;
    let mut said: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (any_str(&l["backend"]), any_str(&l["affinity"])))
        .collect();
    said.sort_unstable();
    let mut want = vec![
        (&*home_name, "kept"),
        (&*home_name, "kept"),
        (&*moved_name, "moved:at_limit"),
        (&*moved_name, "moved:at_limit"),
    ];
    want.sort_unstable();
    assert_eq!(said, want, "{lines:#?}");
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

fn any_str(value: &Value) -> &str {
    value.as_str().unwrap_or("(none)")
}
