//! A pool's settings and its backends': balancing, the protocol and TLS to the backends,
//! connection reuse, the agent check, what to do when all are down, retries and timeouts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use capataz_health::{BackupUse, MinHealthy};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::{ActiveCheckConfig, PassiveCheckConfig, PoolSource};

/// One pool of backends and how it is balanced and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// The pool's name (its key under `[pools]`).
    pub name: String,
    /// The backends, at least one, with unique names.
    pub backends: Vec<BackendConfig>,
    /// How a backend is picked.
    pub algorithm: Algorithm,
    /// Active checks.
    pub active: ActiveCheckConfig,
    /// Passive checks.
    pub passive: PassiveCheckConfig,
    /// What happens when no backend is UP.
    pub when_all_down: AllDownPolicy,
    /// Retries.
    pub retries: RetryConfig,
    /// Timeouts towards the backends.
    pub timeouts: UpstreamTimeouts,
    /// Ramp a (re)joining backend's weight up linearly over this long (default: off).
    pub slow_start: Option<Duration>,
    /// Whether backends added by a reload start DOWN until they pass `rise` probes
    /// (readiness gating; default true).
    pub gate_new_backends: bool,
    /// Which client requests an idle backend connection may carry (default private).
    pub connection_reuse: ConnectionReuse,
    /// The PROXY protocol header sent first on each backend connection, naming the client
    /// (default: none). Only with private reuse and HTTP/1.1 backends.
    pub send_proxy_protocol: Option<capataz_proxy_protocol::Version>,
    /// Which backups serve while no primary is in rotation (default: the first one).
    pub backups: BackupUse,
    /// The minimum healthy share below which a `fail_open` pool fails open over its primaries
    /// (`min_healthy`, default 1, and `min_healthy_percent`, default 0: fail open only when none
    /// is UP).
    pub min_healthy: MinHealthy,
    /// Whether a backend whose verdict goes DOWN has its upgraded connections closed (default
    /// false).
    pub close_tunnels_on_down: bool,
    /// The protocol spoken to the backends (default HTTP/1.1).
    pub protocol: BackendProtocol,
    /// TLS to the backends, when on (`tls = true` or a `[pools.NAME.tls]` table; default off;
    /// always on for `protocol = "h2"`, never for `"h2c"`).
    pub tls: Option<BackendTls>,
    /// Agent checks (`[pools.<name>.agent]`; default: off).
    pub agent: Option<AgentCheckConfig>,
    /// Where the backends come from (default: the `backends` list, [`PoolSource::Static`]).
    pub source: PoolSource,
    /// Hashing and sticky sessions (default: neither).
    pub affinity: crate::Affinity,
    /// Connection limits and the queue (`None`: no backend has a limit, no request waits).
    pub limits: Option<crate::LimitsConfig>,
}

/// Agent checks of one pool (HAProxy's `agent-check`): each backend's agent, on its own TCP
/// port, answers one line saying how it wants to be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentCheckConfig {
    /// The agent's port on each backend's address (a backend's `agent_port` wins).
    pub port: u16,
    /// Time between the end of one agent exchange and the start of the next (default 2 s).
    pub interval: Duration,
    /// Deadline for connecting and reading the line (default 1 s).
    pub timeout: Duration,
}

/// The protocol a pool speaks to its backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendProtocol {
    /// HTTP/1.1, capataz's own client, over TCP or TLS (default).
    Http1,
    /// HTTP/2 over TLS (ALPN `h2`), one multiplexed connection per backend.
    H2,
    /// HTTP/2 over TCP with prior knowledge (no TLS), one multiplexed connection per backend.
    H2c,
    /// Byte streams (`protocol = "tcp"`): the pool serves `mode = "tcp"` listeners only, one
    /// backend connection per client connection.
    Tcp,
}

impl BackendProtocol {
    /// Whether the backends speak HTTP/2 (`h2` or `h2c`).
    pub fn is_h2(self) -> bool {
        matches!(self, BackendProtocol::H2 | BackendProtocol::H2c)
    }
}

/// TLS towards a pool's backends: what was written, and the trust material loaded from it
/// when the config was loaded (stage three, off the runtime threads).
///
/// Two values are equal when their settings are (the loaded material is not compared).
#[derive(Clone)]
pub struct BackendTls {
    /// A PEM bundle of CA certificates to verify backends with; `None`: the system's roots.
    pub ca_file: Option<String>,
    /// The name sent as SNI and verified in the backend's certificate; `None`: each backend's
    /// host as written in its address when it is a name, else no SNI and the IP is verified.
    pub server_name: Option<String>,
    /// Whether the backend's certificate is verified (default true; `false` is unsafe).
    pub verify: bool,
    /// A PEM certificate chain presented to backends that ask for one (mTLS), with `key`.
    pub cert: Option<String>,
    /// The PEM private key of `cert`.
    pub key: Option<String>,
    /// The trust anchors (empty with `verify = false`, and in an
    /// [`Unresolved`](crate::Unresolved) config).
    pub roots: Arc<rustls::RootCertStore>,
    /// The client certificate chain and key, loaded from `cert` and `key`.
    pub identity: Option<Arc<ClientIdentity>>,
}

/// A client certificate chain and its private key, for mTLS to backends.
#[derive(Debug)]
pub struct ClientIdentity {
    /// The chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
}

impl PartialEq for BackendTls {
    fn eq(&self, other: &BackendTls) -> bool {
        self.ca_file == other.ca_file
            && self.server_name == other.server_name
            && self.verify == other.verify
            && self.cert == other.cert
            && self.key == other.key
    }
}

impl std::fmt::Debug for BackendTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendTls")
            .field("ca_file", &self.ca_file)
            .field("server_name", &self.server_name)
            .field("verify", &self.verify)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("roots", &self.roots.len())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// Which client requests an idle keep-alive connection to a backend may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionReuse {
    /// Only later requests of the client connection whose request it carried; closed with
    /// that client connection (default).
    Private,
    /// Any client's request: fewer connects, but bytes a backend sends after an answer may be
    /// read as the answer to another client's request.
    Shared,
}

/// One backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendConfig {
    /// Its name, unique within the pool.
    pub name: String,
    /// `host:port` as written.
    pub address: String,
    /// The address it resolved to when the config was loaded (`0.0.0.0:0` in an
    /// [`Unresolved`](crate::Unresolved) config until it is resolved).
    pub socket_addr: SocketAddr,
    /// Relative weight, 1-1000 (default 1).
    pub weight: u32,
    /// Whether it is a backup: it gets traffic only while no primary is in rotation (default
    /// false).
    pub backup: bool,
    /// The port its agent answers on, when it differs from the pool's `agent.port`.
    pub agent_port: Option<u16>,
    /// The backend whose active checks it follows instead of probing itself (`track`).
    pub track: Option<TrackTarget>,
    /// The most requests it may hold at once (`max_connections` or `max_requests`), when it
    /// sets its own; else the pool's default applies ([`crate::LimitsConfig::default`]).
    pub limit: Option<std::num::NonZeroU32>,
}

/// A tracked backend: `track = "pool/backend"`, or `"backend"` in the same pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackTarget {
    /// The tracked backend's pool.
    pub pool: String,
    /// The tracked backend's name.
    pub backend: String,
}

/// How a pool picks a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Smooth weighted round robin (default).
    RoundRobin,
    /// Least outstanding requests between two random choices, weighted.
    LeastRequest,
    /// Consistent hashing of a request's key (`affinity.hash`), with bounded loads.
    Hash,
    /// Two random choices compared by latency estimate x (outstanding + 1) / weight.
    PeakEwma,
}

/// What a pool does when none of its backends is UP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllDownPolicy {
    /// Spread traffic over all the pool's backends, relying on retries (default).
    FailOpen,
    /// Answer 503 with this Retry-After.
    Reject {
        /// The Retry-After sent (default 5 s).
        retry_after: Duration,
    },
}

/// Retries of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// Retries per request, each to a different backend (default 1; 0 disables).
    pub attempts: u32,
    /// Retries may add at most this share of extra requests, in percent (default 20).
    pub budget_percent: u8,
    /// Retries always allowed in a burst, whatever the budget (default 10).
    pub min_budget: u32,
}

/// Timeouts towards the backends of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamTimeouts {
    /// Connecting to a backend (default 1 s).
    pub connect: Duration,
    /// From the end of sending a request (head and body) to receiving its response headers
    /// (default 15 s).
    pub response_header: Duration,
    /// The longest a backend may leave a body waiting, either way (default 60 s): a response
    /// body it sends nothing of, or a request body write it does not read.
    pub body_idle: Duration,
    /// How long an idle pooled keep-alive connection to a backend is kept (default 30 s).
    pub idle: Duration,
}
