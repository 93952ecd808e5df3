//! Section 7: one host per request: ambiguous hosts get 400, and routing and the forwarded
//! request use the same host.

use tokio::io::AsyncWriteExt;

use super::balancer;
use crate::support::raw::{ok_answer, read_head, roundtrip, RawBackend};

/// A backend that answers each request with the Host it received.
async fn host_echo() -> RawBackend {
    RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let hosts: Vec<&str> = head
                .split("\r\n")
                .skip(1)
                .filter_map(|line| line.split_once(':'))
                .filter(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
                .map(|(_, value)| value.trim())
                .collect();
            let text = hosts.join("|");
            let answer = ok_answer(&text);
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

const A_TEST_ONLY: &str = "[[listeners.routes]]\nhost = \"a.test\"\npool = \"web\"";

#[tokio::test]
async fn ambiguous_hosts_get_400_and_never_reach_a_backend() {
    let backend = host_echo().await;
    let (_balancer, addr) = balancer(&[backend.addr], A_TEST_ONLY, "").await;
    for request in [
        &b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nHost: a.test:8080\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\n\r\n",
    ] {
        let reply = roundtrip(addr, request).await.expect("an answer");
        assert_eq!(
            reply.status,
            400,
            "{}: {reply:?}",
            String::from_utf8_lossy(request)
        );
    }
    assert_eq!(backend.accepted(), 0);
}

#[tokio::test]
async fn routing_and_the_forwarded_request_use_the_same_host() {
    let backend = host_echo().await;
    let (_balancer, addr) = balancer(&[backend.addr], A_TEST_ONLY, "").await;
    for (request, status, seen) in [
        (
            &b"GET / HTTP/1.1\r\nHost: A.test:80\r\n\r\n"[..],
            200,
            &b"A.test:80"[..],
        ),
        (
            b"GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
            200,
            b"a.test",
        ),
        (
            b"GET http://a.test:80/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
            200,
            b"a.test",
        ),
        (b"GET http://a.test/x HTTP/1.0\r\n\r\n", 200, b"a.test"),
        (b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n", 404, b""),
    ] {
        let reply = roundtrip(addr, request).await.expect("an answer");
        let text = String::from_utf8_lossy(request);
        assert_eq!(reply.status, status, "{text}: {reply:?}");
        if status == 200 {
            assert_eq!(reply.body, seen, "{text}");
        }
    }
}
