//! End-to-end tests of the alert hooks on loopback: real webhook receivers and real commands,
//! events published by hand on a broadcast channel, and waits on counts or received requests
//! with generous deadlines (never fixed sleeps).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use capataz::alerts::{AlertStats, Alerts};
use capataz::config::{AlertsConfig, CommandConfig, WebhookConfig};
use capataz::events::Notice;
use capataz_health::{Outcome, Reason, State, Transition};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use crate::support::cases;
use crate::support::raw::{header, read_exact_buf, read_head};
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// A transition of backend `backend` of pool `web` to `to`, after three failed or passed probes.
fn transition(backend: &str, to: State) -> Notice {
    let (from, reason) = match to {
        State::Down => (
            State::Up,
            Reason::ProbesFailed {
                streak: 3,
                last: Outcome::Timeout,
                mismatch: None,
            },
        ),
        State::Up => (
            State::Down,
            Reason::ProbesPassed {
                streak: 2,
                last: Outcome::Status(200),
            },
        ),
    };
    Notice::Transition {
        pool: "web".into(),
        backend: backend.into(),
        transition: Transition {
            backend: 0,
            from,
            to,
            reason,
            at: Duration::from_secs(5),
            healthy_after: 1,
        },
        time: SystemTime::now(),
    }
}

/// A webhook to `addr` with a 5 s timeout, no retries, 10 ms backoff, and a queue of 64.
fn webhook(addr: SocketAddr) -> WebhookConfig {
    WebhookConfig {
        url: format!("http://{addr}/hook?team=ops"),
        socket_addr: addr,
        host: addr.to_string(),
        path: "/hook?team=ops".into(),
        timeout: Duration::from_secs(5),
        retries: 0,
        backoff: Duration::from_millis(10),
        queue: 64,
    }
}

fn start(config: AlertsConfig) -> (Alerts, broadcast::Sender<Notice>) {
    let (events, rx) = broadcast::channel(1024);
    (Alerts::start(&config, rx), events)
}

/// One request as a receiver saw it.
#[derive(Debug)]
struct Seen {
    request_line: String,
    /// Lowercase names.
    headers: HashMap<String, String>,
    body: serde_json::Value,
}

/// A minimal HTTP/1.1 webhook receiver: one request per connection. It answers each request
/// with the next status of its list, and the last one from then on.
struct Receiver {
    addr: SocketAddr,
    seen: mpsc::UnboundedReceiver<Seen>,
    task: JoinHandle<()>,
}

impl Receiver {
    async fn start(statuses: &[u16]) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let statuses = statuses.to_vec();
        let (tx, seen) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            for n in 0.. {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                let Some(request) = read_request(&mut stream).await else {
                    continue;
                };
                let _ = tx.send(request);
                let status = statuses[n.min(statuses.len() - 1)];
                let answer = format!(
                    "HTTP/1.1 {status} Whatever\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            }
        });
        Receiver { addr, seen, task }
    }

    async fn next(&mut self) -> Seen {
        tokio::time::timeout(DEADLINE, self.seen.recv())
            .await
            .expect("a request before the deadline")
            .expect("the receiver is running")
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let head = read_head(stream, &mut buf).await?;
    let length: usize = header(&head, "content-length")?.parse().ok()?;
    let body = read_exact_buf(stream, &mut buf, length).await?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next()?.to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Some(Seen {
        request_line,
        headers,
        body: serde_json::from_slice(&body).ok()?,
    })
}

#[tokio::test]
async fn a_webhook_receives_the_event_as_json() {
    let mut receiver = Receiver::start(&[200]).await;
    let (alerts, events) = start(AlertsConfig {
        webhooks: vec![webhook(receiver.addr)],
        ..AlertsConfig::default()
    });
    let event = transition("b1", State::Down);
    let reason = event.change().unwrap().2;
    events.send(event).unwrap();

    let seen = receiver.next().await;
    assert_eq!(seen.request_line, "POST /hook?team=ops HTTP/1.1");
    assert_eq!(seen.headers["content-type"], "application/json");
    assert_eq!(seen.headers["host"], receiver.addr.to_string());
    assert_eq!(seen.headers["connection"], "close");
    assert!(
        seen.headers["user-agent"].starts_with("capataz/"),
        "{seen:?}"
    );
    let body = &seen.body;
    assert_eq!(body["type"], "transition");
    assert_eq!(body["pool"], "web");
    assert_eq!(body["backend"], "b1");
    assert_eq!(body["from"], "UP");
    assert_eq!(body["to"], "DOWN");
    assert_eq!(body["side"], "active");
    assert_eq!(body["reason"], reason.as_str());
    assert!(body["time"].as_str().unwrap().ends_with('Z'), "{body}");
    assert!(body.get("suppressed").is_none(), "{body}");

    let stats = alerts.stats();
    wait_until("delivered = 1", || stats.webhook.delivered() == 1).await;
    assert_counts(&stats, [1, 0, 0, 0], [0, 0, 0, 0]);
}

#[tokio::test]
async fn a_webhook_is_retried_until_it_answers_2xx() {
    let mut receiver = Receiver::start(&[500, 500, 200]).await;
    let (alerts, events) = start(AlertsConfig {
        webhooks: vec![WebhookConfig {
            retries: 3,
            ..webhook(receiver.addr)
        }],
        ..AlertsConfig::default()
    });
    events.send(transition("b1", State::Down)).unwrap();

    for _ in 0..3 {
        assert_eq!(receiver.next().await.body["backend"], "b1");
    }
    let stats = alerts.stats();
    wait_until("delivered = 1", || stats.webhook.delivered() == 1).await;
    assert_counts(&stats, [1, 0, 0, 0], [0, 0, 0, 0]);
}

#[tokio::test]
async fn a_webhook_to_a_closed_port_fails_after_its_retries() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let (alerts, events) = start(AlertsConfig {
        webhooks: vec![WebhookConfig {
            retries: 1,
            ..webhook(closed)
        }],
        ..AlertsConfig::default()
    });
    events.send(transition("b1", State::Down)).unwrap();

    let stats = alerts.stats();
    wait_until("failed = 1", || stats.webhook.failed() == 1).await;
    assert_counts(&stats, [0, 1, 0, 0], [0, 0, 0, 0]);
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_blocking_the_sender() {
    // Nobody accepts: the kernel completes the handshake, and the request waits forever.
    let hanging = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (alerts, events) = start(AlertsConfig {
        webhooks: vec![WebhookConfig {
            timeout: Duration::from_secs(60),
            queue: 1,
            ..webhook(hanging.local_addr().unwrap())
        }],
        ..AlertsConfig::default()
    });

    let sending = Instant::now();
    for i in 0..50 {
        let to = if i % 2 == 0 { State::Down } else { State::Up };
        events.send(transition("b1", to)).unwrap();
    }
    // Wall time is the subject: fifty sends to a hanging receiver never wait for it.
    assert!(sending.elapsed() < Duration::from_secs(1));

    // One alert is in flight (or still queued), one waits in the queue; the rest are dropped.
    let stats = alerts.stats();
    wait_until("dropped >= 48", || stats.webhook.dropped() >= 48).await;
    let dropped = stats.webhook.dropped();
    assert!(dropped <= 49, "dropped {dropped}");
    assert_eq!(stats.webhook.delivered(), 0);
    assert_eq!(stats.webhook.failed(), 0);
}

#[tokio::test]
async fn a_command_gets_the_event_in_its_environment() {
    let file = scratch_file("command");
    let (alerts, events) = start(AlertsConfig {
        commands: vec![CommandConfig {
            argv: vec![
                "sh".into(),
                "-c".into(),
                r#"printf "%s|%s|%s" "$CAPATAZ_BACKEND" "$CAPATAZ_TO" "$CAPATAZ_REASON" > "$1""#
                    .into(),
                "sh".into(),
                file.display().to_string(),
            ],
            timeout: Duration::from_secs(10),
            queue: 16,
        }],
        ..AlertsConfig::default()
    });
    let event = transition("b1", State::Down);
    let reason = event.change().unwrap().2;
    events.send(event).unwrap();

    let stats = alerts.stats();
    // Delivered means the command exited 0, so the file is complete.
    wait_until("delivered = 1", || stats.command.delivered() == 1).await;
    let written = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert_eq!(written, format!("b1|DOWN|{reason}"));
    assert_counts(&stats, [0, 0, 0, 0], [1, 0, 0, 0]);
}

#[tokio::test]
async fn a_failing_command_is_counted_as_failed() {
    // (Its argv, its timeout.)
    let cases = [
        (
            "one that exits 3",
            (&["sh", "-c", "exit 3"][..], Duration::from_secs(10)),
        ),
        (
            "one that outlives its timeout is killed",
            (&["sleep", "30"][..], Duration::from_millis(100)),
        ),
    ];
    cases::each(cases, |(argv, timeout)| async move {
        let (alerts, events) = start(AlertsConfig {
            commands: vec![CommandConfig {
                argv: argv.iter().map(|arg| (*arg).to_owned()).collect(),
                timeout,
                queue: 16,
            }],
            ..AlertsConfig::default()
        });
        events.send(transition("b1", State::Down)).unwrap();

        let stats = alerts.stats();
        wait_until("failed = 1", || stats.command.failed() == 1).await;
        assert_counts(&stats, [0, 0, 0, 0], [0, 1, 0, 0]);
    })
    .await;
}

#[tokio::test]
async fn a_flapping_backend_is_debounced_into_one_alert_and_one_summary() {
    let mut receiver = Receiver::start(&[200]).await;
    // A window far longer than sending ten events takes, so they all fall inside it.
    let (alerts, events) = start(AlertsConfig {
        debounce: Some(Duration::from_secs(1)),
        webhooks: vec![webhook(receiver.addr)],
        ..AlertsConfig::default()
    });
    for i in 0..10 {
        let to = if i % 2 == 0 { State::Down } else { State::Up };
        events.send(transition("b1", to)).unwrap();
    }

    let first = receiver.next().await.body;
    assert_eq!(first["to"], "DOWN");
    assert!(first.get("suppressed").is_none(), "{first}");
    let summary = receiver.next().await.body;
    assert_eq!(summary["to"], "UP");
    assert_eq!(summary["suppressed"], 9);

    let stats = alerts.stats();
    wait_until("delivered = 2", || stats.webhook.delivered() == 2).await;
    assert_counts(&stats, [2, 0, 0, 9], [0, 0, 0, 0]);
}

/// Checks `[delivered, failed, dropped, suppressed]` of webhooks and commands.
fn assert_counts(stats: &AlertStats, webhook: [u64; 4], command: [u64; 4]) {
    let counts =
        |h: &capataz::alerts::HookStats| [h.delivered(), h.failed(), h.dropped(), h.suppressed()];
    assert_eq!(counts(&stats.webhook), webhook, "webhook counts");
    assert_eq!(counts(&stats.command), command, "command counts");
}

/// A path in the temporary directory unique to this process and `name`.
fn scratch_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("capataz-alerts-{}-{name}.txt", std::process::id()))
}
