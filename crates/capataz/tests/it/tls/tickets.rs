//! Session tickets end to end, with a rustls client that keeps its tickets between
//! connections: a session resumes within the ticket lifetime and across a reload that keeps
//! the ticket settings; a ticket older than `session_ticket_lifetime` is refused even when
//! the client still offers it; `session_tickets = false` leaves resumption to the listener's
//! own cache, which a reload empties.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz::config;
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::time_provider::TimeProvider;
use rustls::{ClientConfig, HandshakeKind, NamedGroup, RootCertStore};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use super::*;
use crate::support::wait::wait_until;

/// A client's ticket store that counts the TLS 1.3 tickets it is given and those it offers.
#[derive(Debug)]
struct Counted {
    inner: ClientSessionMemoryCache,
    received: AtomicUsize,
    offered: AtomicUsize,
}

impl ClientSessionStore for Counted {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.inner.set_kx_hint(server_name, group)
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.inner.kx_hint(server_name)
    }

    fn set_tls12_session(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(server_name, value)
    }

    fn tls12_session(
        &self,
        server_name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.inner.remove_tls12_session(server_name)
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.received.fetch_add(1, Ordering::Relaxed);
        self.inner.insert_tls13_ticket(server_name, value)
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        let ticket = self.inner.take_tls13_ticket(server_name);
        if ticket.is_some() {
            self.offered.fetch_add(1, Ordering::Relaxed);
        }
        ticket
    }
}

/// A clock stopped at one instant: a client on it takes every ticket for fresh (a client's
/// own expiry check is by the lifetime the server told it) and offers it whatever its age.
#[derive(Debug)]
struct Stopped(UnixTime);

impl TimeProvider for Stopped {
    fn current_time(&self) -> Option<UnixTime> {
        Some(self.0)
    }
}

/// A TLS 1.3 client that resumes: its tickets kept from one connection to the next.
struct Resuming {
    connector: TlsConnector,
    store: Arc<Counted>,
    /// When the last ticket arrived (at the latest): a ticket is at least this old.
    last_ticket: Option<Instant>,
}

impl Resuming {
    /// On the system clock, or on one stopped now (`stopped`).
    fn new(pki: &Pki, stopped: bool) -> Resuming {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(pki.ca_path()).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = if stopped {
            ClientConfig::builder_with_details(provider, Arc::new(Stopped(UnixTime::now())))
        } else {
            ClientConfig::builder_with_provider(provider)
        };
        let mut config = builder
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let store = Arc::new(Counted {
            inner: ClientSessionMemoryCache::new(32),
            received: AtomicUsize::new(0),
            offered: AtomicUsize::new(0),
        });
        config.resumption = Resumption::store(store.clone());
        Resuming {
            connector: TlsConnector::from(Arc::new(config)),
            store,
            last_ticket: None,
        }
    }

    /// A connection to `addr` and one request on it (which brings the tickets the server
    /// sends after the handshake): whether the handshake resumed a session, and whether this
    /// client offered a ticket for it.
    async fn visit(&mut self, addr: std::net::SocketAddr) -> (HandshakeKind, bool) {
        let offered = self.store.offered.load(Ordering::Relaxed);
        let received = self.store.received.load(Ordering::Relaxed);
        let visit = async {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("site.test").unwrap();
            let mut stream = self.connector.connect(name, tcp).await.expect("handshake");
            let (head, _) = get(&mut stream, "site.test").await.expect("answered");
            assert!(head.starts_with("http/1.1 200"), "{head}");
            stream.get_ref().1.handshake_kind().expect("handshake done")
        };
        let kind = tokio::time::timeout(DEADLINE, visit)
            .await
            .expect("visited in time");
        assert!(
            self.store.received.load(Ordering::Relaxed) > received,
            "the server sent no ticket"
        );
        self.last_ticket = Some(Instant::now());
        (kind, self.store.offered.load(Ordering::Relaxed) > offered)
    }
}

/// A balancer started from a config file in `pki`'s directory (so that it can reload it),
/// with `lines` in its TLS table.
async fn from_file(pki: &Pki, backend: &SimBackend, lines: &str) -> Balancer {
    write_config(pki, backend, lines);
    start_from_file(pki).await
}

/// A balancer started from the config file in `pki`'s directory, which it reloads from.
async fn start_from_file(pki: &Pki) -> Balancer {
    let path = pki.dir.join("capataz.toml");
    let config = config::load(&path).expect("valid");
    let (events, _) = tokio::sync::broadcast::channel(64);
    Balancer::start_with_path(&config, events, Some(path))
        .await
        .expect("starts")
}

/// `capataz_tls_resumed_handshakes_total` of the test listener.
fn resumed(balancer: &Balancer) -> f64 {
    let series = "capataz_tls_resumed_handshakes_total{listener=\"listener-0\"}";
    metric(balancer, series).expect("the listener's series exists")
}

fn write_config(pki: &Pki, backend: &SimBackend, lines: &str) {
    let text = ConfigText::sims(std::slice::from_ref(backend))
        .listener(&format!(
            "[listeners.tls]\ncertificates = [{{ cert = \"site.pem\", key = \"site.key\" }}]\n\
             {lines}\n"
        ))
        .build();
    std::fs::write(pki.dir.join("capataz.toml"), text).unwrap();
}

#[tokio::test]
async fn a_session_resumes_by_ticket_across_a_reload_that_keeps_the_ticket_settings() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let b = backends(&["a"]).await;
    let lines = "session_ticket_lifetime = \"300s\"";
    let balancer = from_file(&pki, &b[0], lines).await;
    let addr = balancer.local_addrs()[0];
    let mut client = Resuming::new(&pki, false);
    assert_eq!(client.visit(addr).await, (HandshakeKind::Full, false));
    assert_eq!(client.visit(addr).await, (HandshakeKind::Resumed, true));

    // The same file again: the keys stay, and so do the sessions.
    let reload = balancer.supervisor().reload_from_file();
    reload.await.expect("the reload applies");
    assert_eq!(
        client.visit(addr).await,
        (HandshakeKind::Resumed, true),
        "a ticket issued before the reload resumes after it"
    );

    // Another lifetime: new keys, so the ticket offered is refused and the handshake is full.
    write_config(&pki, &b[0], "session_ticket_lifetime = \"600s\"");
    let reload = balancer.supervisor().reload_from_file();
    reload.await.expect("the reload applies");
    assert_eq!(client.visit(addr).await, (HandshakeKind::Full, true));
    assert_eq!(client.visit(addr).await, (HandshakeKind::Resumed, true));
    // What capataz counts is what the client saw.
    assert_eq!(resumed(&balancer), 3.0);
}

#[tokio::test]
async fn a_reload_that_changes_the_client_cas_starts_new_ticket_keys() {
    // A session resumed from a ticket keeps the client certificate it was verified with: new
    // client CAs must not let a session verified under the old ones through.
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    std::fs::copy(pki.ca_path(), pki.dir.join("clients.pem")).unwrap();
    let b = backends(&["a"]).await;
    let lines = "client_ca = \"clients.pem\"\nclient_auth = \"optional\"";
    let balancer = from_file(&pki, &b[0], lines).await;
    let addr = balancer.local_addrs()[0];
    let mut client = Resuming::new(&pki, false);
    assert_eq!(client.visit(addr).await, (HandshakeKind::Full, false));
    let reload = balancer.supervisor().reload_from_file();
    reload.await.expect("the reload applies");
    assert_eq!(
        client.visit(addr).await,
        (HandshakeKind::Resumed, true),
        "the same client CAs: the keys are kept"
    );

    // The same path, another CA in it.
    let other = Pki::new();
    std::fs::copy(other.ca_path(), pki.dir.join("clients.pem")).unwrap();
    let reload = balancer.supervisor().reload_from_file();
    reload.await.expect("the reload applies");
    assert_eq!(client.visit(addr).await, (HandshakeKind::Full, true));
}

#[tokio::test]
async fn a_ticket_older_than_session_ticket_lifetime_is_refused_though_the_client_offers_it() {
    // The one real wait of this file: a ticket must grow older than its lifetime on the
    // server's clock, so the lifetime is the shortest allowed above the test's own pace (2s;
    // the client's two first visits must fall within it) and the wait is until that lifetime
    // has passed since the last ticket arrived: a deadline, not a guess.
    const LIFETIME: Duration = Duration::from_secs(2);
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let b = backends(&["a"]).await;
    let balancer = from_file(&pki, &b[0], "session_ticket_lifetime = \"2s\"").await;
    let addr = balancer.local_addrs()[0];
    let mut client = Resuming::new(&pki, true);
    assert_eq!(client.visit(addr).await, (HandshakeKind::Full, false));
    assert_eq!(
        client.visit(addr).await,
        (HandshakeKind::Resumed, true),
        "a ticket resumes within its lifetime"
    );

    let last = client.last_ticket.expect("tickets arrived");
    tokio::time::sleep_until(last + LIFETIME).await;
    assert_eq!(
        client.visit(addr).await,
        (HandshakeKind::Full, true),
        "a ticket older than its lifetime was offered and refused"
    );
    // The listener still issues tickets, and the new one resumes.
    assert_eq!(client.visit(addr).await, (HandshakeKind::Resumed, true));
    assert_eq!(resumed(&balancer), 2.0);
}

#[tokio::test]
async fn with_session_tickets_off_sessions_resume_from_the_listeners_cache_which_a_reload_empties()
{
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let b = backends(&["a"]).await;
    let balancer = from_file(&pki, &b[0], "session_tickets = false").await;
    let addr = balancer.local_addrs()[0];
    let mut client = Resuming::new(&pki, false);
    assert_eq!(client.visit(addr).await, (HandshakeKind::Full, false));
    // TLS 1.3 sends a handle on the server's cache in a ticket message: it resumes while the
    // cache holds the session.
    assert_eq!(client.visit(addr).await, (HandshakeKind::Resumed, true));

    // Nothing of the session left with the client: the reload's new cache does not have it,
    // where a ticket kept across the same reload resumes (the test above).
    let reload = balancer.supervisor().reload_from_file();
    reload.await.expect("the reload applies");
    assert_eq!(client.visit(addr).await, (HandshakeKind::Full, true));
    assert_eq!(
        resumed(&balancer),
        1.0,
        "the resumption from the cache is counted"
    );
}

/// A server certificate verifier that counts the certificates it verifies: a full handshake
/// has one, a resumed one none (the session was authenticated when the ticket was issued).
#[derive(Debug)]
struct Verified {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    count: AtomicUsize,
}

impl rustls::client::danger::ServerCertVerifier for Verified {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[tokio::test]
async fn an_http3_session_resumes_by_the_listeners_ticket_across_a_reload() {
    use crate::support::h3client::connect_with;
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let b = backends(&["a"]).await;
    let lines = "session_ticket_lifetime = \"300s\"\n[listeners.tls.http3]";
    let balancer = from_file(&pki, &b[0], lines).await;
    // HTTP/3 is on the listener's port, over UDP.
    let addr = balancer.local_addrs()[0];

    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.ca_path()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verified = Arc::new(Verified {
        inner: rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap(),
        count: AtomicUsize::new(0),
    });
    let store = Arc::new(Counted {
        inner: ClientSessionMemoryCache::new(32),
        received: AtomicUsize::new(0),
        offered: AtomicUsize::new(0),
    });
    let mut tls = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verified.clone())
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.resumption = Resumption::store(store.clone());
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls)).unwrap();
    let config = quinn::ClientConfig::new(Arc::new(quic));

    // One request on a new connection, once the tickets it brings have arrived: the server
    // certificates verified and the tickets offered so far.
    let visit = || async {
        let received = store.received.load(Ordering::Relaxed);
        let mut client = connect_with(config.clone(), addr, "site.test")
            .await
            .expect("QUIC handshake");
        let answer = client.get("site.test", "/").await.expect("answered");
        assert_eq!(answer.head.status(), 200);
        wait_until("the connection's tickets arrive", || {
            store.received.load(Ordering::Relaxed) > received
        })
        .await;
        client.connection.close(0u32.into(), b"done");
        (
            verified.count.load(Ordering::Relaxed),
            store.offered.load(Ordering::Relaxed),
        )
    };
    assert_eq!(visit().await, (1, 0), "a full handshake");
    assert_eq!(visit().await, (1, 1), "resumed: no certificate to verify");
    let reload = balancer.supervisor().reload_from_file();
    reload.await.expect("the reload applies");
    assert_eq!(visit().await, (1, 2), "resumed after the reload too");
}

/// Two TLS listeners on `127.0.0.1:0`, named `names` in that order, with the same certificate.
fn write_two_tls_listeners(pki: &Pki, backend: &SimBackend, names: &[&str]) {
    let mut text = String::new();
    for name in names {
        text += &format!(
            "[[listeners]]\nname = \"{name}\"\naddress = \"127.0.0.1:0\"\n\
             [listeners.tls]\ncertificates = [{{ cert = \"site.pem\", key = \"site.key\" }}]\n\
             [[listeners.routes]]\npool = \"p\"\n\n"
        );
    }
    text += &format!(
        "[pools.p]\nbackends = [{{ name = \"{}\", address = \"{}\" }}]\n",
        backend.name(),
        backend.addr()
    );
    std::fs::write(pki.dir.join("capataz.toml"), text).unwrap();
}

/// Regression: a reload gave each TLS listener the ticket keys of the first running listener
/// on its address, so two listeners on `127.0.0.1:0` swapped in the file took each other's
/// keys (while each kept its own socket) and tickets stopped resuming.
#[tokio::test]
async fn two_tls_listeners_on_port_zero_swapped_in_the_file_keep_their_own_ticket_keys() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let b = backends(&["a"]).await;
    write_two_tls_listeners(&pki, &b[0], &["first", "second"]);
    let balancer = start_from_file(&pki).await;
    let second = balancer.local_addrs()[1];
    let mut client = Resuming::new(&pki, false);
    assert_eq!(client.visit(second).await, (HandshakeKind::Full, false));
    assert_eq!(client.visit(second).await, (HandshakeKind::Resumed, true));

    write_two_tls_listeners(&pki, &b[0], &["second", "first"]);
    let reload = balancer.supervisor().reload_from_file();
    reload.await.expect("the reload applies");
    assert!(
        balancer.local_addrs().contains(&second),
        "the socket is kept"
    );
    assert_eq!(
        client.visit(second).await,
        (HandshakeKind::Resumed, true),
        "the listener kept its own keys, so its ticket resumes"
    );
}
