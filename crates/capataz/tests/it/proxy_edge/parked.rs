//! A parked client connection's idle backend connection (`connection_reuse = "private"`): out
//! of the event loop while its client is parked, reused by the client's next request, and
//! replaced, not used, if the backend closed it meanwhile.

use std::sync::Arc;

use tokio::sync::Notify;

use super::connections::{counted, expected, post, PARKING};
use super::*;
use crate::support::wait::wait_until;

/// A keep-alive backend that answers `<length> <fnv>` like `counting_backend`, and closes every
/// connection it holds when `close` is notified.
async fn closing_backend(close: Arc<Notify>) -> RawBackend {
    RawBackend::start(move |mut stream, hits| {
        let close = close.clone();
        async move {
            let mut buf = Vec::new();
            loop {
                let head = tokio::select! {
                    head = read_head(&mut stream, &mut buf) => head,
                    () = close.notified() => return,
                };
                let Some(head) = head else { return };
                let Some(body) = read_body(&mut stream, &mut buf, &head).await else {
                    return;
                };
                hits.fetch_add(1, Ordering::SeqCst);
                let text = format!("{} {:x}", body.len(), fnv(&body));
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                    text.len()
                );
                if stream.write_all(response.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_backend_connection_closed_while_its_client_is_parked_is_replaced_not_used() {
    let close = Arc::new(Notify::new());
    let backend = closing_backend(close.clone()).await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    stream.write_all(&post("/1", b"one")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"one"));
    wait_until("the quiet connection parks", || {
        balancer.parked_connections() == 1
    })
    .await;
    // Parked, its backend connection asleep: the backend closes it (a FIN capataz is not told
    // of while it sleeps).
    close.notify_waiters();
    wait_until("the backend closed its connection", || {
        backend.closed() == 1
    })
    .await;
    // A POST, never sent again once sent: had the closed connection been used, the request
    // would have failed (502), not been answered.
    stream.write_all(&post("/2", b"two")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"two"));
    assert_eq!(backend.hits(), 2);
    assert_eq!(
        backend.accepted(),
        2,
        "a fresh backend connection for the second"
    );
    assert_eq!(balancer.open_connections(), 1);
    assert_eq!(balancer.parks(), 1);
}
