//! The HTTP client instant-acme talks through: one HTTP/1.1 connection per request over
//! rustls (ring), trusting the system's roots and the listener's `ca_file`, each exchange and
//! each body bounded in time and size, so a hostile or stalled ACME server costs a failed
//! order, never a hung task or unbounded memory.

use std::error::Error as StdError;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Full, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use instant_acme::{BytesResponse, HttpClient};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The largest answer body read from an ACME server: 1 MiB (a chain is a few KiB).
const MAX_BODY: usize = 1 << 20;
/// How long connecting and getting an answer's head may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may live, body included.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Why the client cannot be made (the listener's `ca_file`, or rustls).
#[derive(Debug, thiserror::Error)]
pub(super) enum AcmeHttpError {
    #[error("{}: cannot read it: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: is not valid PEM: {source}", file.display())]
    Pem {
        file: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: holds no usable CA certificate", .0.display())]
    NoCa(PathBuf),
    #[error(transparent)]
    Tls(#[from] rustls::Error),
}

/// instant-acme's [`HttpClient`] over hyper and tokio-rustls.
pub(super) struct AcmeHttp {
    tls: TlsConnector,
}

impl AcmeHttp {
    /// The client trusting the system's roots and `ca_file`. Blocks on file IO: call it on the
    /// blocking pool.
    pub(super) fn new(ca_file: Option<&Path>) -> Result<AcmeHttp, AcmeHttpError> {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(file) = ca_file {
            let bytes = read_bounded(file)?;
            let certs = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| AcmeHttpError::Pem {
                    file: file.to_owned(),
                    source,
                })?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(AcmeHttpError::NoCa(file.to_owned()));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(AcmeHttp {
            tls: TlsConnector::from(Arc::new(config)),
        })
    }
}

fn read_bounded(file: &Path) -> Result<Vec<u8>, AcmeHttpError> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(16 << 20).read_to_end(&mut bytes))
        .map_err(|source| AcmeHttpError::Read {
            file: file.to_owned(),
            source,
        })?;
    Ok(bytes)
}

impl HttpClient for AcmeHttp {
    fn request(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let tls = self.tls.clone();
        Box::pin(async move {
            match tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(tls, req)).await {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(error)) => Err(instant_acme::Error::Other(error)),
                Err(_) => Err(instant_acme::Error::Other(
                    format!("no answer within {EXCHANGE_TIMEOUT:?}").into(),
                )),
            }
        })
    }
}

async fn exchange(tls: TlsConnector, req: Request<Full<Bytes>>) -> Result<BytesResponse, BoxError> {
    let (mut parts, body) = req.into_parts();
    let uri = parts.uri.clone();
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("{uri} is not an http(s) URL").into()),
    };
    let host = uri.host().ok_or_else(|| format!("{uri} has no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_else(|| host.clone());
    // Origin form on the wire, the authority in Host.
    parts.uri = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .parse()?;
    parts
        .headers
        .insert(http::header::HOST, http::HeaderValue::from_str(&authority)?);
    let req = Request::from_parts(parts, body);
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    let _ = tcp.set_nodelay(true);
    let response = if https {
        let name = ServerName::try_from(host.clone())?;
        let stream = tls.connect(name, tcp).await?;
        send(TokioIo::new(stream), req).await?
    } else {
        send(TokioIo::new(tcp), req).await?
    };
    let (parts, body) = response.into_parts();
    Ok(BytesResponse::from(hyper::Response::from_parts(
        parts,
        Limited::new(body, MAX_BODY),
    )))
}

async fn send<T>(
    io: TokioIo<T>,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, BoxError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    // The connection ends with the exchange, or after its lifetime at the latest (a body that
    // trickles forever is cut there).
    tokio::spawn(async move {
        let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
    });
    Ok(sender.send_request(req).await?)
}
