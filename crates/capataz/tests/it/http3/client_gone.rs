//! An HTTP/3 client that resets its request stream mid-body is a client going away: the
//! request is dropped at once (the backend sees its connection close), the access log says
//! `ended_by=client`, and nothing is charged to the backend.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use h3::error::Code;
use http::{Method, Request};
use serde_json::Value;

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

#[tokio::test]
async fn a_stream_reset_mid_body_is_the_clients_and_charges_nothing_to_the_backend() {
    let pki = Pki::new();
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let backend = waiting_backend().await;
    let config = ConfigText::new(&[backend.entry("slow")]).admin("").extra(
        "[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nconsecutive_errors = 1\n",
    );
    let (balancer, mut events) = h3_balancer(&pki, config, Some(""), &json_log(&log)).await;
    let admin = balancer.admin_addr().expect("an admin listener");
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("https://{SITE}/upload"))
        .header("content-length", "100000")
        .body(())
        .unwrap();
    let mut stream = client.start(request, None).await.unwrap();
    stream
        .send_data(Bytes::from(vec![b'x'; 1000]))
        .await
        .unwrap();
    wait_until("the backend has the request", || backend.hits() == 1).await;
    // The client gives up on the rest of its body: RESET_STREAM (and STOP_SENDING).
    stream.stop_stream(Code::H3_REQUEST_CANCELLED);
    stream.stop_sending(Code::H3_REQUEST_CANCELLED);
    wait_until("the backend's connection closed by capataz", || {
        backend.closed() == 1
    })
    .await;
    let line = &wait_json(&log, 1).await[0];
    assert_eq!(line["protocol"], "HTTP/3.0", "{line}");
    assert_eq!(line["status"], Value::Null, "{line}");
    assert_eq!(line["ended_by"], "client", "{line}");
    assert_eq!(line["phase"], "send", "{line}");
    assert_eq!(line["backend"], "slow", "{line}");
    assert_eq!(line["attempts"], 1, "{line}");
    // Nothing charged: no error counted, no streak, no transition.
    let page = metrics_text(&balancer);
    let series = "capataz_requests_total{pool=\"web\",backend=\"slow\",class=\"error\"} 0";
    assert!(page.contains(series), "{page}");
    let status = exchange(admin, "GET", "/status/web/slow", &admin.to_string(), &[]).await;
    let status = status.json();
    assert_eq!(status["verdict"], "UP", "{status}");
    assert_eq!(status["passive"]["error_streak"], 0, "{status}");
    assert_eq!(count_transitions(&mut events), 0, "no transition");
    // The connection itself goes on: the next request is served.
    assert_eq!(backend.accepted(), 1);
}
