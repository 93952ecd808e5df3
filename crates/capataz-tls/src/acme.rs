//! What a listener's TLS needs of ACME (`[listeners.tls.acme]`): the settings, the slot the
//! SNI resolver reads the issued certificate and the TLS-ALPN-01 challenge certificates from,
//! and the stored certificate, read from `storage` when the listener's TLS is loaded (off the
//! runtime), so a valid stored certificate is served at once. Ordering, storing and renewing
//! are the runtime's (`crate::acme`), and so is stapling (`crate::stapling`, told of each
//! certificate put in force by [`AcmeCerts::installs`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use super::staple::StapleSlot;
use super::{read_certificates, read_key, x509, CertificateInfo, Part};

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The most domains one listener orders (one certificate holds them all).
pub const MAX_DOMAINS: usize = 100;

/// The challenge an ACME listener answers to prove it holds its domains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Challenge {
    /// TLS-ALPN-01 (RFC 8737), on the TLS listener itself (port 443). The default.
    TlsAlpn01,
    /// HTTP-01 (RFC 8555, section 8.3), on the balancer's plaintext listeners (port 80).
    Http01,
    /// DNS-01 (RFC 8555, section 8.4): a TXT record published by an RFC 2136 dynamic update
    /// signed with TSIG (the only challenge for wildcard names).
    Dns01,
}

impl Challenge {
    /// Its name in the config and in ACME (`tls-alpn-01`, `http-01`).
    pub fn name(self) -> &'static str {
        match self {
            Challenge::TlsAlpn01 => "tls-alpn-01",
            Challenge::Http01 => "http-01",
            Challenge::Dns01 => "dns-01",
        }
    }
}

/// `[listeners.tls.acme]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcmeSettings {
    /// The URL of the ACME directory.
    pub directory: String,
    /// The names the certificate is ordered for, lowercase, at least one.
    pub domains: Vec<String>,
    /// The account's contact, if any (without `mailto:`).
    pub email: Option<String>,
    /// The directory holding the account key and the certificate.
    pub storage: PathBuf,
    /// The challenge answered (default TLS-ALPN-01).
    pub challenge: Challenge,
    /// How long before its expiry a certificate is renewed (default 30 days).
    pub renew_before: Duration,
    /// An extra root trusted for the directory's HTTPS (beside the system's roots).
    pub ca_file: Option<PathBuf>,
    /// Where and how DNS-01's TXT records are published (`Some` exactly with `Challenge::Dns01`).
    pub dns01: Option<Dns01Settings>,
}

/// `[listeners.tls.acme.dns01]`, validated: the RFC 2136 server DNS-01's TXT records are
/// published on, and the TSIG key that signs the updates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dns01Settings {
    /// The primary (authoritative) server accepting the updates.
    pub server: std::net::SocketAddr,
    /// The zone updated, without its final dot; `None`: the zone the server's SOA names.
    pub zone: Option<String>,
    /// The TSIG key's name, as the server knows it.
    pub tsig_key: String,
    /// The TSIG MAC algorithm.
    pub tsig_algorithm: TsigAlgorithm,
    /// The TSIG secret (decoded from the base64 of `tsig_secret_file`).
    pub tsig_secret: TsigSecret,
    /// The TTL of the TXT records.
    pub ttl: Duration,
    /// How long the server is asked for a new TXT record before the order fails.
    pub propagation_timeout: Duration,
}

/// A TSIG MAC algorithm (RFC 8945).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TsigAlgorithm {
    /// `hmac-sha256`, the default.
    HmacSha256,
    /// `hmac-sha384`.
    HmacSha384,
    /// `hmac-sha512`.
    HmacSha512,
}

impl TsigAlgorithm {
    /// Its name in the config, in BIND's and Knot's key files and in TSIG records.
    pub fn name(self) -> &'static str {
        match self {
            TsigAlgorithm::HmacSha256 => "hmac-sha256",
            TsigAlgorithm::HmacSha384 => "hmac-sha384",
            TsigAlgorithm::HmacSha512 => "hmac-sha512",
        }
    }
}

/// A TSIG secret; its `Debug` does not show it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TsigSecret(pub Vec<u8>);

impl std::fmt::Debug for TsigSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TsigSecret({} bytes)", self.0.len())
    }
}

impl AcmeSettings {
    /// The stored certificate chain (PEM).
    pub fn cert_path(&self) -> PathBuf {
        self.storage.join("certificate.pem")
    }

    /// The stored certificate's private key (PEM, PKCS#8, mode 0600).
    pub fn key_path(&self) -> PathBuf {
        self.storage.join("certificate.key")
    }

    /// The stored account credentials (JSON, mode 0600).
    pub fn account_path(&self) -> PathBuf {
        self.storage.join("account.json")
    }
}

/// An issued certificate in force, with its facts.
#[derive(Debug)]
pub struct Issued {
    /// The chain and signing key, as handed to rustls, with its own OCSP staple once fetched.
    pub slot: Arc<StapleSlot>,
    /// Its expiry, names and chain.
    pub info: CertificateInfo,
    /// Its `notBefore` is not read; when it was loaded or issued (Unix seconds) stands in for it.
    pub since: i64,
}

/// What the SNI resolver of an ACME listener reads: the issued certificate (swapped in by the
/// runtime without a reload) and the TLS-ALPN-01 challenge certificates by domain. Shared by
/// the listener's `ServerTls` and its ACME task.
#[derive(Debug)]
pub struct AcmeCerts {
    settings: AcmeSettings,
    issued: ArcSwapOption<Issued>,
    challenges: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// Marked changed each time a certificate is put in force.
    installed: tokio::sync::watch::Sender<()>,
}

impl AcmeCerts {
    /// A slot for `settings`, holding the stored certificate if it is valid at `now` and still
    /// names every domain. Blocks on file IO: call it off the runtime threads. A missing or
    /// unusable stored certificate is not an error (it is ordered); the reason is returned
    /// beside, for the log.
    pub fn load(settings: AcmeSettings, now: i64) -> (AcmeCerts, Option<String>) {
        let (issued, note) = match load_stored(&settings, now) {
            Ok(issued) => (Some(Arc::new(issued)), None),
            Err(why) => (None, why),
        };
        (
            AcmeCerts {
                settings,
                issued: ArcSwapOption::new(issued),
                challenges: Mutex::new(HashMap::new()),
                installed: tokio::sync::watch::Sender::new(()),
            },
            note,
        )
    }

    /// The settings.
    pub fn settings(&self) -> &AcmeSettings {
        &self.settings
    }

    /// The certificate in force, if any.
    pub fn issued(&self) -> Option<Arc<Issued>> {
        self.issued.load_full()
    }

    /// Puts `issued` in force for the next handshakes.
    pub fn install(&self, issued: Issued) {
        self.issued.store(Some(Arc::new(issued)));
        self.installed.send_replace(());
    }

    /// A receiver marked changed each time a certificate is put in force after this call.
    pub fn installs(&self) -> tokio::sync::watch::Receiver<()> {
        self.installed.subscribe()
    }

    /// Serves `key` to TLS-ALPN-01 handshakes for `domain` until removed.
    pub fn set_challenge(&self, domain: &str, key: Arc<CertifiedKey>) {
        self.challenges_lock().insert(domain.to_owned(), key);
    }

    /// Stops serving every challenge certificate.
    pub fn clear_challenges(&self) {
        self.challenges_lock().clear();
    }

    /// The challenge certificate for `server_name`, if one is being validated.
    pub(super) fn challenge(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let name = server_name?.trim_end_matches('.').to_ascii_lowercase();
        self.challenges_lock().get(&name).cloned()
    }

    /// Whether the issued certificate is the one for `server_name`: one of the domains, or a
    /// name one label under a wildcard domain (`a.example.com` for `*.example.com`).
    pub(super) fn serves(&self, server_name: &str) -> bool {
        let name = server_name.trim_end_matches('.').to_ascii_lowercase();
        self.settings.domains.iter().any(|domain| {
            domain == &name
                || domain.strip_prefix("*.").is_some_and(|parent| {
                    name.split_once('.')
                        .is_some_and(|(label, rest)| !label.is_empty() && rest == parent)
                })
        })
    }

    fn challenges_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<CertifiedKey>>> {
        // A panic while holding it cannot leave the map half-written: recover it.
        self.challenges.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a chain and a key cannot be put in force.
#[derive(Debug, thiserror::Error)]
pub enum IssuedError {
    /// The chain is empty.
    #[error("the chain holds no certificate")]
    NoCertificate,
    /// The first certificate is not DER X.509.
    #[error("its first certificate is not readable X.509 ({0})")]
    Unreadable(#[source] x509_cert::der::Error),
    /// The certificate's `notAfter` (Unix seconds) has passed.
    #[error("the certificate expired on {}", super::server::date(*.0))]
    Expired(i64),
    /// rustls cannot sign with the key.
    #[error("the key is not usable: {0}")]
    Key(#[source] rustls::Error),
    /// The key is not the certificate's.
    #[error("the key does not match the certificate: {0}")]
    Mismatch(#[source] rustls::Error),
}

/// Why a TLS-ALPN-01 challenge certificate cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ChallengeError {
    /// The key authorization's digest is not a SHA-256 (its length).
    #[error("a digest of {0} bytes, not 32")]
    Digest(usize),
    /// rcgen could not make the certificate or its key.
    #[error(transparent)]
    Certificate(#[from] rcgen::Error),
    /// rustls cannot sign with the key.
    #[error(transparent)]
    Key(#[from] rustls::Error),
}

/// Builds an [`Issued`] from a PEM chain and a PKCS#8 key: the key must match and the
/// certificate must not have expired at `now`. `file` names the chain in the facts.
pub fn issued_from_der(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    file: &Path,
    now: i64,
) -> Result<Issued, IssuedError> {
    let provider: CryptoProvider = rustls::crypto::ring::default_provider();
    let first = chain.first().ok_or(IssuedError::NoCertificate)?;
    let facts = x509::read(first).map_err(IssuedError::Unreadable)?;
    if facts.not_after <= now {
        return Err(IssuedError::Expired(facts.not_after));
    }
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(IssuedError::Key)?;
    let certified = CertifiedKey::new(chain.clone(), signing);
    certified.keys_match().map_err(IssuedError::Mismatch)?;
    Ok(Issued {
        slot: Arc::new(StapleSlot::new(certified)),
        info: CertificateInfo::new(file.to_owned(), facts.dns_names, facts.not_after, &chain),
        since: now,
    })
}

/// The stored certificate, or why there is none to serve (`None`: simply absent).
fn load_stored(settings: &AcmeSettings, now: i64) -> Result<Issued, Option<String>> {
    let cert = settings.cert_path();
    if !cert.exists() {
        return Err(None);
    }
    let chain = read_certificates(Part::Certificate(0), &cert).map_err(|e| Some(e.to_string()))?;
    let key = read_key(Part::Key(0), &settings.key_path()).map_err(|e| Some(e.to_string()))?;
    let issued = issued_from_der(chain, key, &cert, now)
        .map_err(|why| Some(format!("{}: {why}", cert.display())))?;
    if let Some(missing) = settings
        .domains
        .iter()
        .find(|d| !issued.info.names.contains(d))
    {
        return Err(Some(format!(
            "{}: does not name {missing} (ordering a new one)",
            cert.display()
        )));
    }
    Ok(issued)
}

/// The TLS-ALPN-01 challenge certificate for `domain` (RFC 8737): self-signed, naming only the
/// domain, with the `acmeIdentifier` extension holding `digest` (the SHA-256 of the key
/// authorization, 32 bytes).
pub fn challenge_certificate(
    domain: &str,
    digest: &[u8],
) -> Result<Arc<CertifiedKey>, ChallengeError> {
    if digest.len() != 32 {
        return Err(ChallengeError::Digest(digest.len()));
    }
    let mut params = rcgen::CertificateParams::new(vec![domain.to_owned()])?;
    params
        .custom_extensions
        .push(rcgen::CustomExtension::new_acme_identifier(digest));
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = params.self_signed(&key)?;
    let provider = rustls::crypto::ring::default_provider();
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = provider.key_provider.load_private_key(der)?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signing,
    )))
}

/// A new private key (ECDSA P-256) and a CSR for `domains`: `(CSR DER, key PEM)`.
pub fn certificate_request(domains: &[String]) -> Result<(Vec<u8>, String), rcgen::Error> {
    let mut params = rcgen::CertificateParams::new(domains.to_vec())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let csr = params.serialize_request(&key)?;
    Ok((csr.der().to_vec(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_certificate_names_the_domain_and_refuses_a_bad_digest() {
        let key = challenge_certificate("a.test", &[7; 32]).expect("built");
        let facts = x509::read(&key.cert[0]).expect("readable");
        assert_eq!(facts.dns_names, vec!["a.test".to_string()]);
        let refused = challenge_certificate("a.test", &[7; 31]).expect_err("refused");
        assert_eq!(refused.to_string(), "a digest of 31 bytes, not 32");
    }

    #[test]
    fn a_wildcard_domain_serves_the_names_one_label_under_it_only() {
        let settings = AcmeSettings {
            directory: "https://127.0.0.1:1/dir".into(),
            domains: vec!["*.a.test".into(), "b.test".into()],
            email: None,
            storage: std::env::temp_dir().join("capataz-acme-unit-none"),
            challenge: Challenge::Dns01,
            renew_before: Duration::from_secs(1),
            ca_file: None,
            dns01: None,
        };
        let (certs, _) = AcmeCerts::load(settings, 0);
        for name in ["www.a.test", "WWW.A.TEST.", "b.test"] {
            assert!(certs.serves(name), "{name}");
        }
        for name in [
            "a.test",
            "x.www.a.test",
            ".a.test",
            "www.b.test",
            "wwwa.test",
        ] {
            assert!(!certs.serves(name), "{name}");
        }
    }

    /// A self-signed certificate for `name` and its key, as an order would hand them over.
    fn issued(name: &str) -> Issued {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        issued_from_der(vec![cert.der().clone()], der, Path::new("c.pem"), 0).expect("issued")
    }

    #[test]
    fn a_certificate_put_in_force_is_announced_and_starts_without_the_old_staple() {
        let settings = AcmeSettings {
            directory: "https://127.0.0.1:1/dir".into(),
            domains: vec!["a.test".into()],
            email: None,
            storage: std::env::temp_dir().join("capataz-acme-unit-none"),
            challenge: Challenge::TlsAlpn01,
            renew_before: Duration::from_secs(1),
            ca_file: None,
            dns01: None,
        };
        let (certs, _) = AcmeCerts::load(settings, 0);
        let mut installs = certs.installs();
        assert!(!installs.has_changed().expect("open"));
        certs.install(issued("a.test"));
        assert!(installs.has_changed().expect("open"));
        installs.borrow_and_update();
        let first = certs.issued().expect("in force");
        first.slot.staple(vec![0x30, 0], i64::MAX);
        assert_eq!(first.slot.current(0).ocsp, Some(vec![0x30, 0]));
        certs.install(issued("a.test"));
        assert!(installs.has_changed().expect("open"));
        let second = certs.issued().expect("in force");
        assert_ne!(second.slot.chain(), first.slot.chain());
        assert_eq!(
            second.slot.current(0).ocsp,
            None,
            "no staple of the old one"
        );
    }

    #[test]
    fn a_missing_stored_certificate_is_no_error_and_a_broken_one_is_explained() {
        let dir = std::env::temp_dir().join(format!("capataz-acme-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let settings = AcmeSettings {
            directory: "https://127.0.0.1:1/dir".into(),
            domains: vec!["a.test".into()],
            email: None,
            storage: dir.clone(),
            challenge: Challenge::TlsAlpn01,
            renew_before: Duration::from_secs(1),
            ca_file: None,
            dns01: None,
        };
        let (certs, note) = AcmeCerts::load(settings.clone(), 0);
        assert!(certs.issued().is_none());
        assert_eq!(note, None);
        std::fs::write(settings.cert_path(), "garbage").expect("write");
        let (certs, note) = AcmeCerts::load(settings, 0);
        assert!(certs.issued().is_none());
        assert!(note.expect("explained").contains("certificate.pem"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
