//! A listener's rustls server configuration: its certificates chosen by SNI, its versions,
//! ALPN and client-certificate verification, loaded whole or not at all.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};
use tokio_rustls::TlsAcceptor;

use super::acme::{AcmeCerts, AcmeSettings, Challenge, ACME_TLS_ALPN};
use super::ocsp::{self, Refusal};
use super::staple::{OcspFetch, StapleSlot};
use super::tickets::TicketKeys;
use super::TlsInfo;
use super::{read_certificates, read_key, x509, Alpn, ClientAuth, LoadError, MinVersion, Part};

/// One certificate chain and its key, as PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateSource {
    /// The chain: the server's certificate first, then intermediates.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// A DER OCSP response to staple as is (`ocsp_response`), checked when loaded.
    pub ocsp_response: Option<PathBuf>,
}

/// What a listener's TLS is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSettings {
    /// The certificates; at least one unless `acme` is set.
    pub certificates: Vec<CertificateSource>,
    /// The index of the one served when SNI matches no other (or is absent).
    pub default: usize,
    /// The lowest version accepted.
    pub min_version: MinVersion,
    /// The protocols configured for ALPN, in preference order.
    pub alpn: Vec<Alpn>,
    /// The CA bundle client certificates are verified against, and whether one is required.
    pub client_ca: Option<(PathBuf, ClientAuth)>,
    /// Certificates obtained by ACME (`[listeners.tls.acme]`), beside the static ones.
    pub acme: Option<AcmeSettings>,
    /// Whether the runtime fetches and staples the OCSP response of each static certificate
    /// without an `ocsp_response` file and of each certificate ACME issues (`ocsp_fetch`).
    pub ocsp_fetch: bool,
    /// How long a session ticket is accepted (`session_ticket_lifetime`); `None`: no tickets
    /// (`session_tickets = false`), sessions resume from the server-side cache only.
    pub session_tickets: Option<Duration>,
}

/// Facts about one loaded certificate, for the expiry warning and metric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    /// The chain's file, as it was opened.
    pub file: PathBuf,
    /// Its subjectAltName DNS names, lowercase.
    pub names: Vec<String>,
    /// Its `notAfter`, in seconds since the Unix epoch.
    pub not_after: i64,
    /// The whole chain, DER, so that two loads of the same files compare equal.
    chain: Vec<Vec<u8>>,
}

impl CertificateInfo {
    pub(super) fn new(
        file: PathBuf,
        names: Vec<String>,
        not_after: i64,
        chain: &[rustls::pki_types::CertificateDer<'_>],
    ) -> CertificateInfo {
        CertificateInfo {
            file,
            names,
            not_after,
            chain: chain.iter().map(|c| c.to_vec()).collect(),
        }
    }
}

/// A listener's TLS, loaded: the acceptor for new connections and what was loaded. A clone
/// (one per accepted connection) costs two reference counts.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
    certificates: Arc<[CertificateInfo]>,
    acme: Option<Arc<AcmeCerts>>,
    acme_note: Option<String>,
    /// The static certificates whose OCSP responses the runtime fetches.
    ocsp_fetches: Arc<[OcspFetch]>,
    /// Whether the runtime fetches the OCSP responses of ACME's certificates (`ocsp_fetch`).
    acme_ocsp_fetch: bool,
    /// What the load has to say about stapling (a response file not stapled, a certificate
    /// whose response cannot be fetched), for the log when the listener starts.
    ocsp_notes: Arc<[String]>,
    /// The session ticket keys, unless tickets are off.
    tickets: Option<Arc<TicketKeys>>,
    /// The client CA certificates (DER) and whether one is required: a reload keeps the
    /// ticket keys only if these are the same, so that no session resumes past a change of
    /// who may authenticate.
    client_trust: Option<(Arc<[Vec<u8>]>, ClientAuth)>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("certificates", &self.certificates)
            .finish_non_exhaustive()
    }
}

/// Two loads are equal when they hold the same certificates (the keys were checked to match
/// them); the settings are compared by whoever holds them.
impl PartialEq for ServerTls {
    fn eq(&self, other: &ServerTls) -> bool {
        self.certificates == other.certificates
            && self.acme.as_ref().map(|a| a.settings()) == other.acme.as_ref().map(|a| a.settings())
    }
}

impl ServerSettings {
    /// The protocols advertised by ALPN: the configured ones the listener serves
    /// ([`Alpn::served`]), in the configured order.
    pub fn alpn(&self) -> Vec<Vec<u8>> {
        self.alpn
            .iter()
            .filter(|p| p.served())
            .map(|p| p.id().to_vec())
            .collect()
    }

    /// Reads every file and builds the server configuration. `now` (Unix seconds) is when a
    /// certificate counts as expired. Blocks on file IO: call it off the runtime threads.
    pub fn load(&self, now: i64) -> Result<ServerTls, LoadError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut keys = Vec::with_capacity(self.certificates.len());
        let mut certificates = Vec::with_capacity(self.certificates.len());
        let mut ocsp_fetches = Vec::new();
        let mut ocsp_notes = Vec::new();
        for (index, source) in self.certificates.iter().enumerate() {
            let (key, info) = load_one(index, source, &provider, now)?;
            let slot = Arc::new(StapleSlot::new(key));
            match &source.ocsp_response {
                Some(file) => {
                    if let Some(note) = staple_file(index, file, &slot, now)? {
                        ocsp_notes.push(note);
                    }
                }
                None if self.ocsp_fetch => {
                    match OcspFetch::new(source.cert.clone(), slot.clone()) {
                        Ok(fetch) => ocsp_fetches.push(fetch),
                        Err(note) => ocsp_notes.push(note.to_string()),
                    }
                }
                None => {}
            }
            keys.push(slot);
            certificates.push(info);
        }
        let (acme, acme_note) = match &self.acme {
            None => (None, None),
            Some(settings) => {
                if let Some(ca) = &settings.ca_file {
                    // Read now so a wrong path fails the load, not the first order.
                    read_certificates(Part::AcmeCaFile, ca)?;
                }
                let (certs, note) = AcmeCerts::load(settings.clone(), now);
                (Some(Arc::new(certs)), note)
            }
        };
        let mut resolver = SniResolver::new(keys, &certificates, self.default);
        resolver.acme = acme.clone();
        let versions: &[&'static SupportedProtocolVersion] = match self.min_version {
            MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            MinVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let internal = |part: Part, file: &PathBuf, error: rustls::Error| LoadError {
            part,
            file: file.clone(),
            message: format!("cannot be used: {error}"),
        };
        let acme_storage = self.acme.as_ref().map(|a| a.storage.clone());
        let Some(first) = self
            .certificates
            .first()
            .map(|c| &c.cert)
            .or(acme_storage.as_ref())
        else {
            return Err(LoadError {
                part: Part::Certificate(0),
                file: PathBuf::new(),
                message: "no certificate is configured (add one)".into(),
            });
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| internal(Part::Certificate(0), first, e))?;
        let mut client_trust = None;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some((file, auth)) => {
                let error = |message: String| LoadError {
                    part: Part::ClientCa,
                    file: file.clone(),
                    message,
                };
                let mut roots = RootCertStore::empty();
                let read = read_certificates(Part::ClientCa, file)?;
                client_trust = Some((read.iter().map(|c| c.to_vec()).collect(), *auth));
                let (added, ignored) = roots.add_parsable_certificates(read);
                if added == 0 {
                    return Err(error(format!(
                        "holds no usable CA certificate ({ignored} could not be parsed)"
                    )));
                }
                let mut verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                if *auth == ClientAuth::Optional {
                    verifier = verifier.allow_unauthenticated();
                }
                let verifier = verifier
                    .build()
                    .map_err(|e| error(format!("cannot verify clients with it: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = self.alpn();
        if self
            .acme
            .as_ref()
            .is_some_and(|a| a.challenge == Challenge::TlsAlpn01)
        {
            // Last: only an ACME validator offers it, and the resolver answers it with the
            // challenge certificate alone.
            config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
        }
        // The server's order of cipher suites (AES-256-GCM, AES-128-GCM, then
        // ChaCha20-Poly1305), not the client's, as HAProxy and nginx are usually set up
        // (`prefer-server-ciphers`).
        config.ignore_client_order = true;
        let tickets = TicketKeys::install(&mut config, self.session_tickets)?;
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            certificates: certificates.into(),
            acme,
            acme_note,
            ocsp_fetches: ocsp_fetches.into(),
            acme_ocsp_fetch: self.ocsp_fetch,
            ocsp_notes: ocsp_notes.into(),
            tickets,
            client_trust,
        })
    }
}

/// The largest OCSP response file read: 1 MiB (a response is a few KiB).
const MAX_OCSP_FILE: u64 = 1 << 20;

/// Staples the response in `file` on `slot` if it passes the checks at `now`. A file that is
/// not an OCSP response for the certificate is an error; a good one that is stale or not yet
/// valid, or one saying the certificate is revoked or unknown, is not stapled and is returned
/// as a note (a reload with a fresh file staples it).
fn staple_file(
    index: usize,
    file: &std::path::Path,
    slot: &StapleSlot,
    now: i64,
) -> Result<Option<String>, LoadError> {
    use std::io::Read as _;
    let error = |message: String| LoadError {
        part: Part::OcspResponse(index),
        file: file.to_owned(),
        message,
    };
    let mut der = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_OCSP_FILE + 1).read_to_end(&mut der))
        .map_err(|e| {
            error(format!(
                "cannot read it: {e} (check the path and its permissions)"
            ))
        })?;
    if der.len() as u64 > MAX_OCSP_FILE {
        return Err(error(format!(
            "larger than {} MiB, which no OCSP response is (is it the right file?)",
            MAX_OCSP_FILE >> 20
        )));
    }
    let chain = slot.chain();
    let Some(leaf) = chain.first() else {
        return Ok(None);
    };
    match ocsp::check(&der, leaf, chain.get(1), now) {
        Ok(checked) => {
            slot.staple(der, checked.until);
            Ok(None)
        }
        Err(
            why @ (Refusal::Revoked | Refusal::Unknown | Refusal::NotYetValid | Refusal::Stale(_)),
        ) => Ok(Some(format!(
            "{}: not stapled: {why} (write a fresh response and reload)",
            file.display()
        ))),
        Err(why) => Err(error(format!(
            "is not an OCSP response to staple for the certificate in certificates[{index}]: \
             {why} (give the DER response of that certificate, e.g. from openssl ocsp -respout)"
        ))),
    }
}

/// Loads `certificates[index]`: chain, key, that they match, and that it has not expired.
fn load_one(
    index: usize,
    source: &CertificateSource,
    provider: &CryptoProvider,
    now: i64,
) -> Result<(CertifiedKey, CertificateInfo), LoadError> {
    let chain = read_certificates(Part::Certificate(index), &source.cert)?;
    let cert_error = |message: String| LoadError {
        part: Part::Certificate(index),
        file: source.cert.clone(),
        message,
    };
    let key_error = |message: String| LoadError {
        part: Part::Key(index),
        file: source.key.clone(),
        message,
    };
    let facts = x509::read(&chain[0]).map_err(|e| {
        cert_error(format!(
            "its first certificate is not a readable X.509 certificate ({e})"
        ))
    })?;
    if facts.not_after <= now {
        return Err(cert_error(format!(
            "the certificate expired on {} (renew it)",
            date(facts.not_after)
        )));
    }
    let key = read_key(Part::Key(index), &source.key)?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| key_error(format!("is not a usable private key: {e}")))?;
    let certified = CertifiedKey::new(chain.clone(), signing);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(key_error(format!(
                "does not match the certificate in {} (give the key the certificate was issued \
                 for)",
                source.cert.display()
            )))
        }
        Err(e) => {
            return Err(key_error(format!(
                "cannot be checked against the certificate in {}: {e}",
                source.cert.display()
            )))
        }
    }
    let info = CertificateInfo {
        file: source.cert.clone(),
        names: facts.dns_names,
        not_after: facts.not_after,
        chain: chain.iter().map(|c| c.to_vec()).collect(),
    };
    Ok((certified, info))
}

/// `unix` seconds as an RFC 3339 date and time.
pub fn date(unix: i64) -> String {
    let time = if unix >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix as u64)
    } else {
        UNIX_EPOCH
    };
    capataz_timefmt::rfc3339(time)
}

impl ServerTls {
    /// The certificates loaded, in configuration order.
    pub fn certificates(&self) -> &[CertificateInfo] {
        &self.certificates
    }

    /// The ACME slot of the listener, when `[listeners.tls.acme]` is set.
    pub fn acme(&self) -> Option<&Arc<AcmeCerts>> {
        self.acme.as_ref()
    }

    /// Why the stored ACME certificate is not served (unreadable, expired, other names), if
    /// one exists but is not.
    pub fn acme_note(&self) -> Option<&str> {
        self.acme_note.as_deref()
    }

    /// The static certificates whose OCSP responses the runtime fetches (`ocsp_fetch`).
    pub fn ocsp_fetches(&self) -> &[OcspFetch] {
        &self.ocsp_fetches
    }

    /// The ACME slot, when the runtime fetches the OCSP response of each certificate ACME
    /// puts in force (`ocsp_fetch` with `[listeners.tls.acme]`).
    pub fn acme_stapled(&self) -> Option<&Arc<AcmeCerts>> {
        self.acme.as_ref().filter(|_| self.acme_ocsp_fetch)
    }

    /// What the load noted about stapling, for the log: response files not stapled,
    /// certificates whose response cannot be fetched.
    pub fn ocsp_notes(&self) -> &[String] {
        &self.ocsp_notes
    }

    /// The rustls configuration of new handshakes (its certificate resolver: SNI, stapling,
    /// ACME's certificates): HTTP/3 builds its QUIC configuration from it, so that both see
    /// the same certificates and a reload reaches both.
    pub fn server_config(&self) -> &Arc<rustls::ServerConfig> {
        self.acceptor.config()
    }

    /// How long its session tickets are accepted; `None` when tickets are off.
    pub fn session_ticket_lifetime(&self) -> Option<Duration> {
        self.tickets.as_ref().map(|keys| keys.lifetime())
    }

    /// Takes the session ticket keys of `previous` (the load this one replaces) when both
    /// have tickets of the same lifetime and the same client CAs: tickets issued before a
    /// reload then still resume sessions after it. Otherwise keeps its own, new keys.
    pub fn keep_ticket_keys(&mut self, previous: &ServerTls) {
        let (Some(mine), Some(theirs)) = (&self.tickets, &previous.tickets) else {
            return;
        };
        if Arc::ptr_eq(mine, theirs)
            || mine.lifetime() != theirs.lifetime()
            || self.client_trust != previous.client_trust
        {
            return;
        }
        let mut config = ServerConfig::clone(self.acceptor.config());
        config.ticketer = theirs.clone();
        self.acceptor = TlsAcceptor::from(Arc::new(config));
        self.tickets = Some(theirs.clone());
    }

    /// Runs the server side of a handshake on `stream`. The caller bounds it in time.
    pub async fn accept<S>(
        &self,
        stream: S,
    ) -> io::Result<(tokio_rustls::server::TlsStream<S>, TlsInfo)>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let stream = self.acceptor.accept(stream).await?;
        let (_, connection) = stream.get_ref();
        let info = TlsInfo {
            version: match connection.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "TLS",
            },
            sni: connection.server_name().map(str::to_owned),
            alpn: connection
                .alpn_protocol()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
            client_certificate: connection.peer_certificates().is_some(),
        };
        Ok((stream, info))
    }
}

/// Whether the handshake done on `stream` resumed a session (by ticket or from the cache).
pub fn resumed<IO>(stream: &tokio_rustls::server::TlsStream<IO>) -> bool {
    stream.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
}

/// The label a failed handshake is counted under (besides `timeout`, which the caller counts):
/// one of [`FAILURE_REASONS`].
pub fn failure_reason(error: &io::Error) -> &'static str {
    if let Some(tls) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        return match tls {
            rustls::Error::PeerIncompatible(_) => "incompatible",
            rustls::Error::NoApplicationProtocol => "alpn",
            rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_) => {
                "client_certificate"
            }
            rustls::Error::AlertReceived(_) => "alert",
            _ => "protocol",
        };
    }
    match error.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => "closed",
        // tokio-rustls reports a malformed record as InvalidData without a rustls error inside.
        io::ErrorKind::InvalidData => "protocol",
        _ => "io",
    }
}

/// Every label [`failure_reason`] gives, and `timeout`.
pub const FAILURE_REASONS: [&str; 8] = [
    "timeout",
    "closed",
    "protocol",
    "incompatible",
    "alpn",
    "client_certificate",
    "alert",
    "io",
];

/// Picks a certificate by the client's SNI: an exact SAN name first, then a wildcard SAN
/// (`*.example.com` matches one label: `a.example.com`, not `example.com` nor `a.b.example.com`),
/// then the default. Where two certificates name the same host, the first in the configuration
/// wins.
#[derive(Debug)]
struct SniResolver {
    keys: Vec<Arc<StapleSlot>>,
    exact: HashMap<String, usize>,
    /// By the part after `*.`.
    wildcard: HashMap<String, usize>,
    default: usize,
    /// The ACME certificates, when the listener has some.
    acme: Option<Arc<AcmeCerts>>,
}

impl SniResolver {
    fn new(keys: Vec<Arc<StapleSlot>>, infos: &[CertificateInfo], default: usize) -> Self {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for (index, info) in infos.iter().enumerate() {
            for name in &info.names {
                match name.strip_prefix("*.") {
                    Some(parent) => wildcard.entry(parent.to_owned()).or_insert(index),
                    None => exact.entry(name.clone()).or_insert(index),
                };
            }
        }
        SniResolver {
            keys,
            exact,
            wildcard,
            default: default.min(infos.len().saturating_sub(1)),
            acme: None,
        }
    }

    fn pick(&self, server_name: Option<&str>) -> usize {
        let Some(name) = server_name else {
            return self.default;
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(&index) = self.exact.get(&name) {
            return index;
        }
        name.split_once('.')
            .and_then(|(_, parent)| self.wildcard.get(parent).copied())
            .unwrap_or(self.default)
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name();
        if let Some(acme) = &self.acme {
            let validating = hello
                .alpn()
                .is_some_and(|mut offered| offered.any(|p| p == ACME_TLS_ALPN));
            if validating {
                // TLS-ALPN-01: the challenge certificate or nothing (RFC 8737, section 3).
                return acme.challenge(name);
            }
            let issued = acme.issued();
            if let Some(issued) = &issued {
                if name.is_some_and(|n| acme.serves(n)) || self.keys.is_empty() {
                    return Some(issued.slot.current(super::staple::unix_now()));
                }
            }
            if self.keys.is_empty() {
                // No certificate yet and no static one to fall back to: the handshake fails.
                return None;
            }
        }
        self.keys
            .get(self.pick(name))
            .map(|slot| slot.current(super::staple::unix_now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(names: &[&str]) -> CertificateInfo {
        CertificateInfo {
            file: PathBuf::new(),
            names: names.iter().map(|n| n.to_string()).collect(),
            not_after: 0,
            chain: Vec::new(),
        }
    }

    #[test]
    fn sni_picks_exact_then_wildcard_then_the_default() {
        let infos = [
            info(&["default.test"]),
            info(&["*.example.com"]),
            info(&["api.example.com", "other.test"]),
            info(&["other.test"]),
        ];
        let resolver = SniResolver::new(Vec::new(), &infos, 0);
        assert_eq!(resolver.pick(None), 0);
        assert_eq!(resolver.pick(Some("api.example.com")), 2);
        assert_eq!(resolver.pick(Some("API.Example.COM.")), 2);
        assert_eq!(resolver.pick(Some("www.example.com")), 1);
        assert_eq!(
            resolver.pick(Some("example.com")),
            0,
            "a wildcard needs a label"
        );
        assert_eq!(resolver.pick(Some("a.b.example.com")), 0, "one label only");
        assert_eq!(resolver.pick(Some("other.test")), 2, "the first one wins");
        assert_eq!(resolver.pick(Some("nowhere.test")), 0);
        let resolver = SniResolver::new(Vec::new(), &infos, 3);
        assert_eq!(resolver.pick(Some("nowhere.test")), 3);
    }

    #[test]
    fn only_served_protocols_are_advertised() {
        let settings = ServerSettings {
            certificates: Vec::new(),
            default: 0,
            min_version: MinVersion::Tls12,
            alpn: vec![Alpn::H2, Alpn::Http11],
            client_ca: None,
            acme: None,
            ocsp_fetch: false,
            session_tickets: Some(Duration::from_secs(3600)),
        };
        let served: Vec<Vec<u8>> = [Alpn::H2, Alpn::Http11]
            .into_iter()
            .filter(|p| p.served())
            .map(|p| p.id().to_vec())
            .collect();
        assert_eq!(settings.alpn(), served);
        assert!(settings.alpn().contains(&b"http/1.1".to_vec()));
    }
}
