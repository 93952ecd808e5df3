//! A real HTTP/3 client for the tests: quinn (QUIC) and hyperium's h3 over it, trusting a test
//! PKI's CA, as a browser would after reading `Alt-Svc`.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use h3::client::{RequestStream, SendRequest};
use http::{HeaderMap, Request, Response};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

use super::tls::Pki;

/// One HTTP/3 connection.
pub struct H3Client {
    pub endpoint: quinn::Endpoint,
    pub connection: quinn::Connection,
    pub send: SendRequest<h3_quinn::OpenStreams, Bytes>,
    /// The connection's driver (ends when the connection does), with its closing error.
    pub driver: tokio::task::JoinHandle<h3::error::ConnectionError>,
}

/// A finished exchange.
pub struct Answer {
    pub head: Response<()>,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.headers().get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The QUIC client configuration: `pki`'s CA trusted, ALPN `h3`.
pub fn client_config(pki: &Pki) -> quinn::ClientConfig {
    client_config_alpn(pki, &[b"h3"])
}

/// The QUIC client configuration: `pki`'s CA trusted, offering the ALPN ids `alpn`.
pub fn client_config_alpn(pki: &Pki, alpn: &[&[u8]]) -> quinn::ClientConfig {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.ca_path()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = alpn.iter().map(|id| id.to_vec()).collect();
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls)).unwrap();
    quinn::ClientConfig::new(Arc::new(quic))
}

/// Connects to `addr` (UDP) asking for `sni`.
pub async fn connect(pki: &Pki, addr: SocketAddr, sni: &str) -> Result<H3Client, String> {
    connect_with(client_config(pki), addr, sni).await
}

/// Connects to `addr` (UDP) asking for `sni`, with `config`.
pub async fn connect_with(
    config: quinn::ClientConfig,
    addr: SocketAddr,
    sni: &str,
) -> Result<H3Client, String> {
    let mut endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).map_err(|e| e.to_string())?;
    endpoint.set_default_client_config(config);
    let connection = endpoint
        .connect(addr, sni)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(connection.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move { driver.wait_idle().await });
    Ok(H3Client {
        endpoint,
        connection,
        send,
        driver,
    })
}

impl H3Client {
    /// Opens a request stream and sends `request`'s head (and its body, then the end, when
    /// `body` is given; else the stream stays open for the caller to write).
    pub async fn start(
        &mut self,
        request: Request<()>,
        body: Option<&[u8]>,
    ) -> Result<RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>, String> {
        let mut stream = self
            .send
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(body) = body {
            if !body.is_empty() {
                stream
                    .send_data(Bytes::copy_from_slice(body))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            stream.finish().await.map_err(|e| e.to_string())?;
        }
        Ok(stream)
    }

    /// Sends `request` with `body` and reads the whole answer.
    pub async fn exchange(&mut self, request: Request<()>, body: &[u8]) -> Result<Answer, String> {
        let mut stream = self.start(request, Some(body)).await?;
        read_answer(&mut stream).await
    }

    /// `GET https://{authority}{path}`.
    pub async fn get(&mut self, authority: &str, path: &str) -> Result<Answer, String> {
        let request = Request::get(format!("https://{authority}{path}"))
            .body(())
            .unwrap();
        self.exchange(request, b"").await
    }
}

/// Reads an answer to its end.
pub async fn read_answer(
    stream: &mut RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
) -> Result<Answer, String> {
    let head = stream.recv_response().await.map_err(|e| e.to_string())?;
    let mut body = BytesMut::new();
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
        body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    let trailers = stream.recv_trailers().await.map_err(|e| e.to_string())?;
    Ok(Answer {
        head,
        body: body.freeze(),
        trailers,
    })
}

/// Whether the server presented the certificate in the PEM file `cert` on `connection`.
pub fn presented(connection: &quinn::Connection, cert: &std::path::Path) -> bool {
    let shown = connection
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .expect("a server certificate");
    shown[0] == CertificateDer::from_pem_file(cert).expect("a PEM certificate")
}
