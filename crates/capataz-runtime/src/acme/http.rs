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
use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::time::Instant;

use crate::oneshot;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The largest answer body read from an ACME server: 1 MiB (a chain is a few KiB).
const MAX_BODY: usize = 1 << 20;
/// How long connecting and getting an answer's head may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an exchange may take, body included.
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
    tls: Arc<ClientConfig>,
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
            tls: Arc::new(config),
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
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let tls = self.tls.clone();
        Box::pin(async move { exchange(tls, req).await.map_err(instant_acme::Error::Other) })
    }
}

/// `req` over a fresh connection: the answer's head within [`EXCHANGE_TIMEOUT`], its body
/// (at most [`MAX_BODY`]) within [`CONNECTION_LIFETIME`], both from the start.
async fn exchange(
    tls: Arc<ClientConfig>,
    req: Request<BodyWrapper<Bytes>>,
) -> Result<BytesResponse, BoxError> {
    let start = Instant::now();
    let (mut parts, body) = req.into_parts();
    // instant-acme's requests are whole in memory (a JWS, or nothing): hyper gets them as such.
    let body = Full::new(body.collect().await?.to_bytes());
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
    let tls = if https {
        Some(oneshot::Tls {
            config: tls,
            name: ServerName::try_from(host.clone())?,
        })
    } else {
        None
    };
    let by = start + EXCHANGE_TIMEOUT;
    let timed_out = |error: oneshot::Error| -> BoxError {
        match error {
            oneshot::Error::ConnectTimeout | oneshot::Error::HeadTimeout => {
                format!("no answer within {EXCHANGE_TIMEOUT:?}").into()
            }
            other => other.into(),
        }
    };
    let mut connection = oneshot::connect((host.as_str(), port), tls, by)
        .await
        .map_err(timed_out)?;
    let response = connection.send(req, by).await.map_err(timed_out)?;
    let (parts, body) = response.into_parts();
    let body = oneshot::read_body(body, MAX_BODY, start + CONNECTION_LIFETIME).await?;
    Ok(BytesResponse::from(hyper::Response::from_parts(
        parts,
        Full::new(body),
    )))
}
