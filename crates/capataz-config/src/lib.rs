//! The balancer's configuration: validated, typed, and complete.
//!
//! A TOML file is read in two stages: `parse` deserializes it into raw structures that remember
//! where each key was written, then validates them into the types below. Nothing downstream
//! sees a raw value, and a config that fails validation never starts anything: the error names
//! the file, the line and the key. Every key and its default is documented in `docs/config.md`.
//!
//! The validated types live in one module per part of the file, all re-exported here (paths
//! are `capataz_config::PoolConfig`, never the module's): [`Config`] and its global sections
//! (server, log, admin, alerts) below, `listener` (listeners, routes, their TLS, HTTP/2,
//! access log and PROXY protocol), `pool` (pools, backends, TLS to them, retries, timeouts),
//! `health_checks` (the active probe and the passive checks, with their size limits) and
//! `source` (DNS and etcd backend sources, the fleet's etcd).

use std::net::SocketAddr;
use std::time::Duration;

mod affinity;
mod check;
mod cidr;
mod error_pages;
mod etcd_access;
mod header_rules;
mod health_checks;
mod http3;
mod limits;
mod listener;
mod parse;
mod pool;
mod rate_limit;
mod route_rules;
mod sni;
mod source;
mod tcp;
mod text_errors;
mod unix;

pub use affinity::{Affinity, HashConfig, HashKey, OnDrain, SameSite, StickyConfig};
pub use check::{check, Warning, CERTIFICATE_EXPIRY_WARNING, DETECTION_BUDGET, RECOVERY_BUDGET};
pub use cidr::{Cidr, CidrError};
pub use error_pages::{
    ErrorPage, ErrorPages, DEFAULT_ERROR_PAGE_TYPE, ERROR_PAGE_STATUSES, MAX_ERROR_PAGE_BYTES,
};
pub use etcd_access::EtcdToken;
pub use etcd_access::{EtcdAccess, EtcdAuth, EtcdSession, EtcdTls};
pub use header_rules::{
    ForwardedFields, HeaderRules, Hsts, Piece, RequestIdConfig, Template, Variable, MAX_REQUEST_ID,
};
pub use health_checks::{
    ActiveCheckConfig, CheckKind, ContentRules, LatencyOutliersConfig, LoadSheddingConfig,
    PassiveCheckConfig, SuccessRateConfig, TcpExchange, TcpExpect, DEFAULT_BODY_LIMIT,
    MAX_BODY_LIMIT, MAX_GRPC_SERVICE, MAX_MATCH_TEXT, MAX_PROBE_BODY, MAX_PROBE_HEADERS,
    MAX_TCP_ANSWER,
};
pub use http3::Http3Config;
pub use limits::{LimitsConfig, DEFAULT_QUEUE_SIZE, DEFAULT_QUEUE_TIMEOUT, MAX_LIMIT};
pub use listener::{
    AccessLogConfig, AccessLogFormat, AccessLogTarget, Http2Config, ListenerConfig, ListenerTls,
    ProxyProtocolConfig, RouteConfig,
};
pub use parse::{
    load, load_all_errors, parse_all_errors, parse_str, parse_unresolved, ConfigError,
    ConfigErrors, Environment, KeyLines, Unresolved,
};
pub use pool::{
    AgentCheckConfig, Algorithm, AllDownPolicy, BackendConfig, BackendProtocol, BackendTls,
    ClientIdentity, ConnectionReuse, PoolConfig, RetryConfig, TrackTarget, UpstreamTimeouts,
};
pub use rate_limit::{RateLimitConfig, RateLimitKey, DEFAULT_RATE_LIMIT_KEYS};
pub use route_rules::{
    HeaderMatch, PathRewrite, QueryMatch, Redirect, RedirectPath, RouteMatch, RouteRegex,
    RouteTarget, ValueMatch, MAX_REGEX_LEN, REGEX_SIZE_LIMIT,
};
pub use sni::{
    ServerNamePattern, SniMatch, SniRoute, SniRouting, DEFAULT_INSPECT_TIMEOUT, MAX_CLIENT_HELLO,
};
pub use source::{DnsRecord, DnsSource, EtcdEndpoint, EtcdSource, FleetConfig, PoolSource};
pub use tcp::TcpListenerConfig;
pub use text_errors::{DurationError, ListenAddressError};
pub use unix::{unix_path, unix_path_problem, UnixListen, MAX_UNIX_PATH, UNIX_CLIENT, UNIX_PREFIX};

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
