//! Stage two: every raw value checked, defaults filled in, the typed [`Config`] built.
//!
//! Each problem found is a [`ConfigError::Invalid`] that names the line, the dotted key path
//! (built here, so it is exact) and what to do. Problems accumulate (`report`): a bad value
//! gets its default as a placeholder and validation goes on, a pool or listener that failed
//! is left out of what follows it, so that `capataz check` lists every error in one run; the
//! first one is still the one validation meets first. Each key's default is written
//! once, at the call that reads it, and in docs/config.md. Host names are only checked for
//! syntax here and queued as lookups for stage three (`resolve`): validation does no IO.
//! `[admin]`, `[pools.*]` and `[alerts]` are validated in the submodules of the same names
//! (a pool's backends, `active` and `passive` tables in `backends`, `active` and `passive`).

mod access_log;
mod acme_dns01;
mod active;
mod admin;
mod affinity;

pub(super) use admin::check_admin_token;
mod alerts;
mod backend_tls;
mod backends;
mod error_pages;
mod etcd_access;
mod fleet;
mod header_rules;
mod http3;
mod limits;
mod passive;
mod pool;
mod proxy_protocol;
mod rate_limit;
mod redirect;
mod route_match;
mod session_tickets;
mod sni;
mod source;
mod tcp;
mod tcp_probe;
mod tls;
mod unix;

use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::ops::{Range, RangeInclusive};
use std::time::Duration;

use toml::{Spanned, Value};

use super::locate::LineStarts;
use super::place::Document;
use super::raw::{RawConfig, RawHttp2, RawListener, RawLog, RawLogFormat, RawRoute, RawServer};
use super::resolve::Lookup;
use super::values::{check_log_level, parse_duration, MAX_DURATION};
use super::ConfigError;
use crate::{
    Config, Http2Config, ListenerConfig, LogConfig, LogFormat, PoolConfig, RouteConfig,
    RouteTarget, ServerConfig,
};

const DURATION_EXAMPLES: &str = r#"e.g. "500ms", "2s", "1m""#;
const U32_MAX: i64 = u32::MAX as i64;

/// Turns the raw model into a [`Config`], with the text at hand to place errors.
/// Whose etcd access is being read: an etcd source's, or the fleet's.
#[derive(Clone, Copy, Debug)]
pub(super) enum EtcdOwner<'a> {
    /// Pool `NAME`'s source (`[pools.NAME.source]`).
    Pool(&'a str),
    /// `[fleet]`.
    Fleet,
}

impl EtcdOwner<'_> {
    /// The pool's name, or the empty string for the fleet.
    pub(super) fn pool(&self) -> &str {
        match self {
            EtcdOwner::Pool(pool) => pool,
            EtcdOwner::Fleet => "",
        }
    }
}

pub(super) struct Validator<'a> {
    /// Where the text came from, for messages.
    pub(super) file: &'a str,
    /// The whole text, to turn spans into lines.
    pub(super) text: &'a str,
    /// The host names met so far, for stage three to resolve.
    pub(super) lookups: RefCell<Vec<Lookup>>,
    /// The pools' TLS files, for stage three to read.
    pub(super) tls_loads: RefCell<Vec<super::tls_files::TlsLoad>>,
    /// Files holding secrets (`admin.token_file`), for stage three to read.
    pub(super) secrets: RefCell<Vec<super::secrets::SecretLoad>>,
    /// The files of listeners' error pages, for stage three to read.
    pub(super) page_loads: RefCell<Vec<super::page_files::PageLoad>>,
    /// Every error met so far, in order.
    pub(super) errors: RefCell<Vec<ConfigError>>,
    /// Pools that failed validation: a route naming one is not a second error.
    pub(super) failed_pools: RefCell<HashSet<String>>,
    /// Whether the file has a listener without `tls` (where HTTP-01 challenges are answered).
    pub(super) plaintext_listener: std::cell::Cell<bool>,
    /// The text parsed again with its spans, to place errors by their key path; read only on
    /// the way to an error.
    document: OnceCell<Option<Document<'a>>>,
    /// Where each line of the text starts, built when a line is first asked for.
    lines: OnceCell<LineStarts>,
}

impl<'a> Validator<'a> {
    /// A validator for `text`, which came from `file`.
    pub(super) fn new(file: &'a str, text: &'a str) -> Validator<'a> {
        Validator {
            file,
            text,
            lookups: Default::default(),
            tls_loads: Default::default(),
            secrets: Default::default(),
            page_loads: Default::default(),
            errors: Default::default(),
            failed_pools: Default::default(),
            plaintext_listener: Default::default(),
            document: OnceCell::new(),
            lines: OnceCell::new(),
        }
    }

    /// Records an error and lets validation go on.
    pub(super) fn report(&self, error: ConfigError) {
        self.errors.borrow_mut().push(error);
    }

    /// The value, or `None` once its error is recorded.
    pub(super) fn keep<T>(&self, result: Result<T, ConfigError>) -> Option<T> {
        result.map_err(|error| self.report(error)).ok()
    }

    /// How many errors were recorded so far: a check that compares values some of which may
    /// be placeholders runs only if this did not grow while they were read.
    pub(super) fn error_count(&self) -> usize {
        self.errors.borrow().len()
    }

    fn error(&self, span: Option<Range<usize>>, key: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            line: self.line(span, key),
            key: key.to_owned(),
            message,
        }
    }

    /// The line a message about `key` points at: that of the key where it was written
    /// (`backends = []`, not its `[pools.web]`), or else of the nearest table around it that
    /// was (the one that lacks it); but that of `span` when it lies within what was written
    /// there (an element of a list, a key of the table), or when nothing was.
    fn line(&self, span: Option<Range<usize>>, key: &str) -> Option<usize> {
        let written = self
            .document
            .get_or_init(|| Document::parse(self.text))
            .as_ref()
            .and_then(|document| document.nearest(key));
        match (span, written) {
            (Some(span), Some(written)) if written.covers(span.start) => {
                Some(self.line_at(span.start))
            }
            (_, Some(written)) => Some(written.line),
            (span, None) => span.map(|span| self.line_at(span.start)),
        }
    }

    /// The 1-based line holding byte `offset` of the text. A binary search, as thousands of
    /// backends (their host names, their errors) each ask for one.
    pub(super) fn line_at(&self, offset: usize) -> usize {
        self.lines
            .get_or_init(|| LineStarts::of(self.text))
            .line(offset)
    }

    /// The config, or `None` when any error was recorded (see `errors`).
    pub(super) fn config(&self, raw: RawConfig) -> Option<Config> {
        let log = self.keep(self.log(raw.log));
        let server = self.keep(self.server(raw.server));
        let admin = raw.admin.map(|admin| self.keep(self.admin(admin)));
        let declared_pools = !raw.pools.is_empty();
        if !declared_pools {
            self.report(self.error(
                None,
                "pools",
                "at least one pool is needed (add a [pools.NAME] table with backends)".into(),
            ));
        }
        let mut pools = Vec::with_capacity(raw.pools.len());
        for (name, pool) in raw.pools {
            let written = name.get_ref().clone();
            match self.keep(self.pool(name, pool)) {
                Some(pool) => pools.push(pool),
                None => {
                    self.failed_pools.borrow_mut().insert(written);
                }
            }
        }
        self.keep(self.tracks(&pools));
        if raw.listeners.is_empty() {
            self.report(self.error(
                None,
                "listeners",
                r#"at least one listener is needed (add a [[listeners]] table with address = "0.0.0.0:8080")"#.into(),
            ));
        }
        let mut listeners = Vec::with_capacity(raw.listeners.len());
        let mut bound: HashMap<SocketAddr, String> = HashMap::new();
        if let Some(Some(admin)) = &admin {
            bound.insert(admin.address, "admin".into());
        }
        self.plaintext_listener
            .set(raw.listeners.iter().any(|l| l.get_ref().tls.is_none()));
        // Without pools every route would be a second error about the same thing.
        if declared_pools {
            for (index, listener) in raw.listeners.into_iter().enumerate() {
                if let Some(listener) =
                    self.keep(self.listener(index, listener, &pools, &mut bound))
                {
                    listeners.push(listener);
                }
            }
            self.keep(self.unix_paths_unique(&listeners));
        }
        let alerts = self.keep(self.alerts(raw.alerts));
        let fleet = raw.fleet.map(|fleet| self.keep(self.fleet(fleet)));
        if self.error_count() > 0 {
            return None;
        }
        Some(Config {
            source: self.file.to_owned(),
            log: log?,
            admin: match admin {
                None => None,
                Some(admin) => Some(admin?),
            },
            listeners,
            pools,
            alerts: alerts?,
            server: server?,
            fleet: match fleet {
                None => None,
                Some(fleet) => Some(fleet?),
            },
            lines: super::locate::KeyLines::of(self.text),
        })
    }

    /// Every `track` names an existing backend, and no chain of them comes back to where it
    /// started (a backend tracking itself included). Linear in backends: each chain is walked
    /// once, marked as it goes.
    fn tracks(&self, pools: &[PoolConfig]) -> Result<(), ConfigError> {
        let mut index: HashMap<(&str, &str), (usize, usize)> = HashMap::new();
        for (p, pool) in pools.iter().enumerate() {
            for (b, backend) in pool.backends.iter().enumerate() {
                index.insert((pool.name.as_str(), backend.name.as_str()), (p, b));
            }
        }
        let key = |p: usize, b: usize| format!("pools.{}.backends[{b}].track", pools[p].name);
        let target = |p: usize, b: usize| -> Result<Option<(usize, usize)>, ConfigError> {
            let Some(track) = &pools[p].backends[b].track else {
                return Ok(None);
            };
            match index.get(&(track.pool.as_str(), track.backend.as_str())) {
                Some(&found) => Ok(Some(found)),
                None => Err(self.error(
                    None,
                    &key(p, b),
                    format!(
                        "{}/{} is not a backend (write track = \"pool/backend\", or \"backend\" \
                         in the same pool, naming a backend by its name)",
                        track.pool, track.backend
                    ),
                )),
            }
        };
        // Absent: not seen yet; 1: on the chain being walked; 2: its chain ends in a backend
        // that probes.
        let mut mark: HashMap<(usize, usize), u8> = HashMap::new();
        for (p, pool) in pools.iter().enumerate() {
            for b in 0..pool.backends.len() {
                let mut chain = Vec::new();
                let mut at = (p, b);
                loop {
                    match mark.get(&at).copied() {
                        Some(2) => break,
                        Some(_) => {
                            return Err(self.error(
                                None,
                                &key(p, b),
                                "these track settings form a cycle: a backend would end up \
                                 following itself (make one of them probe)"
                                    .into(),
                            ))
                        }
                        None => {}
                    }
                    mark.insert(at, 1);
                    chain.push(at);
                    match target(at.0, at.1)? {
                        Some(next) => at = next,
                        None => break,
                    }
                }
                for at in chain {
                    mark.insert(at, 2);
                }
            }
        }
        Ok(())
    }

    fn log(&self, raw: RawLog) -> Result<LogConfig, ConfigError> {
        let format = match raw.format {
            None | Some(RawLogFormat::Text) => LogFormat::Text,
            Some(RawLogFormat::Json) => LogFormat::Json,
        };
        let level = match raw.level {
            None => "info".to_owned(),
            Some(level) => {
                let span = level.span();
                let level = level.into_inner();
                // The bounded syntax check comes first: only a filter it accepts is handed to
                // `EnvFilter`, which then has no regex to compile.
                if let Err(why) = check_log_level(&level) {
                    return Err(self.error(
                        Some(span),
                        "log.level",
                        format!(
                            r#"{:?} {why} (use e.g. "info", "debug" or "info,capataz=debug")"#,
                            level.chars().take(80).collect::<String>()
                        ),
                    ));
                }
                if let Err(error) = tracing_subscriber::EnvFilter::try_new(&level) {
                    return Err(self.error(
                        Some(span),
                        "log.level",
                        format!(
                            r#"{level:?} is not a log filter: {error} (use e.g. "info", "debug" or "info,capataz=debug")"#
                        ),
                    ));
                }
                level
            }
        };
        Ok(LogConfig { format, level })
    }

    fn server(&self, raw: RawServer) -> Result<ServerConfig, ConfigError> {
        Ok(ServerConfig {
            shutdown_timeout: self.duration(
                &raw.shutdown_timeout,
                "server.shutdown_timeout",
                Duration::from_secs(30),
            )?,
        })
    }

    fn socket_addr(&self, value: &Spanned<String>, key: &str) -> Result<SocketAddr, ConfigError> {
        super::values::listen_address(value.get_ref()).ok_or_else(|| {
            self.error(
                Some(value.span()),
                key,
                format!(
                    r#"{:?} is not an address to listen on (use ip:port or localhost:port, e.g. "0.0.0.0:8080", "[::1]:8080" or "localhost:8080")"#,
                    value.get_ref()
                ),
            )
        })
    }

    /// A listener's `address`: required, and not one another listener (in `bound`) has,
    /// except port 0. A malformed one is reported and stands in as `0.0.0.0:0`, so the
    /// listener's other errors are still found.
    fn listener_address(
        &self,
        at: &str,
        span: &std::ops::Range<usize>,
        address: Option<Spanned<String>>,
        bound: &mut HashMap<SocketAddr, String>,
    ) -> Result<SocketAddr, ConfigError> {
        let Some(address) = address else {
            return Err(self.error(
                Some(span.clone()),
                &format!("{at}.address"),
                r#"every listener needs an address (add address = "0.0.0.0:8080")"#.into(),
            ));
        };
        let key = format!("{at}.address");
        // A bad address does not hide the listener's other errors.
        if crate::unix_path(address.get_ref()).is_some() {
            // A Unix socket listener (`unix_listener` checked it): its path, not this, binds.
            return Ok(crate::UNIX_CLIENT);
        }
        let socket_addr = self
            .keep(self.socket_addr(&address, &key))
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        // Port 0 asks the OS for a free port, so two such listeners do not collide.
        if socket_addr.port() != 0 {
            if let Some(other) = bound.insert(socket_addr, at.to_owned()) {
                return Err(self.error(
                    Some(address.span()),
                    &key,
                    format!(
                        "{:?} is already used by {other} (give each listener its own address)",
                        address.get_ref()
                    ),
                ));
            }
        }
        Ok(socket_addr)
    }

    /// A listener's routes: those written, or, without any on an HTTP listener, one
    /// catch-all route to the only pool (more pools, or none, is reported).
    fn listener_routes(
        &self,
        at: &str,
        span: &std::ops::Range<usize>,
        raw_routes: Vec<Spanned<RawRoute>>,
        pools: &[PoolConfig],
        http: bool,
        request_id: bool,
    ) -> Vec<RouteConfig> {
        let mut routes = Vec::with_capacity(raw_routes.len().max(1));
        // A pool that failed validation still counts as written.
        let written_pools = pools.len() + self.failed_pools.borrow().len();
        // A tcp listener has no routes (`listener_mode` refused any).
        if raw_routes.is_empty() && http {
            if written_pools != 1 {
                // Reported, and the listener's other keys are still checked.
                self.report(self.error(
                    Some(span.clone()),
                    &format!("{at}.routes"),
                    format!(
                        "a listener without routes needs exactly one pool, and there are {} \
                         (add [[listeners.routes]] tables that name a pool)",
                        written_pools
                    ),
                ));
            }
            if let [only] = pools {
                self.keep(self.routable(&format!("{at}.routes"), Some(span.clone()), only));
            }
            routes.push(RouteConfig {
                name: None,
                host: None,
                path_prefix: "/".into(),
                target: RouteTarget::Pool(0),
                matches: None,
                request_headers: None,
                response_headers: None,
                rewrite: None,
                rate_limit: None,
            });
        }
        for (route_index, route) in raw_routes.into_iter().enumerate() {
            let at = format!("{at}.routes[{route_index}]");
            if let Some(route) = self.keep(self.route(&at, route, pools, request_id)) {
                routes.push(route);
            }
        }
        routes
    }

    fn listener(
        &self,
        index: usize,
        raw: Spanned<RawListener>,
        pools: &[PoolConfig],
        bound: &mut HashMap<SocketAddr, String>,
    ) -> Result<ListenerConfig, ConfigError> {
        let at = format!("listeners[{index}]");
        let span = raw.span();
        let raw = raw.into_inner();
        let tcp = self.listener_mode(&at, &span, &raw, pools)?;
        let unix = self.unix_listener(&at, &raw)?;
        let name = match raw.name {
            None => format!("listener-{index}"),
            Some(name) => self.name(name, &format!("{at}.name"))?,
        };
        let socket_addr = self.listener_address(&at, &span, raw.address, bound)?;
        let request_id = raw
            .request_id
            .map(|table| self.request_id(&at, table))
            .transpose()?;
        let rules_for = |response| header_rules::RulesFor {
            response,
            request_id: request_id.is_some(),
        };
        let routes = self.listener_routes(
            &at,
            &span,
            raw.routes,
            pools,
            tcp.is_none(),
            request_id.is_some(),
        );
        let https_redirect = self.https_redirect(
            &at,
            raw.tls.is_some(),
            &raw.https_redirect,
            &raw.https_redirect_port,
        )?;
        Ok(ListenerConfig {
            tcp,
            https_redirect,
            name,
            address: socket_addr,
            unix,
            routes,
            idle_timeout: self.duration(
                &raw.idle_timeout,
                &format!("{at}.idle_timeout"),
                Duration::from_secs(60),
            )?,
            header_read_timeout: self.duration(
                &raw.header_read_timeout,
                &format!("{at}.header_read_timeout"),
                Duration::from_secs(10),
            )?,
            request_body_timeout: self.duration(
                &raw.request_body_timeout,
                &format!("{at}.request_body_timeout"),
                Duration::from_secs(30),
            )?,
            max_header_bytes: self.int(
                &raw.max_header_bytes,
                &format!("{at}.max_header_bytes"),
                16384,
                1024..=1_048_576,
            )? as usize,
            forwarded: self.forwarded(&at, span.clone(), raw.forwarded, raw.forwarded_headers)?,
            request_headers: self.header_rules(
                &format!("{at}.request_headers"),
                raw.request_headers,
                rules_for(false),
            )?,
            response_headers: self.header_rules(
                &format!("{at}.response_headers"),
                raw.response_headers,
                rules_for(true),
            )?,
            request_id,
            h2c: raw.h2c.unwrap_or(false),
            http2: self.http2(&format!("{at}.http2"), &raw.http2)?,
            tls: raw
                .tls
                .map(|tls| self.listener_tls(index, &at, span.clone(), tls))
                .transpose()?,
            proxy_protocol: match raw.proxy_protocol {
                None => None,
                Some(table) => Some(self.proxy_protocol(&at, table)?),
            },
            access_log: raw
                .access_log
                .map(|log| self.access_log(&at, log))
                .transpose()?,
            error_pages: raw
                .error_pages
                .map(|pages| self.error_pages(&at, index, pages))
                .transpose()?,
            max_connections: match &raw.max_connections {
                None => None,
                Some(max) => Some(self.int(
                    &Some(max.clone()),
                    &format!("{at}.max_connections"),
                    0,
                    1..=i64::from(crate::limits::MAX_LIMIT),
                )? as usize),
            },
        })
    }

    /// `https_redirect` and `https_redirect_port`: the port redirected to, on a plaintext
    /// listener only.
    fn https_redirect(
        &self,
        at: &str,
        tls: bool,
        on: &Option<Spanned<bool>>,
        port: &Option<Spanned<i64>>,
    ) -> Result<Option<u16>, ConfigError> {
        let enabled = on.as_ref().is_some_and(|on| *on.get_ref());
        if let (Some(on), true, true) = (on, enabled, tls) {
            return Err(self.error(
                Some(on.span()),
                &format!("{at}.https_redirect"),
                "a TLS listener already speaks HTTPS (set https_redirect on a plaintext \
                 listener)"
                    .into(),
            ));
        }
        if let (Some(port), false) = (port, enabled) {
            return Err(self.error(
                Some(port.span()),
                &format!("{at}.https_redirect_port"),
                "https_redirect_port needs https_redirect = true".into(),
            ));
        }
        if !enabled {
            return Ok(None);
        }
        let port = self.int(port, &format!("{at}.https_redirect_port"), 443, 1..=65_535)?;
        Ok(Some(port as u16))
    }

    fn http2(&self, at: &str, raw: &RawHttp2) -> Result<Http2Config, ConfigError> {
        let default = Http2Config::default();
        // RFC 9113 section 6.5.2: windows at most 2^31 - 1, frames from 2^14 to 2^24 - 1.
        const MAX_WINDOW: i64 = (1 << 31) - 1;
        let int = |value: &Option<Spanned<i64>>, key: &str, default: u32, range| {
            self.int(value, &format!("{at}.{key}"), i64::from(default), range)
                .map(|n| n as u32)
        };
        Ok(Http2Config {
            max_concurrent_streams: int(
                &raw.max_concurrent_streams,
                "max_concurrent_streams",
                default.max_concurrent_streams,
                1..=10_000,
            )?,
            max_backend_connections: int(
                &raw.max_backend_connections,
                "max_backend_connections",
                default.max_backend_connections,
                1..=10_000,
            )?,
            initial_stream_window_size: int(
                &raw.initial_stream_window_size,
                "initial_stream_window_size",
                default.initial_stream_window_size,
                65_535..=MAX_WINDOW,
            )?,
            initial_connection_window_size: int(
                &raw.initial_connection_window_size,
                "initial_connection_window_size",
                default.initial_connection_window_size,
                65_535..=MAX_WINDOW,
            )?,
            max_frame_size: int(
                &raw.max_frame_size,
                "max_frame_size",
                default.max_frame_size,
                16_384..=16_777_215,
            )?,
            keepalive_interval: self
                .optional_duration(&raw.keepalive_interval, &format!("{at}.keepalive_interval"))?,
            keepalive_timeout: self.duration(
                &raw.keepalive_timeout,
                &format!("{at}.keepalive_timeout"),
                default.keepalive_timeout,
            )?,
        })
    }

    fn route(
        &self,
        at: &str,
        raw: Spanned<RawRoute>,
        pools: &[PoolConfig],
        request_id: bool,
    ) -> Result<RouteConfig, ConfigError> {
        let rules_for = |response| header_rules::RulesFor {
            response,
            request_id,
        };
        let span = raw.span();
        let mut raw = raw.into_inner();
        let pool_names = || {
            pools
                .iter()
                .map(|pool| format!("{:?}", pool.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let pool =
            match (raw.pool.take(), raw.redirect.take()) {
                (Some(_), Some(redirect)) => return Err(self.error(
                    Some(redirect.span()),
                    &format!("{at}.redirect"),
                    "a route is served by a pool or answered with a redirect, not both (remove \
                     pool or redirect)"
                        .into(),
                )),
                (None, Some(redirect)) => {
                    return self.redirect_route(at, span, raw, redirect, rules_for);
                }
                (None, None) => {
                    return Err(self.error(
                        Some(span),
                        &format!("{at}.pool"),
                        format!(
                            "every route needs a pool (add pool = NAME, one of {}) or a redirect",
                            pool_names()
                        ),
                    ))
                }
                (Some(pool), None) => pool,
            };
        let Some(pool_index) = pools.iter().position(|p| p.name == *pool.get_ref()) else {
            if self.failed_pools.borrow().contains(pool.get_ref()) {
                // Its own errors are reported; the config is refused, so any index will do.
                return Ok(RouteConfig {
                    name: None,
                    host: None,
                    path_prefix: "/".into(),
                    target: RouteTarget::Pool(0),
                    matches: None,
                    request_headers: None,
                    response_headers: None,
                    rewrite: None,
                    rate_limit: None,
                });
            }
            return Err(self.error(
                Some(pool.span()),
                &format!("{at}.pool"),
                format!(
                    "{:?} is not a pool (use one of {}, or add [pools.{}])",
                    pool.get_ref(),
                    pool_names(),
                    pool.get_ref()
                ),
            ));
        };
        self.routable(&format!("{at}.pool"), Some(pool.span()), &pools[pool_index])?;
        let mut route = self.route_matching(at, &mut raw, rules_for)?;
        route.target = RouteTarget::Pool(pool_index);
        route.rewrite = self.path_rewrite(at, span, &mut raw)?;
        Ok(route)
    }

    /// A route's keys other than its target and rewrite (its target set to pool 0).
    fn route_matching(
        &self,
        at: &str,
        raw: &mut RawRoute,
        rules_for: impl Fn(bool) -> header_rules::RulesFor,
    ) -> Result<RouteConfig, ConfigError> {
        let host = match raw.host.take() {
            None => None,
            Some(host) => Some(self.route_host(&host, &format!("{at}.host"))?),
        };
        let path_prefix = match raw.path_prefix.take() {
            None => "/".to_owned(),
            Some(prefix) => {
                let text = prefix.get_ref();
                if !text.starts_with('/') || !is_token_text(text) {
                    return Err(self.error(
                        Some(prefix.span()),
                        &format!("{at}.path_prefix"),
                        format!(
                            r#"{text:?} is not a path prefix (start it with "/" and leave out spaces, e.g. "/api/")"#
                        ),
                    ));
                }
                prefix.into_inner()
            }
        };
        let rate_limit = raw
            .rate_limit
            .take()
            .map(|limit| self.rate_limit(at, limit))
            .transpose()?;
        Ok(RouteConfig {
            name: self.route_name(at, raw)?,
            host,
            path_prefix,
            target: RouteTarget::Pool(0),
            matches: self.route_match(at, raw)?,
            request_headers: self.header_rules(
                &format!("{at}.request_headers"),
                raw.request_headers.take(),
                rules_for(false),
            )?,
            response_headers: self.header_rules(
                &format!("{at}.response_headers"),
                raw.response_headers.take(),
                rules_for(true),
            )?,
            rewrite: None,
            rate_limit,
        })
    }

    /// A route's Host, lowercase and without its port (`[::1]:80` keeps its brackets).
    fn route_host(&self, host: &Spanned<String>, key: &str) -> Result<String, ConfigError> {
        let text = host.get_ref().trim();
        let without_port = if text.starts_with('[') {
            text.find(']').map(|end| &text[..=end])
        } else {
            match text.rsplit_once(':') {
                Some((name, port))
                    if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    Some(name)
                }
                Some(_) => None,
                None => Some(text),
            }
        };
        match without_port {
            Some(name) if !name.is_empty() && is_token_text(name) && !name.contains('/') => {
                Ok(name.to_ascii_lowercase())
            }
            _ => Err(self.error(
                Some(host.span()),
                key,
                format!(
                    r#"{:?} is not a host name (use e.g. "api.example.com", without a path)"#,
                    host.get_ref()
                ),
            )),
        }
    }

    /// A name; a bad one is reported and the key path stands in for it.
    fn name(&self, name: Spanned<String>, key: &str) -> Result<String, ConfigError> {
        if name.get_ref().is_empty() || name.get_ref().chars().any(char::is_control) {
            self.report(self.error(
                Some(name.span()),
                key,
                "a name must be non-empty text (or leave the key out for the default)".into(),
            ));
            return Ok(key.to_owned());
        }
        Ok(name.into_inner())
    }

    /// A duration above zero, or `default` when the key is absent.
    fn duration(
        &self,
        value: &Option<Spanned<Value>>,
        key: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        Ok(self.optional_duration(value, key)?.unwrap_or(default))
    }

    /// A duration above zero, or `None` when the key is absent (the feature is off). A bad
    /// one is reported and reads as absent.
    fn optional_duration(
        &self,
        value: &Option<Spanned<Value>>,
        key: &str,
    ) -> Result<Option<Duration>, ConfigError> {
        Ok(self
            .keep(self.written_duration(value, key))
            .unwrap_or_default())
    }

    fn written_duration(
        &self,
        value: &Option<Spanned<Value>>,
        key: &str,
    ) -> Result<Option<Duration>, ConfigError> {
        let Some(value) = value else {
            return Ok(None);
        };
        let Value::String(text) = value.get_ref() else {
            return Err(self.error(
                Some(value.span()),
                key,
                format!(
                    "{} is not a duration (write a string with a unit, {DURATION_EXAMPLES})",
                    value.get_ref()
                ),
            ));
        };
        match parse_duration(text) {
            None => Err(self.error(
                Some(value.span()),
                key,
                format!("{text:?} is not a duration (use {DURATION_EXAMPLES})"),
            )),
            Some(Duration::ZERO) => Err(self.error(
                Some(value.span()),
                key,
                format!("{text:?} is zero (use a duration above zero, {DURATION_EXAMPLES})"),
            )),
            Some(duration) if duration > MAX_DURATION => Err(self.error(
                Some(value.span()),
                key,
                format!(
                    "{text:?} is above the maximum of 8760h (one year) (use a shorter duration, \
                     {DURATION_EXAMPLES})"
                ),
            )),
            Some(duration) => Ok(Some(duration)),
        }
    }

    /// An integer within `range`, or `default` when the key is absent (or, reported, wrong).
    fn int(
        &self,
        value: &Option<Spanned<i64>>,
        key: &str,
        default: i64,
        range: RangeInclusive<i64>,
    ) -> Result<i64, ConfigError> {
        let Some(value) = value else {
            return Ok(default);
        };
        let n = *value.get_ref();
        if range.contains(&n) {
            return Ok(n);
        }
        let wanted = if *range.end() >= U32_MAX {
            format!("use a whole number of at least {}", range.start())
        } else {
            format!(
                "use a whole number from {} to {}",
                range.start(),
                range.end()
            )
        };
        self.report(self.error(
            Some(value.span()),
            key,
            format!("{n} is out of range ({wanted})"),
        ));
        Ok(default)
    }

    /// A count of at least one, such as `rise`.
    fn threshold(
        &self,
        value: &Option<Spanned<i64>>,
        key: &str,
        default: u32,
    ) -> Result<NonZeroU32, ConfigError> {
        let n = self.int(value, key, i64::from(default), 1..=U32_MAX)?;
        // `int` kept n within 1..=u32::MAX.
        Ok(NonZeroU32::new(n as u32).expect("checked to be at least 1"))
    }
}

/// Non-empty text without whitespace or control characters: fit for a request line or header.
fn is_token_text(text: &str) -> bool {
    !text.is_empty() && !text.chars().any(|c| c.is_whitespace() || c.is_control())
}
