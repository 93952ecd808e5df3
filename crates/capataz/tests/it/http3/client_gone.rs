//! An HTTP/3 client that resets its request stream mid-body is a client going away: the
//! request is dropped at once (the backend sees its connection close), the access log says
//! `ended_by=client`, and nothing is charged to the backend.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use capataz::health::Notice;
use capataz::server::Balancer;
use h3::error::Code;
use http::{Method, Request};
use serde_json::Value;
use tokio::sync::broadcast;

use super::{h3_balancer, json_log, udp_addr, SITE};
use crate::support::access_log::{wait_json, LogDir};
use crate::support::balancer::{metrics_text, ConfigText};
use crate::support::client::exchange;
use crate::support::events::count_transitions;
use crate::support::h3client::connect;
use crate::support::raw::{self, RawBackend};
use crate::support::tls::Pki;
use crate::support::wait::wait_until;

/// A backend that reads a request's head, counts it, then reads until its connection closes
/// (counted in `closed`), never answering.
async fn waiting_backend() -> RawBackend {
    RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        if raw::read_head(&mut stream, &mut buf).await.is_none() {
            return;
        }
        hits.fetch_add(1, Ordering::SeqCst);
        while matches!(raw::fill(&mut stream, &mut buf).await, Ok(n) if n > 0) {}
    })
    .await
}

/// A balancer logging JSON to `log`, with an admin listener, over `backend`: no probes, and a
/// single traffic error would eject it.
async fn balancer(
    pki: &Pki,
    backend: &RawBackend,
    log: &std::path::Path,
) -> (Balancer, broadcast::Receiver<Notice>) {
    let config = ConfigText::new(&[backend.entry("slow")]).admin("").extra(
        "[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nconsecutive_errors = 1\n",
    );
    h3_balancer(pki, config, Some(""), &json_log(log)).await
}

/// A POST to `/upload` announcing `length` bytes of body.
fn upload(length: usize) -> Request<()> {
    Request::builder()
        .method(Method::POST)
        .uri(format!("https://{SITE}/upload"))
        .header("content-length", length)
        .body(())
        .unwrap()
}

/// The request the backend had was dropped as the client's: its connection closed by
/// capataz, one log line saying `ended_by=client` in `phase` with no status, and nothing
/// charged to the backend (no error counted, no streak, no transition).
async fn assert_client_gone(
    balancer: &Balancer,
    events: &mut broadcast::Receiver<Notice>,
    backend: &RawBackend,
    log: &std::path::Path,
    phase: &str,
) {
    wait_until("the backend's connection closed by capataz", || {
        backend.closed() == 1
    })
    .await;
    let line = &wait_json(log, 1).await[0];
    assert_eq!(line["protocol"], "HTTP/3.0", "{line}");
    assert_eq!(line["status"], Value::Null, "{line}");
    assert_eq!(line["ended_by"], "client", "{line}");
    assert_eq!(line["phase"], phase, "{line}");
    assert_eq!(line["backend"], "slow", "{line}");
    assert_eq!(line["attempts"], 1, "{line}");
    let page = metrics_text(balancer);
    let series = "capataz_requests_total{pool=\"web\",backend=\"slow\",class=\"error\"} 0";
    assert!(page.contains(series), "{page}");
    let admin = balancer.admin_addr().expect("an admin listener");
    let status = exchange(admin, "GET", "/status/web/slow", &admin.to_string(), &[]).await;
    let status = status.json();
    assert_eq!(status["verdict"], "UP", "{status}");
    assert_eq!(status["passive"]["error_streak"], 0, "{status}");
    assert_eq!(count_transitions(events), 0, "no transition");
}

#[tokio::test]
async fn a_stream_reset_mid_body_is_the_clients_and_charges_nothing_to_the_backend() {
    let pki = Pki::new();
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let backend = waiting_backend().await;
    let (balancer, mut events) = balancer(&pki, &backend, &log).await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    let mut stream = client.start(upload(100_000), None).await.unwrap();
    stream
        .send_data(Bytes::from(vec![b'x'; 1000]))
        .await
        .unwrap();
    wait_until("the backend has the request", || backend.hits() == 1).await;
    // The client gives up on the rest of its body: RESET_STREAM (and STOP_SENDING).
    stream.stop_stream(Code::H3_REQUEST_CANCELLED);
    stream.stop_sending(Code::H3_REQUEST_CANCELLED);
    assert_client_gone(&balancer, &mut events, &backend, &log, "send").await;
    // The stream's end is not the connection's.
    assert!(
        client.connection.close_reason().is_none(),
        "the connection was closed"
    );
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_is_the_clients_and_charges_nothing() {
    let pki = Pki::new();
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let backend = waiting_backend().await;
    let (balancer, mut events) = balancer(&pki, &backend, &log).await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    // 100 bytes announced, 10 sent, then the end of the stream: the backend would wait for
    // the other 90 forever, and time out on capataz, were the body relayed as it came.
    let mut stream = client.start(upload(100), None).await.unwrap();
    stream
        .send_data(Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    stream.finish().await.unwrap();
    wait_until("the backend has the request", || backend.hits() == 1).await;
    assert_client_gone(&balancer, &mut events, &backend, &log, "send").await;
}
