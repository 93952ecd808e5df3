//! The balancer's configuration: validated, typed, and complete.
//!
//! A TOML file is read in two stages: `parse` deserializes it into raw structures that remember
//! where each key was written, then validates them into the types below. Nothing downstream
//! sees a raw value, and a config that fails validation never starts anything: the error names
//! the file, the line and the key. Every key and its default is documented in `docs/config.md`.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use capataz_health::{BackupUse, GrpcCodes, MinHealthy, Percentile, State, StatusSet};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use capataz_tls::{ServerSettings, ServerTls};

mod check;
mod cidr;
mod etcd_access;
mod parse;
mod text_errors;

pub use check::{check, Warning, CERTIFICATE_EXPIRY_WARNING, DETECTION_BUDGET, RECOVERY_BUDGET};
pub use cidr::{Cidr, CidrError};
pub use etcd_access::EtcdToken;
pub use etcd_access::{EtcdAccess, EtcdAuth, EtcdSession, EtcdTls};
pub use parse::{
    load, load_all_errors, parse_all_errors, parse_str, parse_unresolved, ConfigError,
    ConfigErrors, Environment, KeyLines, Unresolved,
};
pub use text_errors::{DurationError, ListenAddressError};

/// The longest duration a config value or an admin TTL may be: one year (`8760h`).
pub const MAX_DURATION: Duration = parse::MAX_DURATION;

/// Parses a duration written as in the config (`500ms`, `2s`, `1.5m`, `1h`), for the command
/// line and the admin API. Above [`MAX_DURATION`] is an error, never a panic later.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let duration =
        parse::parse_duration(text).ok_or_else(|| DurationError::NotADuration(text.to_owned()))?;
    if duration > MAX_DURATION {
        return Err(DurationError::AboveMaximum(text.to_owned()));
    }
    Ok(duration)
}

/// Parses an address to listen on, as in the config and on the command line: `ip:port`
/// (`0.0.0.0:8080`, `[::1]:8080`) or `localhost:port`, which is `127.0.0.1:port` (the IPv4
/// loopback: no name is looked up; write `[::1]:port` for IPv6's).
pub fn parse_listen_address(text: &str) -> Result<SocketAddr, ListenAddressError> {
    parse::listen_address(text).ok_or_else(|| ListenAddressError(text.to_owned()))
}

/// A whole, validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where the text came from (a path, or a name such as `<demo>`), for messages.
    pub source: String,
    /// Logging.
    pub log: LogConfig,
    /// The admin listener, if enabled (used by the operating surface).
    pub admin: Option<AdminConfig>,
    /// The client-facing listeners, at least one.
    pub listeners: Vec<ListenerConfig>,
    /// The pools, at least one; routes refer to them by index.
    pub pools: Vec<PoolConfig>,
    /// Alert hooks for health events.
    pub alerts: AlertsConfig,
    /// Process-wide settings.
    pub server: ServerConfig,
    /// Shared probing with other instances (`[fleet]`), if configured.
    pub fleet: Option<FleetConfig>,
    /// The line each key was written on, for warnings (equal for any two configs).
    pub lines: KeyLines,
}

/// Process-wide settings (`[server]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish (default 30 s).
    pub shutdown_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// Alert hooks (`[alerts]`): every health event is offered to each hook.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlertsConfig {
    /// At most one alert per backend per window; flips inside it are counted, not sent
    /// (default: none, every event alerts).
    pub debounce: Option<Duration>,
    /// Webhooks (`[[alerts.webhooks]]`).
    pub webhooks: Vec<WebhookConfig>,
    /// Commands (`[[alerts.commands]]`).
    pub commands: Vec<CommandConfig>,
}

/// A webhook: each event is POSTed as JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// `http://host:port/path` (plain HTTP; required).
    pub url: String,
    /// The resolved address of the URL's host and port (`0.0.0.0:0` in an [`Unresolved`]
    /// config until it is resolved).
    pub socket_addr: SocketAddr,
    /// The URL's host (with port), sent as Host.
    pub host: String,
    /// The URL's path and query.
    pub path: String,
    /// Deadline for one delivery attempt (default 2 s).
    pub timeout: Duration,
    /// Attempts after the first failed one (default 3).
    pub retries: u32,
    /// Wait before the first retry, doubling each time (default 500 ms).
    pub backoff: Duration,
    /// Events waiting for delivery at most; more are dropped and counted (default 1024).
    pub queue: usize,
}

/// A command run for each event, with the event in `CAPATAZ_*` environment variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandConfig {
    /// Program and arguments (required, at least the program).
    pub argv: Vec<String>,
    /// The command is killed after this long (default 10 s).
    pub timeout: Duration,
    /// Events waiting at most; more are dropped and counted (default 256).
    pub queue: usize,
}

/// Log format and level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Text (default) or JSON lines.
    pub format: LogFormat,
    /// A `tracing` filter directive such as `info` or `capataz=debug` (default `info`).
    pub level: String,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The admin listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminConfig {
    /// Where it listens (default 127.0.0.1:9901).
    pub address: SocketAddr,
    /// Bearer token every request must carry, if set.
    pub token: Option<String>,
    /// Whether read-only endpoints (GET) are open without the token (default false).
    pub open_read_only: bool,
    /// Extra host names (lowercase, without a port) a request let in without the token may
    /// name in its `Host` or `Origin`, besides the listener's own address and `localhost`
    /// (default none).
    pub allowed_hosts: Vec<String>,
    /// Whether the latency histograms of `/metrics` are kept per backend rather than per pool
    /// (default false: per pool). Read at start; a reload does not change it.
    pub metrics_backend_histograms: bool,
}

/// One client-facing listener.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerConfig {
    /// Its name, for logs.
    pub name: String,
    /// The address it binds.
    pub address: SocketAddr,
    /// Routes, tried in order; the first match wins.
    pub routes: Vec<RouteConfig>,
    /// How long a client keep-alive connection may sit idle (default 60 s).
    pub idle_timeout: Duration,
    /// How long a client may take to send its request headers (default 10 s).
    pub header_read_timeout: Duration,
    /// The longest wait for the next piece of a request body being forwarded (default 30 s);
    /// a client that stalls longer gets 408.
    pub request_body_timeout: Duration,
    /// The largest request head accepted, in bytes (default 16 KiB); larger gets 431.
    pub max_header_bytes: usize,
    /// Whether requests get `X-Forwarded-For` (the client's address appended) and
    /// `X-Forwarded-Proto` on their way to a backend (default true).
    pub forwarded_headers: bool,
    /// Whether HTTP/2 with prior knowledge (h2c) is accepted beside HTTP/1.1 (default false).
    pub h2c: bool,
    /// The HTTP/2 settings of the listener's HTTP/2 connections.
    pub http2: Http2Config,
    /// TLS termination (`[listeners.tls]`); plaintext HTTP when `None` (default).
    pub tls: Option<ListenerTls>,
    /// `proxy_protocol`: the sources whose connections start with a PROXY protocol header
    /// (version 1 or 2) giving the real client's address; `None` (the default) reads none.
    pub proxy_protocol: Option<ProxyProtocolConfig>,
    /// The access log (`[listeners.access_log]`); none when `None` (default).
    pub access_log: Option<AccessLogConfig>,
    /// On a plaintext listener, the HTTPS port every request is redirected to (`308`) instead
    /// of being routed (`https_redirect`, `https_redirect_port`); `None` (default) routes.
    pub https_redirect: Option<u16>,
}

/// A listener's access log (`[listeners.access_log]`): one line per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// Where the lines go.
    pub target: AccessLogTarget,
    /// How a line is written (default text).
    pub format: AccessLogFormat,
    /// The most lines waiting for the writer (default 4096); more are dropped and counted.
    pub buffer: usize,
}

/// Where an access log's lines go.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AccessLogTarget {
    /// capataz's standard output (`path = "stdout"`).
    Stdout,
    /// capataz's standard error (`path = "stderr"`).
    Stderr,
    /// A file, appended to, reopened on every reload (log rotation).
    File(std::path::PathBuf),
}

/// How an access log line is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessLogFormat {
    /// A combined-like line followed by capataz's fields (see docs/config.md).
    Text,
    /// One JSON object per line.
    Json,
}

/// The HTTP/2 settings of a listener (`[listeners.http2]`), for every HTTP/2 connection it
/// serves. The largest header list accepted is the listener's `max_header_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Http2Config {
    /// Streams a client may have open at once (default 100).
    pub max_concurrent_streams: u32,
    /// Backend connections (HTTP/1.1 pools) the streams of one connection may hold at once
    /// (default 32); a stream beyond them waits for one to be let go.
    pub max_backend_connections: u32,
    /// The flow-control window of each stream, in bytes (default 256 KiB): how much of one
    /// request body a client may send ahead of capataz forwarding it.
    pub initial_stream_window_size: u32,
    /// The flow-control window of the whole connection, in bytes (default 1 MiB): how much
    /// request body all streams of a connection may have in flight, unforwarded.
    pub initial_connection_window_size: u32,
    /// The largest frame payload capataz accepts, in bytes (default 16384).
    pub max_frame_size: u32,
    /// How often capataz PINGs an HTTP/2 client (default `None`: never).
    pub keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed (default 20 s);
    /// only with `keepalive_interval`.
    pub keepalive_timeout: Duration,
}

impl Default for Http2Config {
    fn default() -> Http2Config {
        Http2Config {
            max_concurrent_streams: 100,
            max_backend_connections: 32,
            initial_stream_window_size: 256 * 1024,
            initial_connection_window_size: 1024 * 1024,
            max_frame_size: 16_384,
            keepalive_interval: None,
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

/// TLS termination on a listener (`[listeners.tls]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerTls {
    /// The files (relative paths already joined to the config file's directory) and settings.
    pub settings: ServerSettings,
    /// The line of each `certificates` entry, in order, for messages and warnings.
    pub certificate_lines: Vec<Option<usize>>,
    /// The line of `client_ca`, if set.
    pub client_ca_line: Option<usize>,
    /// The line of `[listeners.tls.acme]`'s `ca_file`, if set.
    pub acme_ca_line: Option<usize>,
    /// The certificates and keys, loaded when the config was resolved; `None` in an
    /// [`Unresolved`] config.
    pub loaded: Option<ServerTls>,
}

/// A listener's `proxy_protocol` table: who may say who the client is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyProtocolConfig {
    /// The address blocks trusted to send a header (at least one). A connection from one of
    /// them must start with a header; a connection from anywhere else is served as a direct
    /// client, its bytes never read as a header.
    pub trusted: Vec<Cidr>,
}

/// A route: a match on Host and/or path prefix, and the pool that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteConfig {
    /// The Host to match, lowercase and without a port; `None` matches any host.
    pub host: Option<String>,
    /// The path prefix to match (default `/`, everything).
    pub path_prefix: String,
    /// The index of the pool in [`Config::pools`].
    pub pool: usize,
}

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

/// The protocol a pool speaks to its backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendProtocol {
    /// HTTP/1.1, capataz's own client, over TCP or TLS (default).
    Http1,
    /// HTTP/2 over TLS (ALPN `h2`), one multiplexed connection per backend.
    H2,
    /// HTTP/2 over TCP with prior knowledge (no TLS), one multiplexed connection per backend.
    H2c,
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
    /// The trust anchors (empty with `verify = false`, and in an [`Unresolved`] config).
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
    /// [`Unresolved`] config until it is resolved).
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
}

/// What an active check does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// `GET <path>` over a fresh connection; only the status line is read (default). Over
    /// TLS on a pool with `tls`, over HTTP/2 on a pool with `protocol = "h2"` or `"h2c"`.
    Http,
    /// A TCP connect within the timeout passes.
    Tcp,
    /// The standard gRPC health check (`grpc.health.v1.Health/Check`) over HTTP/2: an OK call
    /// that reports `SERVING` passes. HTTP/2 pools only.
    Grpc,
    /// No active checks: the active side stays UP.
    None,
}

/// Active checks of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveCheckConfig {
    /// The kind of probe.
    pub kind: CheckKind,
    /// The path probed (default `/healthz`).
    pub path: String,
    /// The Host header sent; the backend's address when `None`.
    pub host: Option<String>,
    /// The statuses that pass (default 200-399).
    pub expect: StatusSet,
    /// Time between the end of one probe and the start of the next (default 2 s).
    pub interval: Duration,
    /// Deadline for connect and status line together (default 1 s).
    pub timeout: Duration,
    /// Consecutive passes that bring a DOWN backend UP (default 2).
    pub rise: NonZeroU32,
    /// Consecutive failures that take an UP backend DOWN (default 3).
    pub fall: NonZeroU32,
    /// Each interval is drawn uniformly within +-`jitter` of itself, as a fraction 0.0-0.5
    /// (default 0.1, i.e. 10 %).
    pub jitter: f64,
    /// Active state of the pool's backends when the balancer starts (default UP; DOWN for
    /// `first-probe`).
    pub initial: State,
    /// Whether a `404` from the health route drains the backend instead of failing the probe
    /// (default false; HTTP checks only).
    pub disable_on_404: bool,
    /// Passing probes in a row a backend needs after maintenance before traffic (default:
    /// `rise`).
    pub rise_after_maintenance: Option<NonZeroU32>,
    /// `initial = "first-probe"`: a backend's first probe decides at once (DOWN until then).
    pub first_probe: bool,
    /// Time between probes while a streak is under way that may change the active state
    /// (default: `interval`).
    pub fast_interval: Duration,
    /// Time between probes while DOWN with no passing probe (default: `interval`).
    pub down_interval: Duration,
    /// The probe request's method (default `GET`).
    pub method: String,
    /// Extra header fields of the probe request, in order (default none).
    pub headers: Vec<(String, String)>,
    /// The probe request's body (default none).
    pub body: Option<String>,
    /// What the answer must hold beyond an expected status (default nothing).
    pub content: ContentRules,
    /// The service a gRPC health check asks about (default empty: the server as a whole).
    pub grpc_service: String,
}

impl ActiveCheckConfig {
    /// Whether the probe is today's fixed `GET` whose status line alone is read.
    pub fn is_plain(&self) -> bool {
        self.method == "GET"
            && self.headers.is_empty()
            && self.body.is_none()
            && self.content.is_empty()
    }
}

/// The most bytes of a body rule's text (`body_contains`, `body_not_contains`) and of an
/// expected header's value text.
pub const MAX_MATCH_TEXT: usize = 256;
/// The default of `body_limit`: the first 16 KiB of a probe answer's body are matched.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;
/// The largest `body_limit`: 1 MiB.
pub const MAX_BODY_LIMIT: usize = 1024 * 1024;
/// The largest probe request body: 64 KiB.
pub const MAX_PROBE_BODY: usize = 64 * 1024;
/// The longest `grpc_service` name, in bytes.
pub const MAX_GRPC_SERVICE: usize = 512;
/// The most extra header fields of a probe request.
pub const MAX_PROBE_HEADERS: usize = 32;

/// What an HTTP probe's answer must hold beyond an expected status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentRules {
    /// Text the first `body_limit` bytes of the body must contain.
    pub body_contains: Option<String>,
    /// Text the first `body_limit` bytes of the body must not contain.
    pub body_not_contains: Option<String>,
    /// How much of the body is read and matched (default 16 KiB, at most 1 MiB).
    pub body_limit: usize,
    /// A header field the answer must carry (its name, lower case), and optionally a text one of
    /// its values must contain.
    pub header: Option<(String, Option<String>)>,
}

impl ContentRules {
    /// Whether no rule is configured.
    pub fn is_empty(&self) -> bool {
        !self.reads_body() && self.header.is_none()
    }

    /// Whether a body rule is configured (only then is the body read).
    pub fn reads_body(&self) -> bool {
        self.body_contains.is_some() || self.body_not_contains.is_some()
    }
}

/// Passive checks of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PassiveCheckConfig {
    /// Whether relayed traffic is judged at all (default true).
    pub enabled: bool,
    /// Consecutive traffic errors that eject a backend (default 3).
    pub consecutive_errors: NonZeroU32,
    /// Whether a 503 counts as an error (default true).
    pub count_503: bool,
    /// The first ejection's length; the n-th lasts n times this (default 30 s).
    pub ejection_time: Duration,
    /// The longest an ejection lasts (default 300 s).
    pub max_ejection_time: Duration,
    /// The most of the pool, in percent, held ejected at once (default 50; at least one backend).
    pub max_ejected_percent: u8,
    /// Whether an ejected backend whose probes bring its active side back from DOWN to UP goes
    /// on probation at once instead of sitting out the rest of its ejection (default true).
    pub probes_end_ejection: bool,
    /// The `grpc-status` codes that count as errors (default 2, 4, 13, 14: UNKNOWN,
    /// DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE).
    pub grpc_error_codes: GrpcCodes,
    /// The latency-outlier detector (`[pools.NAME.passive.latency_outliers]` with
    /// `enabled = true`), or `None`.
    pub latency_outliers: Option<LatencyOutliersConfig>,
    /// Load shedding awareness (`[pools.NAME.passive.load_shedding]` with `enabled = true`),
    /// or `None`.
    pub load_shedding: Option<LoadSheddingConfig>,
    /// The success-rate detector (`[pools.NAME.passive.success_rate]` with `enabled = true`),
    /// or `None`.
    pub success_rate: Option<SuccessRateConfig>,
}

/// The success-rate detector of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuccessRateConfig {
    /// How long one window lasts (default 10 s).
    pub window: Duration,
    /// Outcomes a backend must have within a window to be judged (default 100).
    pub min_requests: u32,
    /// Judged backends a window needs (default 5).
    pub min_backends: u32,
    /// Standard deviations below the mean that make an outlier, in thousandths (default 1900).
    pub stdev_factor_milli: u32,
}

/// Load shedding awareness of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSheddingConfig {
    /// The weight while shedding, in percent of the backend's weight (default 10).
    pub weight_percent: u8,
    /// The longest relief granted, whatever `Retry-After` asks (default 300 s).
    pub max_retry_after: Duration,
    /// The relief a `429` without a usable `Retry-After` gets (default 1 s).
    pub default_retry_after: Duration,
}

/// The latency-outlier detector of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyOutliersConfig {
    /// Which percentile is compared (default p99).
    pub percentile: Percentile,
    /// How many times the pool's median makes an outlier (default 3).
    pub factor: NonZeroU32,
    /// Consecutive outlying windows that eject (default 3).
    pub windows: NonZeroU32,
    /// How long one window lasts (default 10 s).
    pub window: Duration,
    /// Requests a backend must relay within a window to be judged (default 20).
    pub min_requests: u32,
    /// A latency below this is never an outlier (default 5 ms).
    pub min_latency: Duration,
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
