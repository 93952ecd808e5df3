//! TLS passthrough routed by SNI: a tcp listener with `[[listeners.sni_routes]]` reads the
//! client's ClientHello (bounded: [`MAX_CLIENT_HELLO`] bytes within `inspect_timeout`), takes
//! the server name from it, picks the route's pool (or the listener's `pool` for no SNI, no
//! match, or bytes that are not TLS), and relays the session there as any tcp session, the
//! bytes read replayed first, exactly as they came. TLS is never terminated.
//!
//! The ClientHello is parsed by rustls (`server::Acceptor`), never by hand: it joins a
//! ClientHello split across records and reads, and refuses what is not one.
//!
//! Invariants: nothing is charged to a backend before one is picked (a client that is late,
//! closes, or sends too much is the client's); a session reads at most
//! [`MAX_CLIENT_HELLO`] bytes while inspecting (plus the `Acceptor`'s own buffer of them),
//! released to the relay as its first bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capataz_proxy_protocol::Rewind;
use rustls::server::Acceptor;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::{Target, TcpRelay};
use crate::access_log::{AccessRecord, EndedBy, Phase, Termination};
use crate::balance::PoolHandle;
use crate::config::{SniRouting, MAX_CLIENT_HELLO};
use crate::instruments::Families;

/// A listener's routes by SNI, each with its pool.
#[derive(Debug)]
pub(super) struct SniRoutes {
    routing: SniRouting,
    /// The pool of each route, by index.
    targets: Vec<Target>,
}

impl SniRoutes {
    /// The routes of `routing` to their pools among `pools`, counting into `families`.
    pub(super) fn new(
        routing: &SniRouting,
        pools: &[Arc<PoolHandle>],
        families: &Families,
    ) -> Option<SniRoutes> {
        let targets = routing
            .routes
            .iter()
            .map(|route| Target::new(pools, route.pool, families))
            .collect::<Option<Vec<_>>>()?;
        Some(SniRoutes {
            routing: routing.clone(),
            targets,
        })
    }
}

/// What the first bytes of a session came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Inspected {
    /// A whole ClientHello, and the server name it asks for (lowercase), if any.
    Hello(Option<String>),
    /// Bytes that are not a TLS ClientHello (or one rustls refuses).
    NotTls,
    /// The client sent its FIN before a whole ClientHello.
    Closed,
    /// The client's connection failed (a reset).
    Broke,
    /// [`MAX_CLIENT_HELLO`] bytes did not hold a whole ClientHello.
    TooLarge,
    /// No whole ClientHello within the inspect timeout.
    Late,
}

/// Reads from `client` until the bytes read hold a whole ClientHello, are not TLS, or
/// [`MAX_CLIENT_HELLO`] bytes did not do; at most `timeout`. The bytes read are returned with
/// what they came to, to be replayed to the backend.
pub(super) async fn inspect<C>(client: &mut C, timeout: Duration) -> (Vec<u8>, Inspected)
where
    C: AsyncRead + Unpin,
{
    let mut read = Vec::new();
    let inspected = tokio::time::timeout(timeout, read_hello(client, &mut read)).await;
    (read, inspected.unwrap_or(Inspected::Late))
}

/// [`inspect`] without its timeout.
async fn read_hello<C>(client: &mut C, read: &mut Vec<u8>) -> Inspected
where
    C: AsyncRead + Unpin,
{
    let mut acceptor = Acceptor::default();
    const CHUNK: usize = 2048;
    let mut chunk = [0u8; CHUNK];
    loop {
        let room = MAX_CLIENT_HELLO - read.len();
        if room == 0 {
            return Inspected::TooLarge;
        }
        let n = match client.read(&mut chunk[..room.min(CHUNK)]).await {
            Ok(0) => return Inspected::Closed,
            Ok(n) => n,
            Err(_) => return Inspected::Broke,
        };
        read.extend_from_slice(&chunk[..n]);
        let mut fresh = &chunk[..n];
        while !fresh.is_empty() {
            match acceptor.read_tls(&mut fresh) {
                Ok(0) | Err(_) => return Inspected::NotTls,
                Ok(_) => {}
            }
        }
        match acceptor.accept() {
            Ok(None) => {}
            Ok(Some(accepted)) => {
                let name = accepted.client_hello().server_name().map(str::to_owned);
                return Inspected::Hello(name);
            }
            Err(_) => return Inspected::NotTls,
        }
    }
}

/// A passthrough session: `client`'s ClientHello inspected, then relayed to its route's pool
/// (or the listener's), or closed and logged in `record` when there is none.
pub(super) async fn serve<C>(
    relay: &TcpRelay,
    routes: &SniRoutes,
    mut client: C,
    addresses: (SocketAddr, SocketAddr),
    mut record: Option<Box<AccessRecord>>,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (read, inspected) = inspect(&mut client, routes.routing.inspect_timeout).await;
    let closed = |ended_by, reason| {
        (
            Termination {
                ended_by,
                phase: Phase::Inspect,
            },
            reason,
        )
    };
    let (sni, refused) = match inspected {
        Inspected::Hello(sni) => (sni, None),
        Inspected::NotTls => (None, None),
        Inspected::Closed | Inspected::Broke => (None, Some(closed(EndedBy::Client, None))),
        Inspected::Late => (None, Some(closed(EndedBy::Timeout, None))),
        Inspected::TooLarge => (
            None,
            Some(closed(EndedBy::Capataz, Some("client_hello_too_large"))),
        ),
    };
    let matched = sni.as_deref().and_then(|name| routes.routing.route(name));
    if let Some(record) = &mut record {
        record.bytes_in = Some(read.len() as u64);
        // A DNS name (rustls checks it), well within the log's field limit.
        record.sni = sni.clone();
        record.route = matched.map(|found| found.pattern.as_written());
    }
    let target = match (refused, matched) {
        (Some(refused), _) => {
            tracing::debug!(peer = %addresses.0, ?refused, "TLS passthrough session closed before routing");
            return close(relay, record, refused, read.len());
        }
        (None, Some(found)) => &routes.targets[found.route],
        (None, None) => match &relay.default {
            Some(target) => target,
            None => {
                let termination = Termination {
                    ended_by: EndedBy::Capataz,
                    phase: Phase::Inspect,
                };
                let refused = (termination, Some("no_sni_route"));
                return close(relay, record, refused, read.len());
            }
        },
    };
    if let Some(record) = &mut record {
        record.pool = Some(target.pool.name.clone());
    }
    let read_len = read.len() as u64;
    let client = Rewind::new(Bytes::from(read), client);
    if !relay.relay_to(target, client, addresses, record).await {
        // No backend took the session: the ClientHello read is counted here, as the line's
        // bytes_in says (a relayed session counts it among the bytes it relayed).
        relay.metrics.add_bytes(read_len, 0);
    }
}

/// Counts and logs a session closed before it reached a pool (none in its line), having read
/// `read` bytes: nothing is charged to any backend.
fn close(
    relay: &TcpRelay,
    mut record: Option<Box<AccessRecord>>,
    (termination, reason): (Termination, Option<&'static str>),
    read: usize,
) {
    relay.metrics.add_bytes(read as u64, 0);
    if let Some(record) = &mut record {
        record.pool = None;
        record.termination = termination;
        record.reason = reason;
    }
    relay.log(record);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::ServerName;
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A real ClientHello for `sni` (an IP address: none sent), as a client's first flight.
    fn client_hello(sni: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = ServerName::try_from(sni.to_owned()).expect("a name");
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("a client");
        let mut hello = Vec::new();
        conn.write_tls(&mut hello).expect("the ClientHello");
        hello
    }

    /// What `inspect` makes of `chunks` written one by one, then a FIN when `fin`.
    async fn check(chunks: Vec<Vec<u8>>, fin: bool) -> (Vec<u8>, Inspected) {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            for chunk in chunks {
                let _ = client.write_all(&chunk).await;
                tokio::task::yield_now().await;
            }
            if fin {
                let _ = client.shutdown().await;
            }
            // Held open until the inspection is over.
            client
        });
        let inspected = inspect(&mut server, Duration::from_secs(5)).await;
        drop(writer);
        inspected
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_hello_in_any_split_gives_its_name_and_its_exact_bytes() {
        let hello = client_hello("Shop.Example.com");
        for size in [1, 7, hello.len()] {
            let chunks = hello.chunks(size).map(<[u8]>::to_vec).collect();
            let (read, inspected) = check(chunks, false).await;
            assert_eq!(inspected, Inspected::Hello(Some("shop.example.com".into())));
            assert_eq!(read, hello, "every byte kept for the backend, in order");
        }
        let (_, inspected) = check(vec![client_hello("10.0.0.1")], false).await;
        assert_eq!(inspected, Inspected::Hello(None), "an IP address is no SNI");
    }

    #[tokio::test(start_paused = true)]
    async fn hostile_first_bytes_end_the_inspection_bounded() {
        let (read, inspected) = check(vec![b"GET / HTTP/1.1\r\n\r\n".to_vec()], false).await;
        assert_eq!((read.len(), inspected), (18, Inspected::NotTls));
        let hello = client_hello("a.test");
        let half = hello[..hello.len() / 2].to_vec();
        assert_eq!(check(vec![half.clone()], true).await.1, Inspected::Closed);
        assert_eq!(check(vec![], true).await.1, Inspected::Closed);
        // A part, then nothing: the timeout (paused time passes it at once).
        assert_eq!(check(vec![half], false).await.1, Inspected::Late);
        // Records that announce a 60000-byte ClientHello: cut at the limit.
        let mut huge = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0xea, 0x60];
        huge.resize(3 * (5 + 16384), 0);
        let (read, inspected) = check(vec![huge], false).await;
        assert_eq!(
            (read.len(), inspected),
            (MAX_CLIENT_HELLO, Inspected::TooLarge)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_after_the_client_hello_and_split_records_are_kept_in_order() {
        let hello = client_hello("shop.example.com");
        // The ClientHello then more (early data, a second record) in the same read.
        let mut more = hello.clone();
        more.extend_from_slice(&[0x17, 0x03, 0x03, 0x00, 0x04, b'd', b'a', b't', b'a']);
        let (read, inspected) = check(vec![more.clone()], false).await;
        assert_eq!(inspected, Inspected::Hello(Some("shop.example.com".into())));
        assert_eq!(read, more, "the bytes after the ClientHello kept too");
        // The handshake message split across two TLS records.
        let body = &hello[5..];
        let cut = body.len() / 3;
        let mut split = Vec::new();
        for part in [&body[..cut], &body[cut..]] {
            split.extend_from_slice(&[0x16, 0x03, 0x01]);
            split.extend_from_slice(&(part.len() as u16).to_be_bytes());
            split.extend_from_slice(part);
        }
        let (read, inspected) = check(vec![split.clone()], false).await;
        assert_eq!(inspected, Inspected::Hello(Some("shop.example.com".into())));
        assert_eq!(read, split);
        // An SSLv2-style ClientHello (the high bit of its first byte): not TLS, kept whole.
        let sslv2 = [
            0x80, 0x0b, 0x01, 0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0, 0,
        ];
        let (read, inspected) = check(vec![sslv2.to_vec()], false).await;
        assert_eq!((read, inspected), (sslv2.to_vec(), Inspected::NotTls));
    }
}
