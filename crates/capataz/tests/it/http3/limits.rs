//! HTTP/3's limits: a client cannot have more request streams open at once than
//! `max_streams`, however many it asks for.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{h3_balancer, udp_addr, SITE};
use crate::support::balancer::ConfigText;
use crate::support::h3client::{client_config, connect};
use crate::support::raw::{self, RawBackend};
use crate::support::tls::Pki;

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
    let config = ConfigText::new(&[backend.entry("a")]);
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
