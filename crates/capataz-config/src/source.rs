//! Where a pool's backends come from when they are not listed (a DNS name, an etcd prefix),
//! and the fleet's shared etcd store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::EtcdAccess;

/// Where a pool's backends come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolSource {
    /// The `backends` list of the file (default).
    Static,
    /// A DNS name re-resolved on its TTL; the pool starts empty and follows the answers.
    Dns(DnsSource),
    /// A key prefix watched in etcd; the pool starts empty and follows the keys.
    Etcd(EtcdSource),
}

impl PoolSource {
    /// `static`, `dns` or `etcd`, as written in `source.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            PoolSource::Static => "static",
            PoolSource::Dns(_) => "dns",
            PoolSource::Etcd(_) => "etcd",
        }
    }

    /// Whether the backends come from outside the file (so a reload keeps the running ones).
    pub fn is_dynamic(&self) -> bool {
        !matches!(self, PoolSource::Static)
    }
}

/// `[pools.NAME.source]` with `kind = "dns"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsSource {
    /// The name to resolve, as written.
    pub name: String,
    /// Which records: A and AAAA with `port`, or SRV.
    pub record: DnsRecord,
    /// The nameserver to ask (`None`: those of /etc/resolv.conf).
    pub resolver: Option<SocketAddr>,
    /// The shortest wait between two queries (default 5 s).
    pub ttl_min: Duration,
    /// The longest wait between two queries (default 5 min).
    pub ttl_max: Duration,
    /// How long one query may take (default 2 s).
    pub timeout: Duration,
    /// The share of the pool (percent) an update may remove without being held for
    /// confirmation (default 50).
    pub max_drop_percent: u8,
}

/// `[pools.NAME.source]` with `kind = "etcd"`: the keys under `prefix`, each value a backend
/// (`{"address": "ip:port", "weight": N, "name": "..."}`), read through etcd's v3 JSON gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSource {
    /// The etcd members to ask, in order: on a failure the next one is tried.
    pub endpoints: Vec<EtcdEndpoint>,
    /// The key prefix whose keys are the backends (not empty).
    pub prefix: String,
    /// How long connecting and one request (or the creation of a watch) may take (default 2 s).
    pub timeout: Duration,
    /// The first wait before reconnecting after a failure (default 500 ms); doubled on each
    /// failure in a row up to `reconnect_max`, with jitter.
    pub reconnect_min: Duration,
    /// The longest wait between two reconnection attempts (default 30 s).
    pub reconnect_max: Duration,
    /// How long a watch may stay silent before the source checks that etcd still answers
    /// (default 10 s); a check that passes confirms the membership (its age restarts).
    pub keepalive: Duration,
    /// How long after a large drop was held the source reads the keys again to confirm or
    /// undo it, when no change comes first (default 5 s).
    pub confirm_after: Duration,
    /// The share of the pool (percent) an update may remove without being held for
    /// confirmation (default 50).
    pub max_drop_percent: u8,
}

/// `[fleet]`: the instances configured with the same etcd and group share the probing: each
/// backend is probed by `owners` of them, which publish their verdicts for the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetConfig {
    /// The etcd members to ask, in order (with the TLS and credentials of `[fleet]`).
    pub endpoints: Vec<EtcdEndpoint>,
    /// The key prefix the groups live under, without a trailing `/` (default `/capataz`).
    pub prefix: String,
    /// The group's name (required; key-safe).
    pub group: String,
    /// How many instances probe each backend (default 2, at least 1).
    pub owners: usize,
    /// The lease of this instance's membership, in whole seconds (default 10 s, at least 2 s):
    /// a dead instance's backends are re-owned within it.
    pub lease_ttl: Duration,
    /// This instance's name in the group (`None`: the host's name and the first listener's
    /// port, `HOST:PORT`).
    pub instance: Option<String>,
    /// How long connecting and one request to etcd may take (default 2 s).
    pub timeout: Duration,
}

/// One etcd endpoint: `http://host:port` or `https://host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdEndpoint {
    /// The endpoint as written (for messages).
    pub url: String,
    /// The host: an IP address or a name (resolved when connecting, off the runtime threads).
    pub host: String,
    /// The port (default 2379).
    pub port: u16,
    /// TLS (with an `https://` endpoint) and credentials, shared by the source's endpoints.
    pub access: Arc<EtcdAccess>,
}

/// The records a DNS source asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsRecord {
    /// A and AAAA records, every address with this port.
    Address {
        /// The backends' port.
        port: u16,
    },
    /// SRV records: their targets, ports, priorities and weights.
    Srv,
}
