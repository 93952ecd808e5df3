//! The reuse check over TLS (`BackendStream::Tls`): an idle session is reusable while nothing
//! but TLS housekeeping arrives (a TLS 1.3 session ticket sent after the handshake), and not
//! once the backend sends `close_notify` or application bytes nobody asked for.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream as ServerTls;

use super::{BackendStream, Transport};
use capataz_tls::backend::{client_config, Alpn, ClientSettings, Connector};

/// A TLS session to a loopback rustls server: the client's end as a backend connection, and
/// the server's end.
async fn session() -> (BackendStream, ServerTls<TcpStream>) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("server config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let accept = async {
        let (tcp, _) = listener.accept().await.expect("accept");
        tokio_rustls::TlsAcceptor::from(Arc::new(server))
            .accept(tcp)
            .await
            .expect("server handshake")
    };
    let roots = Arc::new(rustls::RootCertStore::empty());
    let config = client_config(ClientSettings {
        roots: &roots,
        verify: false,
        identity: None,
        alpn: Alpn::Http11,
    })
    .expect("client config");
    let connector = Connector::new(config.clone(), config, ServerName::from(addr.ip()));
    let connect = async {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        connector.connect(tcp).await.expect("client handshake")
    };
    let (server, client) = tokio::join!(accept, connect);
    (BackendStream::Tls(Box::new(client)), server)
}

/// Waits until `stream` is found unusable, checking every millisecond for at most 20 s.
async fn until_unusable(stream: &mut BackendStream) -> bool {
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < end {
        if !stream.still_open() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    false
}

#[tokio::test]
async fn an_idle_tls_session_stays_reusable_through_session_tickets() {
    let (mut client, _server) = session().await;
    // TLS 1.3 servers send session tickets after the handshake: once they are on the socket,
    // the check reads them and the session is still reusable.
    let BackendStream::Tls(tls) = &client else {
        unreachable!("a TLS session")
    };
    tokio::time::timeout(Duration::from_secs(10), tls.get_ref().0.readable())
        .await
        .expect("the tickets arrive")
        .expect("readable");
    assert!(client.still_open());
    assert!(client.still_open(), "checking twice changes nothing");
}

#[tokio::test]
async fn close_notify_makes_a_tls_session_unusable() {
    let (mut client, mut server) = session().await;
    assert!(client.still_open());
    server.shutdown().await.expect("close_notify");
    assert!(until_unusable(&mut client).await);
}

#[tokio::test]
async fn stray_bytes_make_a_tls_session_unusable() {
    let (mut client, mut server) = session().await;
    server
        .write_all(b"HTTP/1.1 200 OK\r\n\r\n")
        .await
        .expect("write");
    server.flush().await.expect("flush");
    assert!(until_unusable(&mut client).await);
}
