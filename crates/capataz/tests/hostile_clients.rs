//! The acceptance test of "blame the right party": thirty hostile clients (slow but steady
//! uploads, stalled uploads, clients vanishing mid-body, malformed chunked uploads) against a
//! pool of healthy backends. Nothing is ejected, nothing is logged at WARN, and each client
//! gets the answer its own behaviour earns: 200, 408, nothing, 400.
//!
//! The log is captured by a process-wide subscriber, so this file holds this one test.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capataz::config;
use capataz::events::Event;
use capataz::server::Balancer;
use capataz_health::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing_subscriber::layer::SubscriberExt;

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

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A healthy keep-alive backend: reads each request whole (Content-Length or chunked) and
/// answers 200 with the body's length.
async fn healthy_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    addr
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

async fn serve(mut stream: TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                break end;
            }
            fill(&mut stream, &mut buf).await?;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end + 4);
        let mut length = 0;
        if head.contains("transfer-encoding: chunked") {
            loop {
                let line_end = loop {
                    if let Some(at) = find(&buf, b"\r\n") {
                        break at;
                    }
                    fill(&mut stream, &mut buf).await?;
                };
                let size =
                    usize::from_str_radix(String::from_utf8_lossy(&buf[..line_end]).trim(), 16)
                        .ok()?;
                buf.drain(..line_end + 2);
                while buf.len() < size + 2 {
                    fill(&mut stream, &mut buf).await?;
                }
                buf.drain(..size + 2);
                length += size;
                if size == 0 {
                    break;
                }
            }
        } else if let Some(at) = head.find("content-length:") {
            let value = head[at + 15..].lines().next()?.trim();
            length = value.parse().ok()?;
            while buf.len() < length {
                fill(&mut stream, &mut buf).await?;
            }
            buf.drain(..length);
        }
        let text = length.to_string();
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        stream.write_all(answer.as_bytes()).await.ok()?;
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
        fill(&mut stream, &mut buf).await?;
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
        backends.push(healthy_backend().await);
    }
    let list: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("{{ name = \"b{i}\", address = \"{addr}\" }}"))
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
    let config = config::parse_str(&text, "<test>").expect("valid config");
    let (events, mut seen) = tokio::sync::broadcast::channel(4096);
    let balancer = Balancer::start(&config, events).await.expect("starts");
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
        while find(&buf, b"\r\n").is_none() {
            fill(&mut stream, &mut buf).await.expect("an answer");
        }
        assert!(buf.starts_with(b"HTTP/1.1 200"));
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
        events.iter().map(Event::to_json).collect::<Vec<_>>()
    );
    let warnings = recorder.warnings.lock().unwrap().clone();
    assert!(warnings.is_empty(), "logged at WARN or above: {warnings:?}");
    // The stalled, vanishing and malformed uploads were failures charged to nobody, logged at
    // debug.
    assert!(*recorder.uncharged.lock().unwrap() >= 15);
    balancer.shutdown(Duration::from_secs(1)).await;
}
