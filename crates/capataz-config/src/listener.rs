//! A client-facing listener's settings: its address, routes, TLS, HTTP/2 limits, access log
//! and PROXY protocol trust.

use std::net::SocketAddr;
use std::time::Duration;

use capataz_tls::{ServerSettings, ServerTls};

use crate::{
    Cidr, ForwardedFields, HeaderRules, Hsts, Http3Config, PathRewrite, RequestIdConfig,
    RouteMatch, RouteTarget,
};

/// One client-facing listener.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerConfig {
    /// Its name, for logs.
    pub name: String,
    /// The address it binds (`0.0.0.0:0`, unused, for a listener on a Unix socket).
    pub address: SocketAddr,
    /// `address = "unix:/path"`: the Unix domain socket it binds instead; `None` (TCP) else.
    pub unix: Option<crate::UnixListen>,
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
    /// Which forwarded fields requests get on their way to a backend (`forwarded`, or the
    /// older `forwarded_headers`; default `X-Forwarded-For` and `X-Forwarded-Proto`).
    pub forwarded: ForwardedFields,
    /// `request_id`: the id each request gets (or keeps); `None` (default): none.
    pub request_id: Option<RequestIdConfig>,
    /// `request_headers`: rules on every request, before its route's; `None`: none.
    pub request_headers: Option<Box<HeaderRules>>,
    /// `response_headers`: rules on every backend's answer, before its route's.
    pub response_headers: Option<Box<HeaderRules>>,
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
    /// `mode = "tcp"`: byte streams relayed to one pool, no routes (`routes` is empty); `None`
    /// (the default, `mode = "http"`) serves HTTP.
    pub tcp: Option<crate::TcpListenerConfig>,
    /// The pages of the answers capataz writes itself, by status (`[listeners.error_pages]`);
    /// `None` (default): capataz's plain-text pages.
    pub error_pages: Option<crate::ErrorPages>,
    /// `max_connections`: the most client connections it holds at once (TCP, TLS, Unix socket
    /// and QUIC together, each from its accept to its close); `None` (default): no limit.
    pub max_connections: Option<usize>,
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
    /// `hsts`: the `Strict-Transport-Security` every answer gets; `None` (default): none.
    pub hsts: Option<Hsts>,
    /// `[listeners.tls.http3]`: HTTP/3 on a UDP port; `None` (default): off.
    pub http3: Option<Http3Config>,
    /// The certificates and keys, loaded when the config was resolved; `None` in an
    /// [`Unresolved`](crate::Unresolved) config.
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

impl RouteConfig {
    /// The index of its pool; `None` for a redirect route.
    pub fn pool(&self) -> Option<usize> {
        match self.target {
            RouteTarget::Pool(index) => Some(index),
            RouteTarget::Redirect(_) => None,
        }
    }
}

/// A route: a match on Host and/or path prefix (and the matchers of `matches`), and the pool
/// that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteConfig {
    /// `name`: its label in metrics and the access log; `None`: its host and path prefix.
    pub name: Option<String>,
    /// The Host to match, lowercase and without a port; `None` matches any host.
    pub host: Option<String>,
    /// The path prefix to match (default `/`, everything).
    pub path_prefix: String,
    /// What serves it: a pool (`pool`), or a redirect (`redirect`).
    pub target: RouteTarget,
    /// Its other matchers (methods, path, path regex, headers, query); `None` when it has none.
    pub matches: Option<Box<RouteMatch>>,
    /// `request_headers`: rules on its requests, after the listener's; `None`: none.
    pub request_headers: Option<Box<HeaderRules>>,
    /// `response_headers`: rules on its backends' answers, after the listener's.
    pub response_headers: Option<Box<HeaderRules>>,
    /// How the path its backends get is rewritten; `None` (default): as sent.
    pub rewrite: Option<Box<PathRewrite>>,
    /// Its local rate limit (`rate_limit`); `None` (default): none.
    pub rate_limit: Option<crate::RateLimitConfig>,
}
