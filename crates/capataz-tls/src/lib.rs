//! TLS with rustls on the ring provider: termination on listeners (the certificates of a
//! listener, loaded from PEM files, and the rustls server configuration that serves them) and
//! `client`, capataz as a TLS client of its backends.
//!
//! Loading happens where the configuration is resolved (before the runtime starts, in
//! `capataz check`, or on the blocking pool during a reload), never on a runtime thread: a
//! listener's [`ServerTls`] is built there, whole, and a connection only clones its acceptor.
//! Every failure names the file it is about ([`LoadError`]); `config` adds the line and key.
//!
//! rustls runs on the ring provider with its default cipher suites and key exchange groups
//! (TLS 1.3: AES-GCM and ChaCha20-Poly1305; TLS 1.2: ECDHE with AES-GCM and ChaCha20-Poly1305
//! only; X25519 first, then P-256 and P-384): nothing weak can be configured.
//!
//! `mod.rs` holds the settings' types, the per-connection facts ([`TlsInfo`]) and PEM reading;
//! `server.rs` the server configuration and the SNI resolver; `tickets.rs` the session ticket
//! keys; `x509.rs` the bounded reader of a
//! certificate's expiry and names; `backend.rs` the side of capataz as a TLS client of its backends (requests and probes).
//!
//! This module sits at the bottom of the crate: it imports only `timefmt`.

pub mod acme;
pub mod ari;
pub mod backend;
pub mod ocsp;
mod server;
pub mod staple;
pub mod tickets;
mod x509;

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use server::date as server_date;
pub use server::{
    failure_reason, resumed, CertificateInfo, CertificateSource, ServerSettings, ServerTls,
    FAILURE_REASONS,
};

/// The lowest TLS version a listener accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinVersion {
    /// TLS 1.2 and 1.3 (default).
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

/// An application protocol a listener may offer by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// `h2`, HTTP/2.
    H2,
    /// `http/1.1`.
    Http11,
}

impl Alpn {
    /// The protocol's ALPN identifier.
    pub fn id(self) -> &'static [u8] {
        match self {
            Alpn::H2 => b"h2",
            Alpn::Http11 => b"http/1.1",
        }
    }

    /// Whether a listener serves this protocol. Only what is served is advertised: a
    /// configured protocol that is not is left out of the handshake (see
    /// [`ServerSettings::alpn`]). Both are served: `h2` by the HTTP/2 server, `http/1.1` by
    /// the HTTP/1 one.
    pub fn served(self) -> bool {
        match self {
            Alpn::H2 | Alpn::Http11 => true,
        }
    }
}

impl fmt::Display for Alpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Alpn::H2 => "h2",
            Alpn::Http11 => "http/1.1",
        })
    }
}

/// Whether a listener with a client CA requires a client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client without a valid certificate fails the handshake (default).
    Required,
    /// A client may present no certificate; one it presents must be valid.
    Optional,
}

/// What the handshake of one client connection settled, for the request path and the logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsInfo {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: &'static str,
    /// The server name the client asked for (SNI), if any.
    pub sni: Option<String>,
    /// The protocol agreed by ALPN, if any (`h2` or `http/1.1`).
    pub alpn: Option<String>,
    /// Whether the client presented a certificate that was verified (mTLS).
    pub client_certificate: bool,
}

impl TlsInfo {
    /// Whether the client and capataz agreed on HTTP/2. Without ALPN (or with `http/1.1`) the
    /// connection speaks HTTP/1.1.
    pub fn alpn_is_h2(&self) -> bool {
        self.alpn.as_deref() == Some("h2")
    }
}

/// Why a listener's TLS material could not be loaded. The `Display` form starts with the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// Which setting the file belongs to.
    pub part: Part,
    /// The file, as it was opened.
    pub file: PathBuf,
    /// What is wrong and what to do.
    pub message: String,
}

/// The setting a [`LoadError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The certificate chain of `certificates[i]`.
    Certificate(usize),
    /// The private key of `certificates[i]`.
    Key(usize),
    /// The client CA bundle.
    ClientCa,
    /// The extra root trusted for the ACME directory (`[listeners.tls.acme]`'s `ca_file`).
    AcmeCaFile,
    /// The OCSP response file of `certificates[i]`.
    OcspResponse(usize),
    /// The session ticket keys (`session_ticket_lifetime`): no file, made from random bytes.
    SessionTickets,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.file.as_os_str().is_empty() {
            // Not about a file (the session ticket keys).
            return f.write_str(&self.message);
        }
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

impl std::error::Error for LoadError {}

/// The largest PEM file read: 16 MiB, far above any chain or CA bundle. A path that points at
/// an endless stream ends in an error, not in all the memory there is.
const MAX_PEM_BYTES: u64 = 16 << 20;

/// Why a PEM file could not be read.
#[derive(Debug)]
pub enum PemRead {
    /// Opening or reading it failed.
    Io(std::io::Error),
    /// It is larger than [`MAX_PEM_BYTES`].
    TooLarge,
}

/// A PEM file's bytes, read whole but never more than [`MAX_PEM_BYTES`]: the one reader of
/// TLS files, a listener's or a pool's.
pub fn read_pem_file(file: &Path) -> Result<Vec<u8>, PemRead> {
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes))
        .map_err(PemRead::Io)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(PemRead::TooLarge);
    }
    Ok(bytes)
}

/// Reads a PEM file whole, bounded.
fn read_pem(part: Part, file: &Path) -> Result<Vec<u8>, LoadError> {
    read_pem_file(file).map_err(|why| LoadError {
        part,
        file: file.to_owned(),
        message: match why {
            PemRead::Io(e) => format!("cannot read it: {e} (check the path and its permissions)"),
            PemRead::TooLarge => format!(
                "larger than {} MiB, which no PEM certificate or key is (is it the right file?)",
                MAX_PEM_BYTES >> 20
            ),
        },
    })
}

/// The certificates of a PEM file, in order; at least one.
fn read_certificates(part: Part, file: &Path) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let bytes = read_pem(part, file)?;
    let error = |message: String| LoadError {
        part,
        file: file.to_owned(),
        message,
    };
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(format!("is not valid PEM: {e}")))?;
    if certificates.is_empty() {
        return Err(error(
            "holds no certificate (expected PEM blocks \"-----BEGIN CERTIFICATE-----\")".into(),
        ));
    }
    Ok(certificates)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn read_key(part: Part, file: &Path) -> Result<PrivateKeyDer<'static>, LoadError> {
    let bytes = read_pem(part, file)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| LoadError {
        part,
        file: file.to_owned(),
        message: match e {
            rustls::pki_types::pem::Error::NoItemsFound => "holds no private key (expected a PEM \
                 block \"-----BEGIN PRIVATE KEY-----\", RSA or EC)"
                .into(),
            other => format!("is not a valid PEM private key: {other}"),
        },
    })
}

/// A self-signed certificate (ECDSA P-256) for `names` (DNS names, or IP addresses), valid
/// from yesterday for 90 days (`today`: days since 1970-01-01, UTC), as PEM:
/// `(certificate, private key)`. For `capataz demo --tls` and tests; never for production.
pub fn self_signed(names: &[&str], today: i64) -> Result<(String, String), rcgen::Error> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names)?;
    let date = |days: i64| {
        let (y, m, d) = x509::civil_from_days(days);
        rcgen::date_time_ymd(y, m, d)
    };
    params.not_before = date(today - 1);
    params.not_after = date(today + 90);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "capataz self-signed");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}
