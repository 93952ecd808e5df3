//! Sections 4, 5 and 6: what a backend answer must be (a status in 100-599, no unasked 101,
//! trustworthy framing), or it is malformed and the client gets 502.

use capataz_health::Outcome;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{answering, balancer, charged, errors, GET};
use crate::support::raw::{header, read_reply, roundtrip};

#[tokio::test]
async fn a_status_code_outside_100_599_is_a_malformed_answer() {
    let backend = answering(b"HTTP/1.1 600 Beyond\r\nContent-Length: 2\r\n\r\nok").await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    let reply = roundtrip(addr, GET).await.expect("an answer");
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(charged(&balancer, 0), [Outcome::Malformed]);
}

#[tokio::test]
async fn an_unasked_101_is_a_malformed_answer_and_is_not_relayed() {
    let backend = answering(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: raw\r\nConnection: upgrade\r\n\r\nRAW BYTES",
    )
    .await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(GET).await.unwrap();
    let mut buf = Vec::new();
    let reply = read_reply(&mut stream, &mut buf).await.expect("an answer");
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(charged(&balancer, 0), [Outcome::Malformed]);
    stream.write_all(GET).await.unwrap();
    let next = read_reply(&mut stream, &mut buf)
        .await
        .expect("a second answer");
    assert_eq!(next.status, 502);
    assert!(!String::from_utf8_lossy(&next.body).contains("RAW"));
}

#[tokio::test]
async fn content_length_beside_chunked_never_truncates_the_body() {
    for length in ["3", "40", "5"] {
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let backend = answering(Box::leak(answer.into_bytes().into_boxed_slice())).await;
        let (balancer, addr) = balancer(&[backend.addr], "", "").await;
        for _ in 0..2 {
            let reply = roundtrip(addr, GET)
                .await
                .expect("an answer, not a bare close");
            assert_eq!(reply.status, 200, "{length}: {reply:?}");
            assert_eq!(reply.body, b"hello", "{length}: {reply:?}");
        }
        assert_eq!(
            backend.accepted(),
            2,
            "{length}: a connection whose answer had both is not reused"
        );
        assert_eq!(errors(&balancer, 0), []);
    }
}

#[tokio::test]
async fn answers_with_untrustworthy_framing_get_502() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabcd",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nxyz",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    ] {
        let backend = answering(answer).await;
        let (balancer, addr) = balancer(&[backend.addr], "", "").await;
        let reply = roundtrip(addr, GET).await.expect("an answer");
        let text = String::from_utf8_lossy(answer);
        assert_eq!(reply.status, 502, "{text}: {reply:?}");
        assert_eq!(charged(&balancer, 0), [Outcome::Malformed], "{text}");
    }
    // A length repeated as a list is one length, and goes to the client as one number.
    let backend = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok").await;
    let (_balancer, addr) = balancer(&[backend.addr], "", "").await;
    let reply = roundtrip(addr, GET).await.expect("an answer");
    assert_eq!(
        (reply.status, &reply.body[..]),
        (200, &b"ok"[..]),
        "{reply:?}"
    );
    assert_eq!(header(&reply.head, "content-length"), Some("2"));
}
