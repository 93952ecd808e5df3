//! Backends that speak TLS and HTTP/2, for the tests of capataz's backend side: a test PKI
//! ([`Pki`], certificates made by rcgen in the test, written to a temporary directory for
//! `ca_file`), and hyper servers ([`HttpBackend`]) speaking HTTP/1.1 or HTTP/2, over TCP or
//! TLS, answering with a scripted [`Reply`], counting connections and requests, and able to
//! send GOAWAY on every connection ([`HttpBackend::go_away`]).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::any;

/// A certificate authority made for one test, and the files it wrote.
pub struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Pki {
    /// A new CA; its files go to a fresh temporary directory named after `tag`.
    pub fn new(tag: &str) -> Pki {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "capataz-test-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the test's temporary directory");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("capataz test CA {tag}"));
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = params.self_signed(&ca_key).expect("CA certificate");
        Pki { dir, ca, ca_key }
    }

    /// The CA certificate's PEM file.
    pub fn ca_file(&self) -> String {
        self.write("ca.pem", &self.ca.pem())
    }

    /// A leaf certificate for `names` (DNS names or IP addresses) signed by this CA: its chain
    /// and key.
    pub fn leaf(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let (cert, key) = self.leaf_pem(names);
        let chain = CertificateDer::from(cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![chain], key)
    }

    fn leaf_pem(&self, names: &[&str]) -> (rcgen::Certificate, KeyPair) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let params = CertificateParams::new(names).expect("leaf params");
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("leaf certificate");
        (cert, key)
    }

    /// A leaf for `names` written as PEM files: (certificate, key) paths.
    pub fn leaf_files(&self, stem: &str, names: &[&str]) -> (String, String) {
        let (cert, key) = self.leaf_pem(names);
        (
            self.write(&format!("{stem}.pem"), &cert.pem()),
            self.write(&format!("{stem}.key"), &key.serialize_pem()),
        )
    }

    /// Writes `contents` to `name` in the directory; its path.
    pub fn write(&self, name: &str, contents: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).expect("write a test file");
        path.display().to_string()
    }

    /// A rustls server config presenting a leaf for `names`, offering `alpn`.
    pub fn server(&self, names: &[&str], alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let (chain, key) = self.leaf(names);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a backend answers a request with.
#[derive(Clone, Debug)]
pub enum Reply {
    /// This status, `x-backend` naming the backend, the body, and these trailers (if any).
    Ok {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// The head, then the stream reset (the body fails).
    ResetAfterHead,
    /// The stream reset before any head (the service fails).
    Reset,
    /// No answer, ever (the stream stays open).
    Hang,
}

impl Reply {
    /// A 200 with `body`.
    pub fn text(body: &str) -> Reply {
        Reply::Ok {
            status: 200,
            headers: Vec::new(),
            body: Bytes::copy_from_slice(body.as_bytes()),
            trailers: None,
        }
    }
}

/// How a backend decides its reply: from the request's method, path and headers.
pub type Script = Arc<dyn Fn(&http::request::Parts) -> Reply + Send + Sync>;

/// The protocol a backend speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaks {
    /// HTTP/1.1 with keep-alive.
    Http1,
    /// HTTP/2 (prior knowledge over TCP, or by ALPN over TLS).
    H2,
}

/// A hyper backend on an ephemeral port.
pub struct HttpBackend {
    pub name: String,
    pub addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    resumed: Arc<AtomicU64>,
    hits: Arc<AtomicU64>,
    go_away: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpBackend {
    /// Starts a backend named `name` speaking `speaks`, over TLS with `tls` when given, that
    /// answers by `script` (the request body is read to its end first).
    pub async fn start(
        name: &str,
        speaks: Speaks,
        tls: Option<Arc<rustls::ServerConfig>>,
        script: Script,
    ) -> HttpBackend {
        let listener = TcpListener::bind(any()).await.expect("bind backend");
        let addr = listener.local_addr().expect("backend address");
        let accepted = Arc::new(AtomicU64::new(0));
        let resumed = Arc::new(AtomicU64::new(0));
        let hits = Arc::new(AtomicU64::new(0));
        let (go_away, go_away_rx) = watch::channel(0u64);
        let backend_name = name.to_owned();
        let task = {
            let accepted = accepted.clone();
            let resumed = resumed.clone();
            let hits = hits.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    accepted.fetch_add(1, Ordering::Relaxed);
                    let tls = tls.clone();
                    let script = script.clone();
                    let hits = hits.clone();
                    let resumed = resumed.clone();
                    let name = backend_name.clone();
                    let go_away = go_away_rx.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            hits.fetch_add(1, Ordering::Relaxed);
                            answer(request, script.clone(), name.clone())
                        });
                        match tls {
                            None => serve(TokioIo::new(tcp), speaks, service, go_away).await,
                            Some(config) => {
                                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                                let Ok(stream) = acceptor.accept(tcp).await else {
                                    return;
                                };
                                let kind = stream.get_ref().1.handshake_kind();
                                if kind == Some(rustls::HandshakeKind::Resumed) {
                                    resumed.fetch_add(1, Ordering::Relaxed);
                                }
                                serve(TokioIo::new(stream), speaks, service, go_away).await;
                            }
                        }
                    });
                }
            })
        };
        HttpBackend {
            name: name.to_owned(),
            addr,
            accepted,
            resumed,
            hits,
            go_away,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// TLS handshakes that resumed a session (no certificate sent), so far.
    pub fn resumed(&self) -> u64 {
        self.resumed.load(Ordering::Relaxed)
    }

    /// Requests received so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Shuts every open connection down gracefully (HTTP/2: GOAWAY; in-flight streams end).
    /// New connections are still accepted.
    pub fn go_away(&self) {
        self.go_away.send_modify(|n| *n += 1);
    }

    /// `(name, address)` for a config.
    pub fn entry(&self) -> (String, SocketAddr) {
        (self.name.clone(), self.addr)
    }
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<I, S>(io: I, speaks: Speaks, service: S, mut go_away: watch::Receiver<u64>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = Frames> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    go_away.mark_unchanged();
    match speaks {
        Speaks::Http1 => {
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                _ = &mut conn => return,
                _ = go_away.changed() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        }
        Speaks::H2 => {
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                _ = &mut conn => return,
                _ = go_away.changed() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        }
    }
}

async fn answer(
    request: Request<Incoming>,
    script: Script,
    name: String,
) -> Result<Response<Frames>, io::Error> {
    use http_body_util::BodyExt;
    let (parts, body) = request.into_parts();
    let _ = body.collect().await;
    match script(&parts) {
        Reply::Ok {
            status,
            headers,
            body,
            trailers,
        } => {
            let mut frames = VecDeque::new();
            if !body.is_empty() {
                frames.push_back(Ok(Frame::data(body)));
            }
            if let Some(trailers) = trailers {
                frames.push_back(Ok(Frame::trailers(trailers)));
            }
            let mut response = Response::new(Frames(frames));
            *response.status_mut() = http::StatusCode::from_u16(status).expect("a status");
            response
                .headers_mut()
                .insert("x-backend", name.parse().expect("a header value"));
            for (key, value) in headers {
                response
                    .headers_mut()
                    .append(key, value.parse().expect("a header value"));
            }
            Ok(response)
        }
        Reply::ResetAfterHead => {
            let frames = VecDeque::from([
                Ok(Frame::data(Bytes::from_static(b"partial"))),
                Err(io::Error::other("reset by the script")),
            ]);
            Ok(Response::new(Frames(frames)))
        }
        Reply::Reset => Err(io::Error::other("reset by the script")),
        Reply::Hang => std::future::pending().await,
    }
}

/// A response body of scripted frames (data, trailers, an error).
pub struct Frames(VecDeque<Result<Frame<Bytes>, io::Error>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        Poll::Ready(self.get_mut().0.pop_front())
    }
}
