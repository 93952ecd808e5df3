//! A hostile DNS server for the tests, on 127.0.0.1 and an ephemeral port, UDP and TCP: it
//! answers each name and record type as the test scripts it ([`Reply`]): records, NODATA,
//! NXDOMAIN, or what a broken or malicious server sends: nothing (the query times out), an
//! owner name that is a compression pointer to itself, an answer count of 65535 with one
//! record, a truncated answer whose TCP retry is closed unanswered. Real bytes on the wire,
//! read by capataz's real resolver; what Knot DNS ([`super::knot`]) will not send. It counts
//! the queries it gets per name and type, so a test waits for the resolver to have asked
//! again instead of sleeping. Its tasks end when it is dropped.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

/// A record type the server answers for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    /// IPv4 addresses.
    A,
    /// IPv6 addresses.
    Aaaa,
    /// Services.
    Srv,
}

impl Type {
    fn code(self) -> u16 {
        match self {
            Type::A => 1,
            Type::Aaaa => 28,
            Type::Srv => 33,
        }
    }
}

/// How the server answers a name and type.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A and AAAA records (the addresses of the type asked), TTL 1.
    Addresses(Vec<IpAddr>),
    /// SRV records: priority, weight, port, target (with its final dot), TTL 1.
    Srv(Vec<(u16, u16, u16, String)>),
    /// NOERROR, no record, the zone's SOA (NODATA).
    NoData,
    /// NXDOMAIN with the zone's SOA.
    NxDomain,
    /// SERVFAIL.
    ServFail,
    /// No answer at all: the query times out.
    Silent,
    /// One A record whose owner name is a compression pointer to itself.
    SelfPointer,
    /// An answer count of 65535 with one A record.
    CountLie,
    /// Over UDP, the first address with the truncation bit set; over TCP, the connection is
    /// closed without an answer.
    Truncated(Vec<IpAddr>),
}

type Script = HashMap<(String, Type), Reply>;

/// A running hostile server.
pub struct HostileDns {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    asked: Arc<Mutex<HashMap<(String, u16), usize>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl HostileDns {
    /// A server answering NXDOMAIN to everything until scripted ([`HostileDns::set`]).
    pub async fn start() -> HostileDns {
        // One port for both: TCP first (more of its ports are taken), then UDP on it.
        let (tcp, udp) = loop {
            let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind TCP");
            let addr = tcp.local_addr().expect("local address");
            if let Ok(udp) = UdpSocket::bind(addr).await {
                break (tcp, udp);
            }
        };
        let addr = udp.local_addr().expect("local address");
        let script = Arc::new(Mutex::new(Script::new()));
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let server = Server {
            script: script.clone(),
            asked: asked.clone(),
        };
        let tasks = vec![
            tokio::spawn(server.clone().serve_udp(udp)),
            tokio::spawn(server.serve_tcp(tcp)),
        ];
        HostileDns {
            addr,
            script,
            asked,
            tasks,
        }
    }

    /// The server's address, for `resolver = "..."`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers `name` (lowercase, with its final dot) and `kind` with `reply` from now on.
    pub fn set(&self, name: &str, kind: Type, reply: Reply) {
        let mut script = self.script.lock().expect("script lock");
        script.insert((name.to_owned(), kind), reply);
    }

    /// How many queries for `name` and `kind` came so far (UDP and TCP).
    pub fn asked(&self, name: &str, kind: Type) -> usize {
        let asked = self.asked.lock().expect("count lock");
        asked
            .get(&(name.to_owned(), kind.code()))
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for HostileDns {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[derive(Clone)]
struct Server {
    script: Arc<Mutex<Script>>,
    asked: Arc<Mutex<HashMap<(String, u16), usize>>>,
}

impl Server {
    async fn serve_udp(self, socket: UdpSocket) {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            if let Some(answer) = self.answer(&buf[..n], false) {
                let _ = socket.send_to(&answer, from).await;
            }
        }
    }

    async fn serve_tcp(self, listener: TcpListener) {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(self.clone().serve_connection(stream));
        }
    }

    /// Length-prefixed queries, one answer each; a `Silent` one is held open, unanswered,
    /// until the resolver gives up.
    async fn serve_connection(self, mut stream: TcpStream) {
        loop {
            let Ok(len) = stream.read_u16().await else {
                return;
            };
            let mut query = vec![0; usize::from(len)];
            if stream.read_exact(&mut query).await.is_err() {
                return;
            }
            match self.answer(&query, true) {
                Some(answer) => {
                    let mut framed = (answer.len() as u16).to_be_bytes().to_vec();
                    framed.extend(answer);
                    if stream.write_all(&framed).await.is_err() {
                        return;
                    }
                }
                None => return,
            }
        }
    }

    /// The answer to `query` as scripted, `None` for none. Counts the query.
    fn answer(&self, query: &[u8], tcp: bool) -> Option<Vec<u8>> {
        let (name, qtype, question) = parse(query)?;
        *self
            .asked
            .lock()
            .expect("count lock")
            .entry((name.clone(), qtype))
            .or_default() += 1;
        let kind = [Type::A, Type::Aaaa, Type::Srv]
            .into_iter()
            .find(|t| t.code() == qtype);
        let reply = kind
            .and_then(|k| {
                self.script
                    .lock()
                    .expect("script lock")
                    .get(&(name, k))
                    .cloned()
            })
            .unwrap_or(Reply::NxDomain);
        // Header: the query's ID and RD bit; QR and AA set; one question.
        let mut out = query[..2].to_vec();
        let rd = query[2] & 0x01;
        let header = |out: &mut Vec<u8>, tc: u8, rcode: u8, an: u16, ns: u16| {
            out.push(0x84 | (tc << 1) | rd);
            out.push(rcode);
            for count in [1, an, ns, 0] {
                out.extend(count.to_be_bytes());
            }
            out.extend(question);
        };
        match reply {
            Reply::Silent => return None,
            Reply::Truncated(_) if tcp => return None,
            Reply::Addresses(ips) => {
                let ips: Vec<&IpAddr> = ips.iter().filter(|ip| fits(ip, qtype)).collect();
                header(&mut out, 0, 0, ips.len() as u16, 0);
                for ip in ips {
                    address_record(&mut out, &[0xc0, 0x0c], ip);
                }
            }
            Reply::Truncated(ips) => {
                let first = ips.iter().find(|ip| fits(ip, qtype));
                header(&mut out, 1, 0, u16::from(first.is_some()), 0);
                if let Some(ip) = first {
                    address_record(&mut out, &[0xc0, 0x0c], ip);
                }
            }
            Reply::Srv(records) => {
                header(&mut out, 0, 0, records.len() as u16, 0);
                for (priority, weight, port, target) in records {
                    let mut rdata = Vec::new();
                    for field in [priority, weight, port] {
                        rdata.extend(field.to_be_bytes());
                    }
                    encode_name(&mut rdata, &target);
                    record(&mut out, &[0xc0, 0x0c], 33, &rdata);
                }
            }
            Reply::NoData | Reply::NxDomain => {
                let rcode = if matches!(reply, Reply::NxDomain) {
                    3
                } else {
                    0
                };
                header(&mut out, 0, rcode, 0, 1);
                let mut soa = Vec::new();
                encode_name(&mut soa, "ns.test.");
                encode_name(&mut soa, "admin.test.");
                for field in [1u32, 60, 60, 600, 1] {
                    soa.extend(field.to_be_bytes());
                }
                let mut owner = Vec::new();
                encode_name(&mut owner, "test.");
                record(&mut out, &owner, 6, &soa);
            }
            Reply::ServFail => header(&mut out, 0, 2, 0, 0),
            Reply::SelfPointer => {
                header(&mut out, 0, 0, 1, 0);
                // The owner name is a pointer to its own offset: reading it never ends.
                let at = out.len() as u16;
                let pointer = (0xc000 | at).to_be_bytes();
                address_record(&mut out, &pointer, &IpAddr::from([127, 0, 0, 9]));
            }
            Reply::CountLie => {
                header(&mut out, 0, 0, u16::MAX, 0);
                address_record(&mut out, &[0xc0, 0x0c], &IpAddr::from([127, 0, 0, 9]));
            }
        }
        Some(out)
    }
}

/// The query's name (lowercase, with its final dot), type, and question section as sent.
fn parse(query: &[u8]) -> Option<(String, u16, &[u8])> {
    if query.len() < 12 || query[4..6] != [0, 1] {
        return None;
    }
    let mut at = 12;
    let mut name = String::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // Queries carry no compression; a label is at most 63 bytes.
        if len > 63 {
            return None;
        }
        let label = query.get(at..at + len)?;
        name.push_str(&String::from_utf8_lossy(label).to_ascii_lowercase());
        name.push('.');
        at += len;
    }
    if name.is_empty() {
        name.push('.');
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question = query.get(12..at + 4)?;
    Some((name, qtype, question))
}

fn fits(ip: &IpAddr, qtype: u16) -> bool {
    matches!((ip, qtype), (IpAddr::V4(_), 1) | (IpAddr::V6(_), 28))
}

fn encode_name(out: &mut Vec<u8>, name: &str) {
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend(label.as_bytes());
    }
    out.push(0);
}

fn address_record(out: &mut Vec<u8>, owner: &[u8], ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => record(out, owner, 1, &v4.octets()),
        IpAddr::V6(v6) => record(out, owner, 28, &v6.octets()),
    }
}

/// A record of class IN and TTL 1.
fn record(out: &mut Vec<u8>, owner: &[u8], rtype: u16, rdata: &[u8]) {
    out.extend(owner);
    out.extend(rtype.to_be_bytes());
    out.extend(1u16.to_be_bytes());
    out.extend(1u32.to_be_bytes());
    out.extend((rdata.len() as u16).to_be_bytes());
    out.extend(rdata);
}
