//! The acceptance test of "blame the right party": thirty hostile clients (slow but steady
//! uploads, stalled uploads, clients vanishing mid-body, malformed chunked uploads) against a
//! pool of healthy backends. Nothing is ejected, nothing is logged at WARN, and each client
//! gets the answer its own behaviour earns: 200, 408, nothing, 400.
//!
//! The log is captured by a process-wide subscriber, so this file holds this one test, in a
//! binary of its own: in the `it` binary the subscriber would also see every other test's
//! warnings, and only the first test to set it would succeed.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capataz::events::Notice;
use capataz_health::Outcome;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing_subscriber::layer::SubscriberExt;

use support::balancer::start;
use support::raw::{fill, find, length_backend, read_reply};

const DEADLINE: Duration = Duration::from_secs(30);

/// Records every log event at WARN or above, and counts the debug lines about failed
/// attempts charged to nobody.
#[derive(Clone, Default)]
struct Recorder {
    warnings: Arc<Mutex<Vec<String>>>,
    uncharged: Arc<Mutex<usize>>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        let mut text = String::new();
        event.record(
            &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                text.push_str(&format!("{}={value:?} ", field.name()));
            },
        );
        if *meta.level() <= tracing::Level::WARN {
            self.warnings.lock().unwrap().push(format!(
                "{} {}: {text}",
                meta.level(),
                meta.target()
            ));
        } else if text.contains("nothing charged") {
            *self.uncharged.lock().unwrap() += 1;
        }
    }
}

/// What a hostile client does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Hostile {
    /// Uploads 100 bytes in ten pieces 100 ms apart: longer than `response_header`.
    SlowButSteady,
    /// Sends ten bytes of a 100-byte body, then nothing.
    Stalled,
    /// Sends ten bytes of a 100-byte body, then closes.
    Vanishing,
    /// Sends a chunked body whose second chunk size is not hex.
    MalformedChunks,
}

const HEAD: &[u8] = b"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\n";

/// Plays `kind` against `addr`; returns the status of the answer, if one came.
async fn play(addr: SocketAddr, kind: Hostile) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    match kind {
        Hostile::SlowButSteady => {
            stream.write_all(HEAD).await.unwrap();
            for _ in 0..10 {
                stream.write_all(&[b'x'; 10]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Hostile::Stalled => {
            stream.write_all(HEAD).await.unwrap();
            stream.write_all(&[b'x'; 10]).await.unwrap();
        }
        Hostile::Vanishing => {
            stream.write_all(HEAD).await.unwrap();
            stream.write_all(&[b'x'; 10]).await.unwrap();
            // Long enough for the request to be on its way to a backend.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return None;
        }
        Hostile::MalformedChunks => {
            stream
                .write_all(
                    b"POST /upload HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nnot-hex\r\n",
                )
                .await
                .unwrap();
        }
    }
    let mut buf = Vec::new();
    while find(&buf, b"\r\n").is_none() {
        fill(&mut stream, &mut buf).await.ok().filter(|&n| n > 0)?;
    }
    String::from_utf8_lossy(&buf[9..12]).parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_hostile_clients_eject_nothing_log_no_warning_and_get_their_own_status() {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry()
        .with(recorder.clone())
        .with(tracing_subscriber::filter::LevelFilter::DEBUG);
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(length_backend().await);
    }
    let list: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| format!("{{ name = \"b{i}\", address = \"{}\" }}", b.addr))
        .collect();
    // Defaults everywhere (3 consecutive errors eject) but the timeouts, short for the test;
    // response_header is shorter than the slow uploads take.
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
request_body_timeout = "500ms"

[pools.web]
backends = [{}]

[pools.web.active]
interval = "500ms"

[pools.web.timeouts]
response_header = "300ms"
"#,
        list.join(", ")
    );
    let (balancer, mut seen) = start(&text).await;
    let addr = balancer.local_addrs()[0];

    let kinds = [
        Hostile::SlowButSteady,
        Hostile::Stalled,
        Hostile::Vanishing,
        Hostile::MalformedChunks,
    ];
    let started = Instant::now();
    let clients: Vec<_> = (0..30)
        .map(|i| {
            let kind = kinds[i % kinds.len()];
            tokio::spawn(async move { (kind, play(addr, kind).await) })
        })
        .collect();
    let mut wrong = Vec::new();
    for client in clients {
        let (kind, status) = tokio::time::timeout(DEADLINE, client)
            .await
            .expect("every hostile client is done within the deadline")
            .unwrap();
        let expected = match kind {
            Hostile::SlowButSteady => Some(200),
            Hostile::Stalled => Some(408),
            Hostile::Vanishing => None,
            Hostile::MalformedChunks => Some(400),
        };
        if status != expected {
            wrong.push(format!("{kind:?}: got {status:?}, expected {expected:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
    assert!(started.elapsed() < DEADLINE);

    // Ordinary traffic afterwards reaches every backend, none ejected.
    let pool = balancer.pool("web").unwrap();
    for _ in 0..6 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let reply = read_reply(&mut stream, &mut buf).await.expect("an answer");
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    for (i, backend) in pool.backends.iter().enumerate() {
        let errors: Vec<Outcome> = backend
            .traffic
            .recent()
            .into_iter()
            .filter(|o| !matches!(o, Outcome::Status(code) if *code < 500))
            .collect();
        assert_eq!(errors, [], "backend b{i} was charged");
    }
    let mut events = Vec::new();
    while let Ok(event) = seen.try_recv() {
        events.push(event);
    }
    assert!(
        events.is_empty(),
        "no health event at all: {:?}",
        events.iter().map(Notice::to_json).collect::<Vec<_>>()
    );
    let warnings = recorder.warnings.lock().unwrap().clone();
    assert!(warnings.is_empty(), "logged at WARN or above: {warnings:?}");
    // The stalled, vanishing and malformed uploads were failures charged to nobody, logged at
    // debug.
    assert!(*recorder.uncharged.lock().unwrap() >= 15);
    balancer.shutdown(Duration::from_secs(1)).await;
}
