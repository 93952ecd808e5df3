//! Section 8: bytes a backend sends never reach another client: connection reuse is private to
//! a client connection unless opted out, and idle backend connections are closed.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{balancer, balancer_with, GET};
use crate::support::raw::{
    header, length_backend, ok_answer, read_body, read_head, read_reply, roundtrip, RawBackend,
};
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// A backend that, after some answers, writes a whole second answer 20 ms later, unasked,
/// naming the client whose request it follows: after a HEAD answer (as if it were the body),
/// after a complete Content-Length body, and after a 204. `/plain` gets no stray bytes.
async fn poisoner() -> RawBackend {
    RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let client = header(&head, "x-client").unwrap_or("?").to_owned();
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let answer = match path.as_str() {
                "/head" => "HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n".to_owned(),
                "/204" => "HTTP/1.1 204 No Content\r\n\r\n".to_owned(),
                _ => {
                    let text = format!("OK-{client}");
                    ok_answer(&text)
                }
            };
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            if path != "/plain" {
                // The lateness is the subject: stray bytes after the answer was relayed.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let text = format!("POISONED-{client}");
                let stray = ok_answer(&text);
                if stream.write_all(stray.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// One request of client `client` on `stream`: the answer's body (none for HEAD and 204), or
/// `None` if the connection ended without a whole answer.
async fn poisonable_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    client: &str,
    kind: &str,
) -> Option<(u16, Vec<u8>)> {
    let method = if kind == "/head" { "HEAD" } else { "GET" };
    let request =
        format!("{method} {kind} HTTP/1.1\r\nHost: app.test\r\nX-Client: {client}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let head = read_head(stream, buf).await?;
    let status: u16 = head.get(9..12)?.parse().ok()?;
    if method == "HEAD" || status == 204 {
        return Some((status, Vec::new()));
    }
    let body = read_body(stream, buf, &head).await?;
    Some((status, body))
}

/// The client names found in `POISONED-<client>` markers of `body`.
fn poisoned_by(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    text.match_indices("POISONED-")
        .map(|(at, marker)| {
            text[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stray_backend_bytes_never_reach_another_client() {
    let backend = poisoner().await;
    let (_balancer, addr) = balancer(&[backend.addr], "", "").await;
    const KINDS: [&str; 4] = ["/head", "/cl", "/204", "/plain"];
    let mut tasks = Vec::new();
    // Keep-alive clients: many requests on one connection each.
    for c in 0..20 {
        tasks.push(tokio::spawn(async move {
            let client = format!("k{c}");
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let mut buf = Vec::new();
            let mut seen = Vec::new();
            for r in 0..12 {
                let kind = KINDS[(c + r) % KINDS.len()];
                match poisonable_request(&mut stream, &mut buf, &client, kind).await {
                    Some((_, body)) => seen.extend(poisoned_by(&body)),
                    None => {
                        stream = TcpStream::connect(addr).await.unwrap();
                        buf.clear();
                    }
                }
            }
            (client, seen)
        }));
    }
    // Fresh clients: one request per connection, arriving while the others run.
    for c in 0..40 {
        tasks.push(tokio::spawn(async move {
            let client = format!("f{c}");
            let mut seen = Vec::new();
            for r in 0..6 {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                let mut buf = Vec::new();
                let kind = KINDS[(c + r) % KINDS.len()];
                if let Some((_, body)) =
                    poisonable_request(&mut stream, &mut buf, &client, kind).await
                {
                    seen.extend(poisoned_by(&body));
                }
            }
            (client, seen)
        }));
    }
    let mut foreign = Vec::new();
    for task in tasks {
        let (client, seen) = tokio::time::timeout(DEADLINE, task)
            .await
            .expect("every client finishes")
            .expect("client task");
        foreign.extend(
            seen.into_iter()
                .filter(|from| *from != client)
                .map(|from| format!("{client} got {from}'s bytes")),
        );
    }
    assert!(
        foreign.is_empty(),
        "{} cross-client answers: {foreign:?}",
        foreign.len()
    );
}

#[tokio::test]
async fn a_new_client_connection_never_reuses_another_ones_backend_connection() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    // Keep-alive: the backend connection is reused by the same client connection.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..3 {
        stream.write_all(GET).await.unwrap();
        assert_eq!(read_reply(&mut stream, &mut buf).await.unwrap().status, 200);
    }
    assert_eq!(backend.accepted(), 1);
    // Another client connection, while the first is open and idle: a fresh backend connection.
    let reply = roundtrip(addr, GET).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(backend.accepted(), 2);
    drop(stream);
    let _ = balancer;
}

#[tokio::test]
async fn shared_reuse_stays_available_as_an_opt_in() {
    let backend = length_backend().await;
    let (_balancer, addr) =
        balancer_with(&[backend.addr], "", "", "connection_reuse = \"shared\"").await;
    for _ in 0..3 {
        assert_eq!(roundtrip(addr, GET).await.unwrap().status, 200);
    }
    assert_eq!(backend.accepted(), 1);
}

#[tokio::test]
async fn an_idle_private_backend_connection_is_closed_after_timeouts_idle() {
    let backend = length_backend().await;
    let (_balancer, addr) = balancer(&[backend.addr], "", "idle = \"200ms\"").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    stream.write_all(GET).await.unwrap();
    assert_eq!(read_reply(&mut stream, &mut buf).await.unwrap().status, 200);
    // The client connection stays open and idle; its backend connection does not outlive
    // the backend's idle timeout (plus the watcher's period).
    wait_until("the idle backend connection closed", || {
        backend.closed() == 1
    })
    .await;
    stream.write_all(GET).await.unwrap();
    assert_eq!(read_reply(&mut stream, &mut buf).await.unwrap().status, 200);
    assert_eq!(backend.accepted(), 2);
}
