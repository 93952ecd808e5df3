//! TLS passthrough routed by SNI: real TLS clients (tokio-rustls) through a tcp listener with
//! `[[listeners.sni_routes]]` to TLS backends with certificates of their own. capataz never
//! terminates: the certificate the client verifies is the backend's, which proves the route.
//! Hostile first bytes (not TLS, a ClientHello in tiny records and packets, too large, none, a
//! FIN before the end) are closed or sent to the default pool, and charge no backend.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use capataz_health::State;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::{refused_port, to_end, Greeter};
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::backends_tls::Pki;
use crate::support::balancer::{metrics_text, start};
use crate::support::events::{is_transition, wait_for};
use crate::support::{any, DEADLINE};

/// A TLS backend with a certificate for its names: after the handshake it greets with its
/// name, echoes, and says `bye <name>` once the client's FIN came.
pub(super) struct TlsGreeter {
    pub(super) addr: SocketAddr,
    pub(super) cert: CertificateDer<'static>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TlsGreeter {
    pub(super) async fn start(pki: &Pki, name: &'static str, names: &[&str]) -> TlsGreeter {
        let (chain, key) = pki.leaf(names);
        let cert = chain[0].clone();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(any()).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let _ = tls.write_all(format!("{name}\n").as_bytes()).await;
                    let _ = tls.flush().await;
                    let mut buf = [0; 4096];
                    while let Ok(n @ 1..) = tls.read(&mut buf).await {
                        if tls.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                        let _ = tls.flush().await;
                    }
                    let _ = tls.write_all(format!("bye {name}\n").as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        TlsGreeter {
            addr,
            cert,
            accepted,
            task,
        }
    }

    pub(super) fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TlsGreeter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client config trusting `pki`'s CA, sending records of at most `fragment` bytes.
pub(super) fn client_config(pki: &Pki, fragment: Option<usize>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    let ca = CertificateDer::from_pem_file(pki.ca_file()).expect("the CA");
    roots.add(ca).expect("a CA certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.max_fragment_size = fragment;
    Arc::new(config)
}

/// A connection that writes at most 5 bytes per write (each its own packet: no Nagle).
struct Dribble(TcpStream);

impl AsyncRead for Dribble {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Dribble {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf.len().min(5);
        Pin::new(&mut self.0).poll_write(cx, &buf[..n])
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// A TLS session through `addr` asking for `sni` (an IP address: no SNI sent), the backend's
/// certificate verified for it: the certificate it showed, and everything it sent after
/// `ping\n` and the client's FIN.
async fn session<S>(
    config: Arc<ClientConfig>,
    tcp: S,
    sni: &str,
) -> (CertificateDer<'static>, String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = ServerName::try_from(sni.to_owned()).expect("a server name");
    let connect = TlsConnector::from(config).connect(name, tcp);
    let mut tls = tokio::time::timeout(DEADLINE, connect)
        .await
        .expect("a handshake within the deadline")
        .unwrap_or_else(|e| panic!("the handshake for {sni}: {e}"));
    let shown = tls.get_ref().1.peer_certificates().expect("a certificate")[0].clone();
    tls.write_all(b"ping\n").await.expect("write");
    tls.shutdown().await.expect("FIN");
    let mut all = Vec::new();
    // A TLS close without close_notify is still the end of the bytes.
    let _ = tokio::time::timeout(DEADLINE, tls.read_to_end(&mut all))
        .await
        .expect("the end within the deadline");
    (shown, String::from_utf8_lossy(&all).into_owned())
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    tcp
}

#[tokio::test]
async fn a_tls_client_reaches_the_backend_its_sni_names_and_verifies_that_backends_certificate() {
    let pki = Pki::new("sni");
    let a = TlsGreeter::start(&pki, "a", &["a.test"]).await;
    let b = TlsGreeter::start(&pki, "b", &["b.test", "x.b.test"]).await;
    let d = TlsGreeter::start(&pki, "d", &["127.0.0.1", "other.test"]).await;
    let dir = LogDir::new();
    let log = dir.path("sni.log");
    // Pool b's first backend refuses: its sessions are retried on the other, as any session.
    let dead = refused_port();
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\npool = \"d\"\n{}\n\
         [[listeners.sni_routes]]\nserver_names = [\"A.test\"]\npool = \"a\"\n\
         [[listeners.sni_routes]]\nserver_names = [\"*.b.test\", \"b.test\"]\npool = \"b\"\n\n\
         [pools.a]\nprotocol = \"tcp\"\nactive.kind = \"none\"\n\
         backends = [{{ name = \"a1\", address = \"{}\" }}]\n\n\
         [pools.b]\nprotocol = \"tcp\"\nactive.kind = \"none\"\nbackends = [{{ name = \"b0\", \
         address = \"{}\" }}, {{ name = \"b1\", address = \"{}\" }}]\n\n\
         [pools.d]\nprotocol = \"tcp\"\nactive.kind = \"none\"\n\
         backends = [{{ name = \"d1\", address = \"{}\" }}]\n",
        table(&log, "json", ""),
        a.addr,
        dead.addr,
        b.addr,
        d.addr
    );
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let plain = client_config(&pki, None);
    // (SNI, backend, its certificate, the pool, the route, how the client connects).
    let cases: [(&str, &str, &TlsGreeter, &str, Value, bool); 6] = [
        ("a.test", "a", &a, "a", "a.test".into(), false),
        ("x.b.test", "b", &b, "b", "*.b.test".into(), false),
        ("b.test", "b", &b, "b", "b.test".into(), false),
        ("other.test", "d", &d, "d", Value::Null, false),
        ("127.0.0.1", "d", &d, "d", Value::Null, false),
        // A ClientHello in records of 64 bytes, written 5 bytes at a time.
        ("a.test", "a", &a, "a", "a.test".into(), true),
    ];
    for (n, (sni, name, backend, pool, route, dribbled)) in cases.iter().enumerate() {
        let tcp = connect(addr).await;
        let (shown, said) = if *dribbled {
            session(client_config(&pki, Some(64)), Dribble(tcp), sni).await
        } else {
            session(plain.clone(), tcp, sni).await
        };
        assert!(shown == backend.cert, "{sni}: the certificate of {name}");
        assert_eq!(said, format!("{name}\nping\nbye {name}\n"), "{sni}");
        let line = wait_json(&log, n + 1).await.remove(n);
        let sent = if *sni == "127.0.0.1" {
            Value::Null
        } else {
            Value::from(*sni)
        };
        assert_eq!(line["sni"], sent, "{line}");
        assert_eq!(line["tls_version"], Value::Null, "not terminated: {line}");
        assert_eq!(line["route"], *route, "{line}");
        assert_eq!(line["pool"], *pool, "{line}");
        assert_eq!(line["backend"], format!("{name}1"), "{line}");
        assert_eq!(line["phase"], "-", "{line}");
    }
    assert_eq!((a.accepted(), b.accepted(), d.accepted()), (2, 2, 2));
    // The metrics, by pool as for any session, say what the log says.
    let lines = wait_json(&log, cases.len()).await;
    let page = metrics_text(&balancer);
    for (pool, backend) in [("a", "a1"), ("b", "b1"), ("d", "d1")] {
        let labels = format!("pool=\"{pool}\",backend=\"{backend}\"");
        let value = |name: &str, labels: &str| {
            let prefix = format!("{name}{{{labels}}} ");
            let line = page.lines().find_map(|line| line.strip_prefix(&prefix));
            line.unwrap_or_else(|| panic!("no {prefix}"))
                .trim()
                .parse::<f64>()
                .unwrap()
        };
        assert_eq!(value("capataz_tcp_sessions_total", &labels), 2.0, "{pool}");
        let logged: u64 = lines
            .iter()
            .filter(|line| line["backend"] == backend)
            .map(|line| line["bytes_in"].as_u64().expect("bytes_in"))
            .sum();
        let to_backend = format!("{labels},direction=\"to_backend\"");
        assert_eq!(value("capataz_tcp_bytes_total", &to_backend), logged as f64);
    }
}

/// The first bytes of a real ClientHello for `sni`, as a client sends them.
fn client_hello(pki: &Pki, sni: &str) -> Vec<u8> {
    let name = ServerName::try_from(sni.to_owned()).expect("a server name");
    let mut conn = rustls::ClientConnection::new(client_config(pki, None), name).expect("a client");
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).expect("the ClientHello");
    hello
}

#[tokio::test]
async fn hostile_first_bytes_are_closed_or_sent_to_the_default_and_charge_no_backend() {
    let pki = Pki::new("sni-hostile");
    let a = TlsGreeter::start(&pki, "a", &["a.test"]).await;
    let d = Greeter::start("d").await;
    let dir = LogDir::new();
    let (log, strict_log) = (dir.path("sni.log"), dir.path("strict.log"));
    let routes = "[[listeners.sni_routes]]\nserver_names = [\"a.test\"]\npool = \"a\"\n";
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\npool = \"d\"\n\
         inspect_timeout = \"300ms\"\n{}\n{routes}\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\n{}\n{routes}\n\
         [pools.a]\nprotocol = \"tcp\"\nbackends = [{{ name = \"a1\", address = \"{}\" }}]\n\
         passive.consecutive_errors = 1\nactive.kind = \"none\"\n\n\
         [pools.d]\nprotocol = \"tcp\"\nbackends = [{{ name = \"d1\", address = \"{}\" }}]\n\
         passive.consecutive_errors = 1\nactive.kind = \"none\"\n",
        table(&log, "json", ""),
        table(&strict_log, "json", ""),
        a.addr,
        d.addr
    );
    let (balancer, _) = start(&text).await;
    let (addr, strict) = (balancer.local_addrs()[0], balancer.local_addrs()[1]);
    let logged = |line: &Value, ended_by: &str, reason: Value| {
        assert_eq!(line["ended_by"], ended_by, "{line}");
        assert_eq!(line["phase"], "inspect", "{line}");
        assert_eq!(line["reason"], reason, "{line}");
        assert_eq!(line["pool"], Value::Null, "{line}");
        assert_eq!(line["backend"], Value::Null, "{line}");
    };
    // Not TLS: the default pool gets the bytes exactly as sent.
    let mut client = connect(addr).await;
    client.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    client.shutdown().await.unwrap();
    let all = to_end(&mut client).await.expect("the session's end");
    assert_eq!(
        String::from_utf8_lossy(&all),
        "d\nGET / HTTP/1.0\r\n\r\nbye d\n"
    );
    let line = wait_json(&log, 1).await.remove(0);
    assert_eq!((&line["sni"], &line["route"]), (&Value::Null, &Value::Null));
    assert_eq!(
        (&line["pool"], &line["backend"]),
        (&"d".into(), &"d1".into())
    );
    // Nothing at all: closed at the inspect timeout, no backend connected.
    let mut client = connect(addr).await;
    assert_eq!(to_end(&mut client).await.unwrap_or_default(), b"");
    logged(&wait_json(&log, 2).await[1], "timeout", Value::Null);
    // Half a ClientHello, then a FIN.
    let hello = client_hello(&pki, "a.test");
    let mut client = connect(addr).await;
    client.write_all(&hello[..hello.len() / 2]).await.unwrap();
    client.shutdown().await.unwrap();
    assert_eq!(to_end(&mut client).await.unwrap_or_default(), b"");
    logged(&wait_json(&log, 3).await[2], "client", Value::Null);
    // A handshake record that announces 60000 bytes and sends 32 KiB of them.
    let mut huge = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0xea, 0x60];
    huge.resize(5 + 16384, 0);
    huge.extend_from_slice(&[0x16, 0x03, 0x01, 0x40, 0x00]);
    huge.resize(2 * (5 + 16384), 0);
    let mut client = connect(addr).await;
    // capataz may close (and reset) before it has all.
    let _ = client.write_all(&huge).await;
    let _ = to_end(&mut client).await;
    logged(
        &wait_json(&log, 4).await[3],
        "capataz",
        "client_hello_too_large".into(),
    );
    // No route and no default pool: closed.
    let mut client = connect(strict).await;
    client
        .write_all(&client_hello(&pki, "nope.test"))
        .await
        .unwrap();
    assert_eq!(to_end(&mut client).await.unwrap_or_default(), b"");
    let line = wait_json(&strict_log, 1).await.remove(0);
    logged(&line, "capataz", "no_sni_route".into());
    assert_eq!(line["sni"], "nope.test", "{line}");
    // No backend was reached but the default's, which served, and nothing was charged: a
    // real client still gets through to both.
    assert_eq!((a.accepted(), d.accepted()), (0, 1));
    let (shown, said) = session(client_config(&pki, None), connect(addr).await, "a.test").await;
    assert!(shown == a.cert);
    assert_eq!(said, "a\nping\nbye a\n");
    let mut client = connect(addr).await;
    client.write_all(b"plain\n").await.unwrap();
    client.shutdown().await.unwrap();
    let all = to_end(&mut client).await.expect("the session's end");
    assert_eq!(String::from_utf8_lossy(&all), "d\nplain\nbye d\n");
}

#[tokio::test]
async fn a_routes_pool_with_its_backend_down_closes_the_session_logs_its_route_and_counts_its_client_hello(
) {
    let pki = Pki::new("sni-down");
    let d = TlsGreeter::start(&pki, "d", &["127.0.0.1", "a.test"]).await;
    let dir = LogDir::new();
    let log = dir.path("sni.log");
    // Pool a's only backend refuses: its first session's connect fails, charged, which takes
    // it DOWN; then the pool rejects, and the route never falls back to the default pool.
    let dead = refused_port();
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\npool = \"d\"\n{}\n\
         [[listeners.sni_routes]]\nserver_names = [\"a.test\"]\npool = \"a\"\n\n\
         [pools.a]\nprotocol = \"tcp\"\nactive.kind = \"none\"\npassive.consecutive_errors = 1\n\
         when_all_down = \"reject\"\nbackends = [{{ name = \"a1\", address = \"{}\" }}]\n\n\
         [pools.d]\nprotocol = \"tcp\"\nactive.kind = \"none\"\n\
         backends = [{{ name = \"d1\", address = \"{}\" }}]\n",
        table(&log, "json", ""),
        dead.addr,
        d.addr
    );
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let hello = client_hello(&pki, "a.test");
    for (n, (ended_by, backend, attempts)) in [
        ("backend", Value::from("a1"), 1),
        ("capataz", Value::Null, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let mut client = connect(addr).await;
        client.write_all(&hello).await.unwrap();
        assert_eq!(to_end(&mut client).await.unwrap_or_default(), b"");
        let line = wait_json(&log, n + 1).await.remove(n);
        assert_eq!(
            (&line["sni"], &line["route"]),
            (&"a.test".into(), &"a.test".into())
        );
        assert_eq!(line["pool"], "a", "{line}");
        assert_eq!(line["backend"], backend, "{line}");
        assert_eq!(line["attempts"], attempts, "{line}");
        assert_eq!(line["ended_by"], ended_by, "{line}");
        assert_eq!(line["phase"], "connect", "{line}");
        if n == 0 {
            wait_for(&mut rx, "a1 down", |e| is_transition(e, "a1", State::Down)).await;
        }
    }
    assert_eq!(
        d.accepted(),
        0,
        "a route's session never goes to the default pool"
    );
    // The ClientHellos read are in the log's bytes_in and the listener's bytes received alike.
    let lines = wait_json(&log, 2).await;
    let logged: u64 = lines.iter().map(|l| l["bytes_in"].as_u64().unwrap()).sum();
    assert_eq!(logged, 2 * hello.len() as u64);
    let page = metrics_text(&balancer);
    let received = page
        .lines()
        .find_map(|l| {
            l.strip_prefix("capataz_client_received_bytes_total{listener=\"listener-0\"} ")
        })
        .map(|value| value.trim().parse::<f64>().unwrap());
    assert_eq!(received, Some(logged as f64), "{page}");
}
