//! Stage two: every raw value checked, defaults filled in, the typed [`Config`] built.
//!
//! The first problem found is returned as a [`ConfigError::Invalid`] that names the line, the
//! dotted key path (built here, so it is exact) and what to do. Each key's default is written
//! once, at the call that reads it, and in docs/config.md.

mod alerts;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroU32;
use std::ops::{Range, RangeInclusive};
use std::time::Duration;

use capataz_health::{State, StatusSet};
use toml::{Spanned, Value};

use super::locate::line_of;
use super::raw::RawReuse;
use super::raw::{
    RawActive, RawAdmin, RawAlgorithm, RawAllDown, RawBackend, RawCheckKind, RawConfig, RawInitial,
    RawListener, RawLog, RawLogFormat, RawPassive, RawPool, RawRetries, RawRoute, RawServer,
    RawTimeouts,
};
use super::values::{parse_duration, parse_percent};
use super::ConfigError;
use crate::config::ConnectionReuse;
use crate::config::{
    ActiveCheckConfig, AdminConfig, Algorithm, AllDownPolicy, BackendConfig, CheckKind, Config,
    ListenerConfig, LogConfig, LogFormat, PassiveCheckConfig, PoolConfig, RetryConfig, RouteConfig,
    ServerConfig, UpstreamTimeouts,
};

const DURATION_EXAMPLES: &str = r#"e.g. "500ms", "2s", "1m""#;
const U32_MAX: i64 = u32::MAX as i64;

/// Turns the raw model into a [`Config`], with the text at hand to place errors.
pub(super) struct Validator<'a> {
    /// Where the text came from, for messages.
    pub(super) file: &'a str,
    /// The whole text, to turn spans into lines.
    pub(super) text: &'a str,
}

impl Validator<'_> {
    fn error(&self, span: Option<Range<usize>>, key: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            line: span.map(|span| line_of(self.text, span.start)),
            key: key.to_owned(),
            message,
        }
    }

    pub(super) fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let log = self.log(raw.log)?;
        let server = self.server(raw.server)?;
        let admin = raw.admin.map(|admin| self.admin(admin)).transpose()?;
        if raw.pools.is_empty() {
            return Err(self.error(
                None,
                "pools",
                "at least one pool is needed (add a [pools.NAME] table with backends)".into(),
            ));
        }
        let mut pools = Vec::with_capacity(raw.pools.len());
        for (name, pool) in raw.pools {
            pools.push(self.pool(name, pool)?);
        }
        if raw.listeners.is_empty() {
            return Err(self.error(
                None,
                "listeners",
                r#"at least one listener is needed (add a [[listeners]] table with address = "0.0.0.0:8080")"#.into(),
            ));
        }
        let mut listeners = Vec::with_capacity(raw.listeners.len());
        let mut bound: HashMap<SocketAddr, String> = HashMap::new();
        if let Some(admin) = &admin {
            bound.insert(admin.address, "admin".into());
        }
        for (index, listener) in raw.listeners.into_iter().enumerate() {
            listeners.push(self.listener(index, listener, &pools, &mut bound)?);
        }
        let alerts = self.alerts(raw.alerts)?;
        Ok(Config {
            source: self.file.to_owned(),
            log,
            admin,
            listeners,
            pools,
            alerts,
            server,
        })
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

    fn admin(&self, raw: RawAdmin) -> Result<AdminConfig, ConfigError> {
        let address = match &raw.address {
            None => SocketAddr::from(([127, 0, 0, 1], 9901)),
            Some(address) => self.socket_addr(address, "admin.address")?,
        };
        let token = match raw.token {
            None => None,
            Some(token) => {
                let ok = !token.get_ref().is_empty()
                    && token.get_ref().bytes().all(|b| b.is_ascii_graphic());
                if !ok {
                    return Err(self.error(
                        Some(token.span()),
                        "admin.token",
                        "the token must be non-empty printable ASCII without spaces \
                         (leave the key out to disable authentication)"
                            .into(),
                    ));
                }
                Some(token.into_inner())
            }
        };
        // The admin API can drain and disable backends: beyond this host it needs a token.
        // (The default address is loopback, so only a written address can fail here.)
        if let (Some(written), None) = (&raw.address, &token) {
            if !address.ip().to_canonical().is_loopback() {
                return Err(self.error(
                    Some(written.span()),
                    "admin.address",
                    format!(
                        "{:?}: a non-loopback admin address needs admin.token (anyone who can \
                         reach it could take backends down; set admin.token, or listen on \
                         \"127.0.0.1:9901\")",
                        written.get_ref()
                    ),
                ));
            }
        }
        Ok(AdminConfig {
            address,
            token,
            open_read_only: raw.open_read_only.unwrap_or(false),
            metrics_backend_histograms: raw.metrics_backend_histograms.unwrap_or(false),
        })
    }

    fn socket_addr(&self, value: &Spanned<String>, key: &str) -> Result<SocketAddr, ConfigError> {
        value.get_ref().parse().map_err(|_| {
            self.error(
                Some(value.span()),
                key,
                format!(
                    r#"{:?} is not an ip:port address (use e.g. "0.0.0.0:8080" or "[::1]:8080")"#,
                    value.get_ref()
                ),
            )
        })
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
        let name = match raw.name {
            None => format!("listener-{index}"),
            Some(name) => self.name(name, &format!("{at}.name"))?,
        };
        let Some(address) = raw.address else {
            return Err(self.error(
                Some(span),
                &format!("{at}.address"),
                r#"every listener needs an address (add address = "0.0.0.0:8080")"#.into(),
            ));
        };
        let key = format!("{at}.address");
        let socket_addr = self.socket_addr(&address, &key)?;
        // Port 0 asks the OS for a free port, so two such listeners do not collide.
        if socket_addr.port() != 0 {
            if let Some(other) = bound.insert(socket_addr, at.clone()) {
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
        let mut routes = Vec::with_capacity(raw.routes.len().max(1));
        if raw.routes.is_empty() {
            if pools.len() != 1 {
                return Err(self.error(
                    Some(span),
                    &format!("{at}.routes"),
                    format!(
                        "a listener without routes needs exactly one pool, and there are {} \
                         (add [[listeners.routes]] tables that name a pool)",
                        pools.len()
                    ),
                ));
            }
            routes.push(RouteConfig {
                host: None,
                path_prefix: "/".into(),
                pool: 0,
            });
        }
        for (route_index, route) in raw.routes.into_iter().enumerate() {
            routes.push(self.route(&format!("{at}.routes[{route_index}]"), route, pools)?);
        }
        Ok(ListenerConfig {
            name,
            address: socket_addr,
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
            forwarded_headers: raw.forwarded_headers.unwrap_or(true),
        })
    }

    fn route(
        &self,
        at: &str,
        raw: Spanned<RawRoute>,
        pools: &[PoolConfig],
    ) -> Result<RouteConfig, ConfigError> {
        let span = raw.span();
        let raw = raw.into_inner();
        let pool_names = || {
            pools
                .iter()
                .map(|pool| format!("{:?}", pool.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(pool) = raw.pool else {
            return Err(self.error(
                Some(span),
                &format!("{at}.pool"),
                format!(
                    "every route needs a pool (add pool = NAME, one of {})",
                    pool_names()
                ),
            ));
        };
        let Some(pool_index) = pools.iter().position(|p| p.name == *pool.get_ref()) else {
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
        let host = match raw.host {
            None => None,
            Some(host) => Some(self.route_host(&host, &format!("{at}.host"))?),
        };
        let path_prefix = match raw.path_prefix {
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
        Ok(RouteConfig {
            host,
            path_prefix,
            pool: pool_index,
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

    fn name(&self, name: Spanned<String>, key: &str) -> Result<String, ConfigError> {
        if name.get_ref().is_empty() || name.get_ref().chars().any(char::is_control) {
            return Err(self.error(
                Some(name.span()),
                key,
                "a name must be non-empty text (or leave the key out for the default)".into(),
            ));
        }
        Ok(name.into_inner())
    }

    fn pool(&self, name: Spanned<String>, raw: RawPool) -> Result<PoolConfig, ConfigError> {
        let name_span = name.span();
        let name = name.into_inner();
        let valid_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !valid_name {
            return Err(self.error(
                Some(name_span),
                &format!("pools.{name}"),
                format!(
                    "{name:?} is not a pool name (use letters, digits, '_', '.' and '-', e.g. [pools.web])"
                ),
            ));
        }
        let at = format!("pools.{name}");
        let backends = self.backends(&at, name_span.clone(), raw.backends)?;
        let algorithm = match raw.algorithm {
            None | Some(RawAlgorithm::RoundRobin) => Algorithm::RoundRobin,
            Some(RawAlgorithm::LeastRequest) => Algorithm::LeastRequest,
        };
        let retry_after = self.duration(
            &raw.retry_after,
            &format!("{at}.retry_after"),
            Duration::from_secs(5),
        )?;
        let when_all_down = match raw.when_all_down {
            None | Some(RawAllDown::FailOpen) => AllDownPolicy::FailOpen,
            Some(RawAllDown::Reject) => AllDownPolicy::Reject { retry_after },
        };
        Ok(PoolConfig {
            active: self.active(&format!("{at}.active"), raw.active)?,
            passive: self.passive(&format!("{at}.passive"), raw.passive)?,
            retries: self.retries(&format!("{at}.retries"), raw.retries)?,
            timeouts: self.timeouts(&format!("{at}.timeouts"), raw.timeouts)?,
            name,
            backends,
            algorithm,
            when_all_down,
            slow_start: self.optional_duration(&raw.slow_start, &format!("{at}.slow_start"))?,
            gate_new_backends: raw.gate_new_backends.unwrap_or(true),
            connection_reuse: match raw.connection_reuse {
                None | Some(RawReuse::Private) => ConnectionReuse::Private,
                Some(RawReuse::Shared) => ConnectionReuse::Shared,
            },
        })
    }

    fn backends(
        &self,
        at: &str,
        pool_span: Range<usize>,
        raw: Option<Vec<Spanned<RawBackend>>>,
    ) -> Result<Vec<BackendConfig>, ConfigError> {
        let raw = raw.unwrap_or_default();
        if raw.is_empty() {
            return Err(self.error(
                Some(pool_span),
                &format!("{at}.backends"),
                r#"a pool needs at least one backend (add backends = [{ address = "127.0.0.1:9001" }])"#
                    .into(),
            ));
        }
        let mut backends: Vec<BackendConfig> = Vec::with_capacity(raw.len());
        for (index, backend) in raw.into_iter().enumerate() {
            let at = format!("{at}.backends[{index}]");
            let span = backend.span();
            let backend = backend.into_inner();
            let Some(address) = backend.address else {
                return Err(self.error(
                    Some(span),
                    &format!("{at}.address"),
                    r#"every backend needs an address (add address = "host:port")"#.into(),
                ));
            };
            let socket_addr = self.resolve(&address, &format!("{at}.address"))?;
            let (name, name_span) = match backend.name {
                None => (address.get_ref().clone(), address.span()),
                Some(name) => {
                    let span = name.span();
                    (self.name(name, &format!("{at}.name"))?, span)
                }
            };
            if let Some(other) = backends.iter().position(|b| b.name == name) {
                return Err(self.error(
                    Some(name_span),
                    &format!("{at}.name"),
                    format!(
                        "{name:?} is already the name of backends[{other}] \
                         (give each backend a unique name; it defaults to the address)"
                    ),
                ));
            }
            let weight = self.int(&backend.weight, &format!("{at}.weight"), 1, 1..=1000)? as u32;
            backends.push(BackendConfig {
                name,
                address: address.into_inner(),
                socket_addr,
                weight,
            });
        }
        Ok(backends)
    }

    /// Resolves `host:port` once, now; the first address wins.
    fn resolve(&self, address: &Spanned<String>, key: &str) -> Result<SocketAddr, ConfigError> {
        let text = address.get_ref();
        let fail = |why: String| {
            self.error(
                Some(address.span()),
                key,
                format!(
                    r#"{text:?} {why} (use host:port, e.g. "127.0.0.1:9001" or "backend.internal:8080")"#
                ),
            )
        };
        let resolved = match text.to_socket_addrs() {
            Ok(mut addrs) => addrs.next(),
            Err(error) => return Err(fail(format!("does not resolve: {error}"))),
        };
        match resolved {
            None => Err(fail("resolves to no address".into())),
            Some(addr) if addr.port() == 0 => Err(fail("has port 0".into())),
            Some(addr) => Ok(addr),
        }
    }

    fn active(&self, at: &str, raw: RawActive) -> Result<ActiveCheckConfig, ConfigError> {
        let kind = match raw.kind {
            None | Some(RawCheckKind::Http) => CheckKind::Http,
            Some(RawCheckKind::Tcp) => CheckKind::Tcp,
            Some(RawCheckKind::None) => CheckKind::None,
        };
        let path = match raw.path {
            None => "/healthz".to_owned(),
            Some(path) => {
                if !path.get_ref().starts_with('/') || !is_token_text(path.get_ref()) {
                    return Err(self.error(
                        Some(path.span()),
                        &format!("{at}.path"),
                        format!(
                            r#"{:?} is not a request path (start it with "/" and leave out spaces, e.g. "/healthz")"#,
                            path.get_ref()
                        ),
                    ));
                }
                path.into_inner()
            }
        };
        let host = match raw.host {
            None => None,
            Some(host) => {
                if host.get_ref().is_empty() || !is_token_text(host.get_ref()) {
                    return Err(self.error(
                        Some(host.span()),
                        &format!("{at}.host"),
                        format!(
                            r#"{:?} is not a Host header value (use e.g. "app.internal", without spaces)"#,
                            host.get_ref()
                        ),
                    ));
                }
                Some(host.into_inner())
            }
        };
        let expect = match raw.expect {
            None => StatusSet::default(),
            Some(expect) => expect.get_ref().parse::<StatusSet>().map_err(|error| {
                // The error quotes the offending item; skip it when that is the whole list.
                let quoted = format!("{:?}", expect.get_ref());
                let detail = error.to_string();
                let detail = detail
                    .strip_prefix(&format!("{quoted}: "))
                    .unwrap_or(&detail);
                self.error(
                    Some(expect.span()),
                    &format!("{at}.expect"),
                    format!(r#"{quoted} is not a status list: {detail} (use e.g. "200-299,302")"#),
                )
            })?,
        };
        Ok(ActiveCheckConfig {
            kind,
            path,
            host,
            expect,
            interval: self.duration(
                &raw.interval,
                &format!("{at}.interval"),
                Duration::from_secs(2),
            )?,
            timeout: self.duration(
                &raw.timeout,
                &format!("{at}.timeout"),
                Duration::from_secs(1),
            )?,
            rise: self.threshold(&raw.rise, &format!("{at}.rise"), 2)?,
            fall: self.threshold(&raw.fall, &format!("{at}.fall"), 3)?,
            jitter: self.jitter(&raw.jitter, &format!("{at}.jitter"))?,
            initial: match raw.initial {
                None | Some(RawInitial::Up) => State::Up,
                Some(RawInitial::Down) => State::Down,
            },
        })
    }

    fn jitter(&self, value: &Option<Spanned<Value>>, key: &str) -> Result<f64, ConfigError> {
        let Some(value) = value else {
            return Ok(0.1);
        };
        let fraction = match value.get_ref() {
            Value::String(text) => parse_percent(text),
            Value::Float(f) => Some(*f),
            Value::Integer(i) => Some(*i as f64),
            _ => None,
        };
        match fraction {
            Some(f) if (0.0..=0.5).contains(&f) => Ok(f),
            _ => Err(self.error(
                Some(value.span()),
                key,
                format!(
                    r#"{} is not a jitter within 0-50 % (use e.g. "10%", or a fraction such as 0.1)"#,
                    value.get_ref()
                ),
            )),
        }
    }

    fn passive(&self, at: &str, raw: RawPassive) -> Result<PassiveCheckConfig, ConfigError> {
        let ejection_key = format!("{at}.ejection_time");
        let max_key = format!("{at}.max_ejection_time");
        let ejection_time =
            self.duration(&raw.ejection_time, &ejection_key, Duration::from_secs(30))?;
        let max_ejection_time =
            self.duration(&raw.max_ejection_time, &max_key, Duration::from_secs(300))?;
        if max_ejection_time < ejection_time {
            // Point at the key that was written; max_ejection_time when both were.
            // (The defaults are ordered, so at least one of them was written.)
            let (span, key) = match (&raw.max_ejection_time, &raw.ejection_time) {
                (Some(max), _) => (Some(max.span()), &max_key),
                (None, Some(base)) => (Some(base.span()), &ejection_key),
                (None, None) => (None, &max_key),
            };
            return Err(self.error(
                span,
                key,
                format!(
                    "max_ejection_time {max_ejection_time:?} is shorter than ejection_time \
                     {ejection_time:?} (make max_ejection_time at least ejection_time)"
                ),
            ));
        }
        Ok(PassiveCheckConfig {
            enabled: raw.enabled.unwrap_or(true),
            consecutive_errors: self.threshold(
                &raw.consecutive_errors,
                &format!("{at}.consecutive_errors"),
                3,
            )?,
            count_503: raw.count_503.unwrap_or(true),
            ejection_time,
            max_ejection_time,
            max_ejected_percent: self.int(
                &raw.max_ejected_percent,
                &format!("{at}.max_ejected_percent"),
                50,
                0..=100,
            )? as u8,
            probes_end_ejection: raw.probes_end_ejection.unwrap_or(true),
        })
    }

    fn retries(&self, at: &str, raw: RawRetries) -> Result<RetryConfig, ConfigError> {
        Ok(RetryConfig {
            attempts: self.int(&raw.attempts, &format!("{at}.attempts"), 1, 0..=10)? as u32,
            budget_percent: self.int(
                &raw.budget_percent,
                &format!("{at}.budget_percent"),
                20,
                0..=100,
            )? as u8,
            min_budget: self.int(
                &raw.min_budget,
                &format!("{at}.min_budget"),
                10,
                0..=U32_MAX,
            )? as u32,
        })
    }

    fn timeouts(&self, at: &str, raw: RawTimeouts) -> Result<UpstreamTimeouts, ConfigError> {
        Ok(UpstreamTimeouts {
            connect: self.duration(
                &raw.connect,
                &format!("{at}.connect"),
                Duration::from_secs(1),
            )?,
            response_header: self.duration(
                &raw.response_header,
                &format!("{at}.response_header"),
                Duration::from_secs(15),
            )?,
            idle: self.duration(&raw.idle, &format!("{at}.idle"), Duration::from_secs(30))?,
            body_idle: self.duration(
                &raw.body_idle,
                &format!("{at}.body_idle"),
                Duration::from_secs(60),
            )?,
        })
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

    /// A duration above zero, or `None` when the key is absent (the feature is off).
    fn optional_duration(
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
            Some(duration) => Ok(Some(duration)),
        }
    }

    /// An integer within `range`, or `default` when the key is absent.
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
        Err(self.error(
            Some(value.span()),
            key,
            format!("{n} is out of range ({wanted})"),
        ))
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
