//! DNS-01 (RFC 8555, section 8.4) by RFC 2136 dynamic updates: the TXT record
//! `_acme-challenge.<domain>` holding the key authorization's digest is added on the configured
//! primary server, the server is asked until it answers with the record (bounded by
//! `propagation_timeout`), and every record added is deleted again once the order ends, however
//! it ends (validated, failed, timed out, or the task stopped by a shutdown).
//!
//! The messages are hickory-proto's (the UPDATE builders and the TSIG signer, RFC 8945, HMAC by
//! ring); the transport is ours: one TCP connection per exchange (RFC 1035's two-byte length
//! prefix), each bounded by [`EXCHANGE_TIMEOUT`]. An update's answer must carry the key's
//! signature, so a forged "NOERROR" cannot make capataz tell the CA to validate.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hickory_proto::op::{update_message, Message, Query, ResponseCode};
use hickory_proto::rr::rdata::tsig::{TsigAlgorithm as HickoryAlgorithm, TsigError};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{Name, RData, RecordSet, RecordType, TSigner};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use capataz_tls::acme::{Dns01Settings, TsigAlgorithm};

/// The longest one exchange with the DNS server (connect, send, answer) may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The clock difference the server accepts on a signature (RFC 8945 recommends 300 s).
const FUDGE: u16 = 300;

/// Why a DNS-01 step failed: part of the `error` of the `ACME order failed` line.
#[derive(Debug, thiserror::Error)]
pub(super) enum Dns01Error {
    #[error("the DNS server {server}: {source}")]
    Io {
        server: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the DNS server {server} did not answer within {EXCHANGE_TIMEOUT:?}")]
    Timeout { server: SocketAddr },
    #[error("the DNS server {server} sent an unreadable answer: {why}")]
    Malformed { server: SocketAddr, why: String },
    #[error(
        "the DNS server {server} refused to {action} {name}: {code}{}",
        tsig.map(|e| format!(", TSIG error {e:?} (check tsig_key, tsig_algorithm and the secret, and that the key may update the zone)")).unwrap_or_default()
    )]
    Refused {
        server: SocketAddr,
        action: &'static str,
        name: String,
        code: ResponseCode,
        tsig: Option<TsigError>,
    },
    #[error("the DNS server {server}'s answer to the update of {name} is not signed with the key: {why}")]
    Unsigned {
        server: SocketAddr,
        name: String,
        why: String,
    },
    #[error("the DNS server {server} names no zone holding {name} (set zone)")]
    NoZone { server: SocketAddr, name: String },
    #[error("{name} is not in zone {zone}")]
    NotInZone { name: String, zone: String },
    #[error("the TXT record {name} was not visible on {server} after {after:?} (raise propagation_timeout?)")]
    NotVisible {
        server: SocketAddr,
        name: String,
        after: Duration,
    },
    #[error("a DNS name or key: {0}")]
    Name(String),
}

/// Publishes and removes the TXT records of one listener's DNS-01 challenges; remembers what
/// it added until [`Dns01Records::remove_all`] deletes it.
pub(super) struct Dns01Records {
    settings: Option<Dns01Settings>,
    published: Mutex<Vec<Published>>,
}

#[derive(Clone)]
struct Published {
    name: Name,
    zone: Name,
    value: String,
}

impl Dns01Records {
    /// For `settings` (`None`: the listener answers another challenge, and nothing is done).
    pub(super) fn new(settings: Option<Dns01Settings>) -> Dns01Records {
        Dns01Records {
            settings,
            published: Mutex::new(Vec::new()),
        }
    }

    fn settings(&self) -> Result<&Dns01Settings, Dns01Error> {
        self.settings
            .as_ref()
            .ok_or_else(|| Dns01Error::Name("no [listeners.tls.acme.dns01] settings".into()))
    }

    fn published_lock(&self) -> std::sync::MutexGuard<'_, Vec<Published>> {
        // Pushes and drains only: a panic cannot leave the list half-written.
        self.published.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `_acme-challenge.<domain>` TXT `value` (kept for [`Dns01Records::remove_all`]
    /// before it is sent, so a lost answer is cleaned up too).
    pub(super) async fn add(&self, domain: &str, value: &str) -> Result<(), Dns01Error> {
        let settings = self.settings()?;
        let name = challenge_name(domain)?;
        let zone = zone_for(settings, &name).await?;
        if !zone.zone_of(&name) {
            return Err(Dns01Error::NotInZone {
                name: name.to_string(),
                zone: zone.to_string(),
            });
        }
        let published = Published {
            name,
            zone,
            value: value.to_owned(),
        };
        self.published_lock().push(published.clone());
        let ttl = u32::try_from(settings.ttl.as_secs()).unwrap_or(u32::MAX);
        let update = update_message::append(txt_set(&published, ttl), published.zone, false, false);
        send_update(settings, update, "add", &published.name).await
    }

    /// Waits until the server answers every added record, asking every 500 ms, at most
    /// `propagation_timeout`.
    pub(super) async fn wait_visible(&self) -> Result<(), Dns01Error> {
        let settings = self.settings()?;
        let records = self.published_lock().clone();
        let start = tokio::time::Instant::now();
        for record in &records {
            loop {
                if visible(settings.server, record).await? {
                    break;
                }
                if start.elapsed() >= settings.propagation_timeout {
                    return Err(Dns01Error::NotVisible {
                        server: settings.server,
                        name: record.name.to_string(),
                        after: settings.propagation_timeout,
                    });
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Ok(())
    }

    /// Deletes every record added (each a single TXT value: others' records at the same name
    /// stay). A failure is logged and the record forgotten: a stale TXT record is harmless.
    pub(super) async fn remove_all(&self, listener: &str) {
        let Some(settings) = self.settings.as_ref() else {
            return;
        };
        let records: Vec<Published> = self.published_lock().drain(..).collect();
        for record in records {
            let ttl = u32::try_from(settings.ttl.as_secs()).unwrap_or(u32::MAX);
            let update =
                update_message::delete_by_rdata(txt_set(&record, ttl), record.zone.clone(), false);
            match send_update(settings, update, "delete", &record.name).await {
                Ok(()) => {
                    tracing::debug!(listener, name = %record.name, "DNS-01 TXT record removed")
                }
                Err(error) => tracing::warn!(
                    listener,
                    name = %record.name,
                    error = %error,
                    "the DNS-01 TXT record could not be removed"
                ),
            }
        }
    }
}

/// `_acme-challenge.<domain>.` (a wildcard's authorization names the domain without `*.`).
fn challenge_name(domain: &str) -> Result<Name, Dns01Error> {
    let base = domain.strip_prefix("*.").unwrap_or(domain);
    Name::from_ascii(format!("_acme-challenge.{}.", base.trim_end_matches('.')))
        .map_err(|e| Dns01Error::Name(e.to_string()))
}

fn txt_set(record: &Published, ttl: u32) -> RecordSet {
    let mut set = RecordSet::with_ttl(record.name.clone(), RecordType::TXT, ttl);
    set.add_rdata(RData::TXT(TXT::new(vec![record.value.clone()])));
    set
}

/// The configured zone, or the one whose SOA the server gives for `name`.
async fn zone_for(settings: &Dns01Settings, name: &Name) -> Result<Name, Dns01Error> {
    if let Some(zone) = &settings.zone {
        return Name::from_ascii(format!("{zone}.")).map_err(|e| Dns01Error::Name(e.to_string()));
    }
    let answer = query(settings.server, name, RecordType::SOA).await?;
    answer
        .answers
        .iter()
        .chain(&answer.authorities)
        .find(|r| matches!(r.data, RData::SOA(_)))
        .map(|r| r.name.clone())
        .ok_or_else(|| Dns01Error::NoZone {
            server: settings.server,
            name: name.to_string(),
        })
}

/// Whether the server answers `record`'s TXT value.
async fn visible(server: SocketAddr, record: &Published) -> Result<bool, Dns01Error> {
    let answer = query(server, &record.name, RecordType::TXT).await?;
    Ok(answer.answers.iter().any(|r| match &r.data {
        RData::TXT(txt) => txt.txt_data.concat() == record.value.as_bytes(),
        _ => false,
    }))
}

/// An unsigned query for `name`/`kind`; an answer other than NOERROR or NXDOMAIN is an error.
async fn query(server: SocketAddr, name: &Name, kind: RecordType) -> Result<Message, Dns01Error> {
    let mut message = Message::query();
    message.metadata.recursion_desired = false;
    message.add_query(Query::query(name.clone(), kind));
    let bytes = encode(server, &message)?;
    let answer = decode(server, &exchange(server, &bytes).await?)?;
    match answer.metadata.response_code {
        ResponseCode::NoError | ResponseCode::NXDomain if answer.metadata.id == message.id => {
            Ok(answer)
        }
        code => Err(Dns01Error::Refused {
            server,
            action: "answer a query for",
            name: name.to_string(),
            code,
            tsig: None,
        }),
    }
}

/// Signs `update`, sends it, and checks the answer is NOERROR and signed with the key.
async fn send_update(
    settings: &Dns01Settings,
    mut update: Message,
    action: &'static str,
    name: &Name,
) -> Result<(), Dns01Error> {
    let server = settings.server;
    let signer = signer(settings)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut verifier = update
        .finalize(&signer, now)
        .map_err(|e| Dns01Error::Name(e.to_string()))?
        .ok_or_else(|| Dns01Error::Name("the TSIG signer gave no verifier".into()))?;
    let bytes = encode(server, &update)?;
    let answer_bytes = exchange(server, &bytes).await?;
    let answer = decode(server, &answer_bytes)?;
    let code = answer.metadata.response_code;
    if code != ResponseCode::NoError || answer.metadata.id != update.metadata.id {
        return Err(Dns01Error::Refused {
            server,
            action,
            name: name.to_string(),
            code,
            tsig: answer.signature.as_ref().and_then(|s| s.data.error),
        });
    }
    verifier
        .verify(&answer_bytes)
        .map_err(|e| Dns01Error::Unsigned {
            server,
            name: name.to_string(),
            why: e.to_string(),
        })?;
    Ok(())
}

fn signer(settings: &Dns01Settings) -> Result<TSigner, Dns01Error> {
    let algorithm = match settings.tsig_algorithm {
        TsigAlgorithm::HmacSha256 => HickoryAlgorithm::HmacSha256,
        TsigAlgorithm::HmacSha384 => HickoryAlgorithm::HmacSha384,
        TsigAlgorithm::HmacSha512 => HickoryAlgorithm::HmacSha512,
    };
    let key = Name::from_ascii(format!("{}.", settings.tsig_key))
        .map_err(|e| Dns01Error::Name(e.to_string()))?;
    TSigner::new(settings.tsig_secret.0.clone(), algorithm, key, FUDGE)
        .map_err(|e| Dns01Error::Name(e.to_string()))
}

fn encode(server: SocketAddr, message: &Message) -> Result<Vec<u8>, Dns01Error> {
    message.to_vec().map_err(|e| Dns01Error::Malformed {
        server,
        why: format!("encoding the request: {e}"),
    })
}

fn decode(server: SocketAddr, bytes: &[u8]) -> Result<Message, Dns01Error> {
    Message::from_vec(bytes).map_err(|e| Dns01Error::Malformed {
        server,
        why: e.to_string(),
    })
}

/// One request and its answer over a new TCP connection, at most [`EXCHANGE_TIMEOUT`].
async fn exchange(server: SocketAddr, request: &[u8]) -> Result<Vec<u8>, Dns01Error> {
    let io = |source| Dns01Error::Io { server, source };
    let work = async {
        let mut stream = tokio::net::TcpStream::connect(server).await.map_err(io)?;
        let length = u16::try_from(request.len()).map_err(|_| Dns01Error::Malformed {
            server,
            why: "the request is longer than 65535 bytes".into(),
        })?;
        let mut framed = Vec::with_capacity(request.len() + 2);
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(request);
        stream.write_all(&framed).await.map_err(io)?;
        let length = stream.read_u16().await.map_err(io)?;
        let mut answer = vec![0; usize::from(length)];
        stream.read_exact(&mut answer).await.map_err(io)?;
        Ok(answer)
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, work)
        .await
        .map_err(|_| Dns01Error::Timeout { server })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use capataz_tls::acme::TsigSecret;

    /// A server on loopback that reads one length-prefixed request per connection and answers
    /// with what `answer` makes of it (raw bytes, the length prefix included).
    async fn hostile(
        answer: impl Fn(&Message) -> Vec<u8> + Send + Sync + 'static,
    ) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let Ok(length) = socket.read_u16().await else {
                    continue;
                };
                let mut request = vec![0; usize::from(length)];
                if socket.read_exact(&mut request).await.is_err() {
                    continue;
                }
                let request = Message::from_vec(&request).expect("a DNS message");
                let _ = socket.write_all(&answer(&request)).await;
                // Held open: the client ends the exchange.
                let mut rest = Vec::new();
                let _ = socket.read_to_end(&mut rest).await;
            }
        });
        (addr, task)
    }

    fn settings(server: SocketAddr) -> Dns01Settings {
        Dns01Settings {
            server,
            zone: Some("test".into()),
            tsig_key: "k".into(),
            tsig_algorithm: TsigAlgorithm::HmacSha256,
            tsig_secret: TsigSecret(vec![7; 32]),
            ttl: Duration::from_secs(60),
            propagation_timeout: Duration::from_secs(1),
        }
    }

    fn framed(message: &Message) -> Vec<u8> {
        let bytes = message.to_vec().unwrap();
        let mut framed = u16::try_from(bytes.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&bytes);
        framed
    }

    #[tokio::test]
    async fn an_unsigned_noerror_to_an_update_is_refused_and_the_record_kept_for_cleanup() {
        let (addr, task) = hostile(|request| {
            framed(&Message::response(
                request.metadata.id,
                request.metadata.op_code,
            ))
        })
        .await;
        let records = Dns01Records::new(Some(settings(addr)));
        let error = records.add("a.test", "value").await.expect_err("unsigned");
        assert!(matches!(error, Dns01Error::Unsigned { .. }), "{error}");
        assert!(
            error.to_string().contains("is not signed with the key"),
            "{error}"
        );
        // What was sent is remembered, so the cleanup tries to delete it.
        assert_eq!(records.published_lock().len(), 1);
        task.abort();
    }

    #[tokio::test]
    async fn a_refusal_names_the_code_and_the_tsig_error() {
        let (addr, task) = hostile(|request| {
            let mut answer = Message::error_msg(
                request.metadata.id,
                request.metadata.op_code,
                ResponseCode::NotAuth,
            );
            let mut tsig = request.signature.clone().expect("a signed update");
            tsig.data.error = Some(TsigError::BadKey);
            tsig.data.mac = Vec::new();
            answer.set_signature(tsig);
            framed(&answer)
        })
        .await;
        let records = Dns01Records::new(Some(settings(addr)));
        let error = records.add("a.test", "value").await.expect_err("refused");
        let text = error.to_string();
        assert!(
            text.contains(
                "refused to add _acme-challenge.a.test.: Not authorized, TSIG error BadKey"
            ),
            "{text}"
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_length_prefix_longer_than_what_follows_is_an_error_not_a_hang() {
        let (addr, task) = hostile(|_| vec![0xff, 0xff, 0, 1, 2]).await;
        // The server holds the connection open after its five bytes: the exchange's bound ends it.
        let records = Dns01Records::new(Some(settings(addr)));
        let started = tokio::time::Instant::now();
        let error = records.add("a.test", "value").await.expect_err("short");
        assert!(matches!(error, Dns01Error::Timeout { .. }), "{error}");
        assert!(started.elapsed() < EXCHANGE_TIMEOUT * 2);
        task.abort();
    }

    #[tokio::test]
    async fn a_name_outside_the_zone_is_refused_before_any_update() {
        let records = Dns01Records::new(Some(settings(([127, 0, 0, 1], 9).into())));
        let error = records
            .add("a.example", "value")
            .await
            .expect_err("outside");
        assert!(matches!(error, Dns01Error::NotInZone { .. }), "{error}");
        assert!(records.published_lock().is_empty());
    }

    #[test]
    fn a_wildcard_is_proved_at_its_base_name() {
        assert_eq!(
            challenge_name("*.example.test")
                .expect("a name")
                .to_string(),
            "_acme-challenge.example.test."
        );
        assert_eq!(
            challenge_name("www.example.test")
                .expect("a name")
                .to_string(),
            "_acme-challenge.www.example.test."
        );
    }
}
