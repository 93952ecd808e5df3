//! TLS scaffolding: a throwaway PKI written to a temporary directory (a CA, server and client
//! certificates from rcgen), and an in-process rustls client.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// A temporary directory with a CA in it, removed when dropped.
pub struct Pki {
    pub dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    /// A fresh directory and CA (`ca.pem` in it).
    pub fn new() -> Pki {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "capataz-tls-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "capataz test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    /// The CA's PEM file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate for `names` signed by the CA, written to `<stem>.pem` and
    /// `<stem>.key`; `not_after` as (year, month, day) if given.
    pub fn server(
        &self,
        stem: &str,
        names: &[&str],
        not_after: Option<(i32, u8, u8)>,
    ) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, stem);
        if let Some((y, m, d)) = not_after {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(y, m, d);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (cert_path, key_path) = (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// A client certificate signed by the CA: its chain and key, in memory.
    pub fn client(&self, name: &str) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (
            vec![cert.der().clone()],
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        )
    }

    /// A TLS listener table for these files: `[listeners.tls]` with `lines` added.
    pub fn listener(certificates: &[(&Path, &Path)], lines: &str) -> String {
        let list: Vec<String> = certificates
            .iter()
            .map(|(c, k)| {
                format!(
                    "{{ cert = {:?}, key = {:?} }}",
                    c.display().to_string(),
                    k.display().to_string()
                )
            })
            .collect();
        format!(
            "[listeners.tls]\ncertificates = [{}]\n{lines}\n",
            list.join(", ")
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How the test client connects.
#[derive(Clone)]
pub struct Client {
    pub roots: PathBuf,
    pub versions: Vec<&'static SupportedProtocolVersion>,
    pub identity: Option<Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
    pub alpn: Vec<Vec<u8>>,
    /// Accept any server certificate (to see which one a server presents).
    pub insecure: bool,
}

impl Client {
    /// A client trusting `pki`'s CA, TLS 1.2 and 1.3, no client certificate, ALPN
    /// `http/1.1` alone (as `curl --http1.1` offers; the tests speak HTTP/1.1 over it).
    pub fn trusting(pki: &Pki) -> Client {
        Client {
            roots: pki.ca_path(),
            versions: vec![&rustls::version::TLS13, &rustls::version::TLS12],
            identity: None,
            alpn: vec![b"http/1.1".to_vec()],
            insecure: false,
        }
    }

    /// This client, accepting any server certificate.
    pub fn insecure(mut self) -> Client {
        self.insecure = true;
        self
    }

    pub fn versions(mut self, versions: &[&'static SupportedProtocolVersion]) -> Client {
        self.versions = versions.to_vec();
        self
    }

    pub fn identity(
        mut self,
        identity: (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
    ) -> Client {
        self.identity = Some(Arc::new(identity));
        self
    }

    fn connector(&self) -> TlsConnector {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.roots).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(&self.versions)
                .unwrap()
                .with_root_certificates(roots);
        let mut config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(identity) => builder
                .with_client_auth_cert(identity.0.clone(), identity.1.clone_key())
                .unwrap(),
        };
        config.alpn_protocols = self.alpn.clone();
        if self.insecure {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            config
                .dangerous()
                .set_certificate_verifier(Arc::new(AcceptAny(provider)));
        }
        TlsConnector::from(Arc::new(config))
    }

    /// A TLS connection to `addr` asking for `sni`.
    pub async fn connect(&self, addr: SocketAddr, sni: &str) -> io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        self.connect_over(tcp, sni).await
    }

    /// A TLS connection over `tcp` (which may already carry bytes of its own, a PROXY protocol
    /// header say) asking for `sni`.
    pub async fn connect_over(
        &self,
        tcp: TcpStream,
        sni: &str,
    ) -> io::Result<TlsStream<TcpStream>> {
        let name = ServerName::try_from(sni.to_owned()).unwrap();
        let mut stream = self.connector().connect(name, tcp).await?;
        // In TLS 1.3 the server checks a client certificate after the client's handshake is
        // done: a refusal shows on the first read. A request settles it.
        stream.flush().await?;
        Ok(stream)
    }
}

/// Whether the server presented the certificate in the PEM file `cert` on `stream`.
pub fn presented(stream: &TlsStream<TcpStream>, cert: &Path) -> bool {
    let (_, connection) = stream.get_ref();
    let shown = &connection
        .peer_certificates()
        .expect("a server certificate")[0];
    let file = CertificateDer::from_pem_file(cert).expect("a PEM certificate");
    *shown == file
}

/// (year, month, day) of `days` days from today (UTC), for certificates expiring soon.
pub fn date_in(days: i64) -> (i32, u8, u8) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // Howard Hinnant's civil_from_days.
    let z = now / 86_400 + days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month as u8, day as u8)
}

/// `GET /` with `Host: host` on a keep-alive connection; the response head (lowercase) and
/// body, or `None` if the connection closed first.
pub async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
) -> Option<(String, String)> {
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some((
        head,
        String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned(),
    ))
}

/// A server certificate verifier that accepts any certificate (signatures still checked).
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
