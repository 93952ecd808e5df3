//! PROXY protocol sent to backends (`send_proxy_protocol`): each backend connection starts
//! with a header naming the client (the bytes checked), is only reused by that client
//! connection, passes on a client a trusted proxy named, and probes send a LOCAL / UNKNOWN
//! header; HTTP/2 pools and shared reuse refuse the option.

use std::net::SocketAddr;

use capataz::config;
use capataz::server::Balancer;
use capataz_proxy_protocol::{encode_local, encode_v1, encode_v2, Version};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::backends_tls::Pki;
use crate::support::balancer::{start, ConfigText};
use crate::support::client::Client;
use crate::support::proxied::ProxiedBackend;
use crate::support::raw::read_reply;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

async fn balancer(backend: &ProxiedBackend, listener: &str, pool: &str) -> Balancer {
    let text = ConfigText::new(&[("b".into(), backend.addr)])
        .listener(listener)
        .extra(pool)
        .build();
    start(&text).await.0
}

/// Sends `GET target` on `stream` (after `prefix`) and reads the answer's status.
async fn get(stream: &mut TcpStream, prefix: &[u8], target: &str) -> u16 {
    let request = format!("GET {target} HTTP/1.1\r\nHost: app.test\r\n\r\n");
    stream
        .write_all(&[prefix, request.as_bytes()].concat())
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(DEADLINE, read_reply(stream, &mut buf))
        .await
        .expect("an answer within the deadline")
        .expect("an answer")
        .status
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

const NO_PROBES: &str = "send_proxy_protocol = \"v1\"\n[pools.web.active]\nkind = \"none\"\n";

#[tokio::test]
async fn each_backend_connection_starts_with_a_v1_line_naming_its_one_client_connection() {
    let backend = ProxiedBackend::start().await;
    let balancer = balancer(&backend, "", NO_PROBES).await;
    let listener = balancer.local_addrs()[0];
    let mut first = TcpStream::connect(listener).await.unwrap();
    let mut second = TcpStream::connect(listener).await.unwrap();
    assert_eq!(get(&mut first, b"", "/a").await, 200);
    assert_eq!(get(&mut second, b"", "/x").await, 200);
    assert_eq!(get(&mut first, b"", "/b").await, 200);
    assert_eq!(get(&mut second, b"", "/y").await, 200);
    let line = |client: &TcpStream| {
        let port = client.local_addr().unwrap().port();
        format!(
            "PROXY TCP4 127.0.0.1 127.0.0.1 {port} {}\r\n",
            listener.port()
        )
        .into_bytes()
    };
    // One backend connection per client connection, each with its own client's header once,
    // then that client's requests only.
    let traffic = backend.traffic();
    assert_eq!(traffic.len(), 2, "{traffic:?}");
    assert!(traffic.iter().all(|s| s.valid));
    assert_eq!(traffic[0].header, line(&first));
    assert_eq!(traffic[0].requests, ["/a", "/b"]);
    assert_eq!(traffic[1].header, line(&second));
    assert_eq!(traffic[1].requests, ["/x", "/y"]);
    // A new client connection, even from the same address, gets a backend connection of its
    // own.
    let mut third = TcpStream::connect(listener).await.unwrap();
    assert_eq!(get(&mut third, b"", "/c").await, 200);
    let traffic = backend.traffic();
    assert_eq!(traffic.len(), 3, "{traffic:?}");
    assert_eq!(traffic[2].header, line(&third));
    assert_eq!(traffic[2].requests, ["/c"]);
}

#[tokio::test]
async fn a_v2_header_passes_on_the_client_a_trusted_proxy_named() {
    let backend = ProxiedBackend::start().await;
    let balancer = balancer(
        &backend,
        "proxy_protocol = { trusted = [\"127.0.0.0/8\"] }",
        "send_proxy_protocol = \"v2\"\n[pools.web.active]\nkind = \"none\"\n",
    )
    .await;
    let (client, destination) = (addr("192.0.2.7:40000"), addr("[2001:db8::1]:443"));
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    assert_eq!(
        get(&mut stream, &encode_v1(client, destination), "/a").await,
        200
    );
    let traffic = backend.traffic();
    assert_eq!(traffic.len(), 1, "{traffic:?}");
    // Mixed families: IPv6, the client's IPv4 address mapped.
    assert_eq!(traffic[0].header, encode_v2(client, destination));
    assert_eq!(traffic[0].header[13], 0x21, "TCP over IPv6");
    assert_eq!(traffic[0].requests, ["/a"]);
}

#[tokio::test]
async fn the_header_comes_before_the_tls_handshake_to_a_tls_pool() {
    let pki = Pki::new("send-proxy");
    let backend = ProxiedBackend::start_tls(pki.server(&["127.0.0.1"], &[])).await;
    let pool = format!(
        "send_proxy_protocol = \"v2\"\ntls = {{ ca_file = \"{}\" }}\n[pools.web.active]\nkind = \"none\"\n",
        pki.ca_file()
    );
    let balancer = balancer(&backend, "", &pool).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    assert_eq!(client.get("/tls").await.status, 200);
    let traffic = backend.traffic();
    assert_eq!(traffic.len(), 1, "{traffic:?}");
    assert!(traffic[0].valid);
    // v2, PROXY command, TCP over IPv4, from the client to the listener.
    assert_eq!(&traffic[0].header[12..14], &[0x21, 0x11]);
    assert_eq!(&traffic[0].header[16..20], &[127, 0, 0, 1]);
    let listener_port = balancer.local_addrs()[0].port().to_be_bytes();
    assert_eq!(&traffic[0].header[26..28], &listener_port);
    assert_eq!(traffic[0].requests, ["/tls"]);
}

#[tokio::test]
async fn probes_send_a_local_header_in_v2_and_unknown_in_v1() {
    for (version, kind) in [(Version::V2, "http"), (Version::V1, "tcp")] {
        let backend = ProxiedBackend::start().await;
        let name = match version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        };
        let pool = format!(
            "send_proxy_protocol = \"{name}\"\n[pools.web.active]\nkind = \"{kind}\"\n\
             path = \"/healthz\"\ninterval = \"100ms\"\ntimeout = \"1s\"\n"
        );
        let _balancer = balancer(&backend, "", &pool).await;
        wait_until("two probes", || backend.seen().len() >= 2).await;
        for seen in backend.seen().iter().take(2) {
            assert!(seen.valid, "{seen:?}");
            assert_eq!(seen.header, encode_local(version));
        }
        if kind == "http" {
            wait_until("a probe's request", || {
                backend.seen().iter().any(|s| s.requests == ["/healthz"])
            })
            .await;
        }
    }
    assert_eq!(encode_local(Version::V1), b"PROXY UNKNOWN\r\n");
}

#[test]
fn http2_pools_and_shared_reuse_refuse_send_proxy_protocol() {
    let pool = |extra: &str| {
        format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.web]\n\
             backends = [{{ name = \"b\", address = \"127.0.0.1:9\" }}]\n\
             send_proxy_protocol = \"v2\"\n{extra}\n"
        )
    };
    for (extra, says) in [
        (
            "protocol = \"h2c\"",
            "HTTP/2 backend connection carries many clients",
        ),
        (
            "protocol = \"h2\"",
            "HTTP/2 backend connection carries many clients",
        ),
        (
            "connection_reuse = \"shared\"",
            "connection_reuse = \"shared\" lets any client",
        ),
    ] {
        let error = config::parse_str(&pool(extra), "<test>")
            .expect_err(extra)
            .to_string();
        assert!(error.contains("pools.web.send_proxy_protocol"), "{error}");
        assert!(error.contains(says), "{error}");
    }
    let error = config::parse_str(&pool("").replace("\"v2\"", "\"v3\""), "<test>")
        .expect_err("v3")
        .to_string();
    assert!(
        error.contains("send_proxy_protocol") || error.contains("v3"),
        "{error}"
    );
    assert!(config::parse_str(&pool(""), "<test>").is_ok());
}
