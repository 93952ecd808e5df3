//! A retry sends the same request head again, byte for byte.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;

use super::balancer_with;
use crate::support::raw::{read_head, roundtrip, RawBackend};

#[tokio::test]
async fn a_retry_sends_the_same_request_head_again() {
    let heads = Arc::new(std::sync::Mutex::new(Vec::<(&str, String)>::new()));
    let seen = heads.clone();
    // Reads a request, then closes without an answer: a reset before the head, retried.
    let closer = RawBackend::serving(move |mut stream| {
        let seen = seen.clone();
        async move {
            let mut buf = Vec::new();
            if let Some(head) = read_head(&mut stream, &mut buf).await {
                seen.lock().unwrap().push(("closer", head));
            }
        }
    })
    .await;
    let seen = heads.clone();
    let answerer = RawBackend::serving(move |mut stream| {
        let seen = seen.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(head) = read_head(&mut stream, &mut buf).await {
                seen.lock().unwrap().push(("answerer", head));
                let answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let (_balancer, addr) = balancer_with(
        &[closer.addr, answerer.addr],
        "",
        "",
        "retries = { attempts = 1 }",
    )
    .await;
    let request = b"GET /again?x=1 HTTP/1.1\r\nHost: app.test\r\nX-Tag: one\r\nX-Tag: two\r\nAccept: */*\r\n\r\n";
    for _ in 0..2 {
        let reply = roundtrip(addr, request).await.expect("an answer");
        assert_eq!((reply.status, &reply.body[..]), (200, &b"ok"[..]));
    }
    let heads = heads.lock().unwrap().clone();
    let at = heads
        .iter()
        .position(|(backend, _)| *backend == "closer")
        .expect("one request went to the closer first");
    let (_, first) = &heads[at];
    let (backend, again) = &heads[at + 1];
    assert_eq!(*backend, "answerer");
    assert_eq!(first, again);
    assert!(first.starts_with("GET /again?x=1 HTTP/1.1"), "{first}");
    assert!(first.contains("x-tag: one\r\nx-tag: two"), "{first}");
}
