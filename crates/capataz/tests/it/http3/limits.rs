//! HTTP/3's limits: a client cannot have more request streams open at once than
//! `max_streams`, however many it asks for; a client that reads nothing of its answers does
//! not keep backend connections busy past the pool's `body_idle`.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{h3_balancer, udp_addr, SITE};
use crate::support::balancer::ConfigText;
use crate::support::h3client::{client_config, connect, connect_with};
use crate::support::raw::{self, RawBackend};
use crate::support::tls::Pki;
use crate::support::wait::wait_until;

/// A backend that answers each request after `delay`, counting the most requests it held at
/// once in `most`.
async fn counting_backend(delay: Duration, most: Arc<AtomicUsize>) -> RawBackend {
    let now = Arc::new(AtomicUsize::new(0));
    RawBackend::start(move |mut stream, hits| {
        let (now, most) = (now.clone(), most.clone());
        async move {
            let mut buf = Vec::new();
            while raw::read_head(&mut stream, &mut buf).await.is_some() {
                hits.fetch_add(1, Ordering::SeqCst);
                let held = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(held, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                now.fetch_sub(1, Ordering::SeqCst);
                if stream
                    .write_all(raw::ok_answer("ok").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_flood_of_streams_is_bounded_by_max_streams() {
    let pki = Pki::new();
    let most = Arc::new(AtomicUsize::new(0));
    let backend = counting_backend(Duration::from_millis(50), most.clone()).await;
    // No probes: the backend counts every request it gets.
    let config = ConfigText::new(&[backend.entry("a")]).extra("active.kind = \"none\"\n");
    let (balancer, _) = h3_balancer(&pki, config, Some("max_streams = 4"), "").await;
    let addr = udp_addr(&balancer);
    // The limit is QUIC's: a fifth stream cannot even be opened until one of the four ends.
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let connection = endpoint
        .connect_with(client_config(&pki), addr, SITE)
        .unwrap()
        .await
        .unwrap();
    let mut open = Vec::new();
    for _ in 0..4 {
        open.push(
            now_or_never(connection.open_bi())
                .expect("within the limit")
                .unwrap(),
        );
    }
    assert!(
        now_or_never(connection.open_bi()).is_none(),
        "a fifth stream was opened at once"
    );
    connection.close(0u32.into(), b"done");
    // Twenty requests at once over one connection: all answered, at most four at a time.
    let client = connect(&pki, addr, SITE).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let mut send = client.send.clone();
        tasks.push(tokio::spawn(async move {
            let request = http::Request::get(format!("https://{SITE}/"))
                .body(())
                .unwrap();
            let mut stream = send
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            stream.finish().await.map_err(|e| e.to_string())?;
            crate::support::h3client::read_answer(&mut stream).await
        }));
    }
    for task in tasks {
        let answer = task.await.unwrap().expect("answered");
        assert_eq!(answer.head.status(), 200);
    }
    assert_eq!(backend.hits(), 20);
    let most = most.load(Ordering::SeqCst);
    assert!((1..=4).contains(&most), "{most} requests at once");
    client.connection.close(0u32.into(), b"done");
}

/// `future`'s output if it is ready at its first poll.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// A keep-alive backend whose every answer is `size` bytes of body.
async fn sized_backend(size: usize) -> RawBackend {
    RawBackend::start(move |mut stream, hits| async move {
        let mut buf = Vec::new();
        while raw::read_head(&mut stream, &mut buf).await.is_some() {
            hits.fetch_add(1, Ordering::SeqCst);
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 64 * 1024];
            let mut left = size;
            while left > 0 {
                let n = left.min(chunk.len());
                if stream.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                left -= n;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_client_that_reads_nothing_lets_go_of_the_backend_connections_after_body_idle() {
    let pki = Pki::new();
    let logs = crate::support::access_log::LogDir::new();
    let log = logs.path("access.log");
    let backend = sized_backend(4 << 20).await;
    let config = ConfigText::new(&[backend.entry("a")])
        .extra("active.kind = \"none\"\ntimeouts.body_idle = \"1s\"\n");
    let (balancer, _) = h3_balancer(&pki, config, Some(""), &super::json_log(&log)).await;
    // A client whose streams take 16 KiB each, and which then reads nothing.
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(16 * 1024));
    let mut config = client_config(&pki);
    config.transport_config(Arc::new(transport));
    let mut client = connect_with(config, udp_addr(&balancer), SITE)
        .await
        .unwrap();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let request = http::Request::get(format!("https://{SITE}/big"))
            .body(())
            .unwrap();
        let mut stream = client.start(request, Some(b"")).await.unwrap();
        let head = stream.recv_response().await.expect("the head");
        assert_eq!(head.status(), 200);
        streams.push(stream);
    }
    // Each answer ends once the client has taken nothing of it for body_idle: its backend
    // connection closed (an answer not read to its end is not reused).
    wait_until("the backend connections let go", || backend.closed() == 3).await;
    assert_eq!(backend.accepted(), 3);
    for line in crate::support::access_log::wait_json(&log, 3).await {
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["ended_by"], "client", "{line}");
        assert_eq!(line["phase"], "body", "{line}");
    }
    drop(streams);
}
