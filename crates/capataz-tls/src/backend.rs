//! capataz as a TLS client of its backends: the rustls client configuration a pool's settings
//! give ([`client_config`]), the name a backend is verified against ([`server_name`]) and the
//! handshake ([`Connector`]).
//!
//! Everything here is built once, when a pool is built (at start, or on a reload on the
//! blocking pool), from material the config loaded off the runtime threads (the CA bundle or
//! the system's roots, the client certificate): no file is read and no root store parsed on
//! the request path. The request path only runs handshakes.
//!
//! - Verification is on by default, against the pool's roots and the backend's name: the
//!   pool's `server_name`, else the backend's host as written in its address when it is a
//!   name, else its IP address (no SNI is sent for an IP, as RFC 6066 says).
//! - `verify = false` accepts any certificate (the handshake's signatures are still checked,
//!   so the session is encrypted, but to whoever answers): it is for tests and labs, and
//!   `capataz check` warns about it.
//! - ALPN offers exactly the protocol the pool speaks: `http/1.1` or `h2`; nothing for a `tcp`
//!   pool's byte streams. A backend that
//!   picks nothing is accepted (many HTTP/1.1 servers do not do ALPN); one that picks another
//!   protocol is refused by rustls during the handshake.
//!
//! The probes' future `https`/`h2`/`grpc` kinds are meant to reuse the same [`Connector`].

use std::io;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The application protocol offered by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// `http/1.1`.
    Http11,
    /// `h2`.
    H2,
    /// Nothing offered: a byte stream whose protocol capataz does not know (a `tcp` pool).
    NotOffered,
}

impl Alpn {
    fn id(self) -> Option<&'static [u8]> {
        match self {
            Alpn::Http11 => Some(b"http/1.1"),
            Alpn::H2 => Some(b"h2"),
            Alpn::NotOffered => None,
        }
    }
}

/// What a pool's TLS settings say, with their material loaded.
#[derive(Clone, Copy, Debug)]
pub struct ClientSettings<'a> {
    /// The trust anchors (ignored when `verify` is false).
    pub roots: &'a Arc<RootCertStore>,
    /// Whether the backend's certificate is verified.
    pub verify: bool,
    /// A client certificate chain and its key, for backends that ask for one.
    pub identity: Option<(&'a [CertificateDer<'static>], &'a PrivateKeyDer<'static>)>,
    /// The protocol offered by ALPN.
    pub alpn: Alpn,
}

/// The rustls client configuration for `settings`, on the ring provider, TLS 1.2 and 1.3.
/// Fails only on a client key the provider cannot use (the config loader checks that first).
pub fn client_config(settings: ClientSettings<'_>) -> Result<Arc<ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = if settings.verify {
        builder.with_root_certificates(settings.roots.clone())
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate { provider }))
    };
    let mut config = match settings.identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain.to_vec(), key.clone_key())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = settings.alpn.id().map(<[u8]>::to_vec).into_iter().collect();
    Ok(Arc::new(config))
}

/// The name a backend at `address` (`host:port` as written) is verified against: `explicit`
/// (the pool's `server_name`) when given, else the host when it is a DNS name, else the IP
/// address. `None` only for an address with no host part the config would have refused.
pub fn server_name(explicit: Option<&str>, address: &str) -> Option<ServerName<'static>> {
    if let Some(name) = explicit {
        return ServerName::try_from(name.to_owned()).ok();
    }
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => address,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = host.strip_suffix('.').unwrap_or(host);
    ServerName::try_from(host.to_owned()).ok()
}

/// `config` with session resumption turned off: every handshake a full one, the backend's
/// certificate verified each time (for probes: a resumed handshake would skip the certificate,
/// so a probe would not see it replaced or expired until the session ticket lapsed).
pub fn without_resumption(config: &Arc<ClientConfig>) -> Arc<ClientConfig> {
    let mut fresh = ClientConfig::clone(config);
    fresh.resumption = rustls::client::Resumption::disabled();
    Arc::new(fresh)
}

/// Runs TLS handshakes with one backend: the traffic's (which resume sessions) and the
/// probes' (full handshakes, see [`without_resumption`]).
#[derive(Clone)]
pub struct Connector {
    config: Arc<ClientConfig>,
    probes: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Handshakes with `name` using `config` for traffic and `probes` for probes.
    pub fn new(
        config: Arc<ClientConfig>,
        probes: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> Connector {
        Connector {
            config,
            probes,
            name,
        }
    }

    /// The TLS handshake over a connected `tcp`. The caller bounds it in time. An error is an
    /// IO error from the socket, or `InvalidData` wrapping rustls's (a bad certificate, a
    /// refused protocol).
    pub async fn connect(&self, tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(self.name.clone(), tcp)
            .await
    }

    /// A probe's TLS handshake over a connected `tcp`: as [`Connector::connect`], but always a
    /// full handshake (no session resumed), so the certificate is verified on every probe.
    pub async fn connect_probe(&self, tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        tokio_rustls::TlsConnector::from(self.probes.clone())
            .connect(self.name.clone(), tcp)
            .await
    }

    /// The protocol the backend agreed to by ALPN, if any.
    pub fn negotiated(stream: &TlsStream<TcpStream>) -> Option<&[u8]> {
        stream.get_ref().1.alpn_protocol()
    }
}

/// `verify = false`: any certificate chain is accepted; handshake signatures are still
/// checked with the provider's algorithms.
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verified_name_comes_from_the_setting_then_the_host() {
        let name =
            |explicit, address| server_name(explicit, address).map(|n| n.to_str().into_owned());
        assert_eq!(
            name(None, "api.internal:443").as_deref(),
            Some("api.internal")
        );
        assert_eq!(
            name(None, "api.internal.:443").as_deref(),
            Some("api.internal")
        );
        assert_eq!(
            name(Some("svc.example"), "10.0.0.1:443").as_deref(),
            Some("svc.example")
        );
        assert_eq!(name(None, "10.0.0.1:443").as_deref(), Some("10.0.0.1"));
        assert_eq!(name(None, "[::1]:443").as_deref(), Some("::1"));
        assert!(matches!(
            server_name(None, "127.0.0.1:8443"),
            Some(ServerName::IpAddress(_))
        ));
    }

    #[test]
    fn alpn_offers_only_the_pools_protocol() {
        let roots = Arc::new(RootCertStore::empty());
        for (alpn, id) in [(Alpn::Http11, &b"http/1.1"[..]), (Alpn::H2, b"h2")] {
            let config = client_config(ClientSettings {
                roots: &roots,
                verify: false,
                identity: None,
                alpn,
            })
            .expect("a config without a client key");
            assert_eq!(config.alpn_protocols, vec![id.to_vec()]);
        }
        let config = client_config(ClientSettings {
            roots: &roots,
            verify: false,
            identity: None,
            alpn: Alpn::NotOffered,
        })
        .expect("a config without a client key");
        assert!(
            config.alpn_protocols.is_empty(),
            "a byte stream offers nothing"
        );
    }
}
