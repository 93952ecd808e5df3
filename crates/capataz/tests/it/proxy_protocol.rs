//! PROXY protocol on listeners: a trusted source's header names the client (what the backend
//! sees in `X-Forwarded-For`), before TLS too; an untrusted source is served as itself, and a
//! trusted one without a valid header is closed, having reached no backend.

use std::net::SocketAddr;

use capataz::server::Balancer;
use capataz::sim::SimBackend;
use capataz_proxy_protocol::{encode_v1, encode_v2};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::balancer::{backends, start, ConfigText};
use crate::support::raw::{closes, header, read_reply};
use crate::support::tls::{get, Client, Pki};
use crate::support::DEADLINE;

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n";

async fn balancer(listener: &str) -> (Vec<SimBackend>, Balancer) {
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b)
        .listener(listener)
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _) = start(&text).await;
    (b, balancer)
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// Sends `prefix` then one request on a fresh connection (in one write, so the request
/// arrives with the header), and returns the `X-Forwarded-For` the backend saw, `None` if
/// the connection closed without an answer.
async fn seen_xff(balancer: &Balancer, prefix: &[u8]) -> Option<(u16, Option<String>)> {
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    stream.write_all(&[prefix, REQUEST].concat()).await.unwrap();
    let mut buf = Vec::new();
    let reply = tokio::time::timeout(DEADLINE, read_reply(&mut stream, &mut buf))
        .await
        .expect("an answer or a close within the deadline")?;
    let xff = header(&reply.head, "x-seen-xff").map(str::to_owned);
    Some((reply.status, xff))
}

const TRUST_LOOPBACK: &str = "proxy_protocol = { trusted = [\"127.0.0.0/8\"] }";

#[tokio::test]
async fn a_trusted_proxys_header_names_the_client_for_the_backend() {
    let (b, balancer) = balancer(TRUST_LOOPBACK).await;
    let v1 = encode_v1(addr("192.0.2.7:40000"), addr("198.51.100.1:443"));
    assert_eq!(
        seen_xff(&balancer, &v1).await,
        Some((200, Some("192.0.2.7".into())))
    );
    let v2 = encode_v2(addr("[2001:db8::9]:40000"), addr("[2001:db8::1]:443"));
    assert_eq!(
        seen_xff(&balancer, &v2).await,
        Some((200, Some("2001:db8::9".into())))
    );
    // v2 LOCAL (the proxy's own health check) and v1 UNKNOWN: the connection's own address.
    let mut local = v2.clone();
    local[12] = 0x20;
    assert_eq!(
        seen_xff(&balancer, &local).await,
        Some((200, Some("127.0.0.1".into())))
    );
    assert_eq!(
        seen_xff(&balancer, b"PROXY UNKNOWN\r\n").await,
        Some((200, Some("127.0.0.1".into())))
    );
    assert_eq!(b[0].traffic_hits(), 4);
}

#[tokio::test]
async fn a_trusted_source_without_a_valid_header_is_closed_and_reaches_no_backend() {
    let (b, balancer) = balancer(TRUST_LOOPBACK).await;
    // A plain request where the header should be.
    assert_eq!(seen_xff(&balancer, b"").await, None);
    // A malformed header.
    assert_eq!(
        seen_xff(&balancer, b"PROXY TCP4 1.2.3.4 nope 1 2\r\n").await,
        None
    );
    assert_eq!(b[0].traffic_hits(), 0);
}

#[tokio::test]
async fn a_header_that_stalls_is_cut_at_header_read_timeout() {
    let (b, balancer) = balancer(&format!(
        "{TRUST_LOOPBACK}\nheader_read_timeout = \"200ms\""
    ))
    .await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    stream.write_all(b"PROXY TCP4 192.0.2.7 ").await.unwrap();
    assert!(closes(&mut stream).await, "closed after the timeout");
    assert_eq!(b[0].traffic_hits(), 0);
}

#[tokio::test]
async fn an_untrusted_source_is_served_as_itself_and_cannot_claim_another_address() {
    let (b, balancer) = balancer("proxy_protocol = { trusted = [\"10.0.0.0/8\"] }").await;
    assert_eq!(
        seen_xff(&balancer, b"").await,
        Some((200, Some("127.0.0.1".into())))
    );
    // Its header is not read as one: the bytes are a malformed request.
    let v1 = encode_v1(addr("192.0.2.7:40000"), addr("198.51.100.1:443"));
    let (status, _) = seen_xff(&balancer, &v1).await.expect("an answer");
    assert_eq!(status, 400);
    assert_eq!(b[0].traffic_hits(), 1);
}

#[tokio::test]
async fn the_header_comes_before_the_tls_handshake() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (b, balancer) = balancer(&format!(
        "{TRUST_LOOPBACK}\n{}",
        Pki::listener(&[(&cert, &key)], "")
    ))
    .await;
    let mut tcp = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let v2 = encode_v2(addr("192.0.2.7:40000"), addr("198.51.100.1:443"));
    tcp.write_all(&v2).await.unwrap();
    let mut stream = Client::trusting(&pki)
        .connect_over(tcp, "site.test")
        .await
        .expect("a handshake after the header");
    let (head, _) = get(&mut stream, "site.test").await.expect("an answer");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("x-seen-xff: 192.0.2.7\r\n"), "{head}");
    assert!(head.contains("x-seen-proto: https\r\n"), "{head}");
    assert_eq!(b[0].traffic_hits(), 1);
}
