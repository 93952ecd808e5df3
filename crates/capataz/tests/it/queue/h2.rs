//! `max_requests` on an HTTP/2 pool: a real hyper HTTP/2 backend (prior knowledge) that holds
//! each stream a while and counts the streams it holds at once never carries more than the
//! limit over its one connection.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::*;

/// Starts an h2c backend holding each request `hold`, counting into `seen`.
async fn h2_backend(seen: Arc<Seen>, hold: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: http::Request<_>| {
                    let seen = seen.clone();
                    async move {
                        let now = seen.current.fetch_add(1, Ordering::SeqCst) + 1;
                        seen.max.fetch_max(now, Ordering::SeqCst);
                        seen.arrived
                            .lock()
                            .unwrap()
                            .push(request.uri().path().to_owned());
                        tokio::time::sleep(hold).await;
                        seen.current.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                            b"ok",
                        ))))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    addr
}

/// Forty requests at once through an HTTP/2 pool with `max_requests = 4`: the backend never
/// holds more than 4 streams, reaches 4, and every request is answered.
#[tokio::test]
async fn max_requests_bounds_the_streams_an_h2_backend_carries() {
    let seen = Arc::new(Seen::default());
    let backend = h2_backend(seen.clone(), Duration::from_millis(50)).await;
    let text = config(
        &[("h", backend, "")],
        "protocol = \"h2c\"\nmax_requests = 4",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut clients = JoinSet::new();
    for n in 0..40 {
        clients.spawn(async move { get(addr, &format!("/s{n}")).await.status });
    }
    while let Some(status) = clients.join_next().await {
        assert_eq!(status.expect("a client"), 200);
    }
    assert_eq!(
        seen.max.load(Ordering::SeqCst),
        4,
        "at most, and at last, 4 streams"
    );
    assert_eq!(seen.arrived.lock().unwrap().len(), 40);
    let pool = pool_status(balancer.admin_addr().unwrap()).await;
    assert_eq!(pool["backends"][0]["limit"], 4, "{pool:#}");
    assert_eq!(pool["backends"][0]["in_flight"], 0);
    balancer.shutdown(Duration::from_secs(1)).await;
}
