//! `[pools.NAME]`: backends (their addresses checked, names queued for resolution), the
//! algorithm, active and passive checks, retries and timeouts.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::ops::Range;
use std::time::Duration;

use capataz_health::{BackupUse, MinHealthy, Percentile, State, StatusSet};
use toml::{Spanned, Value};

use super::super::raw::RawBackupUse;
use super::super::raw::{
    RawActive, RawAgent, RawAlgorithm, RawAllDown, RawBackend, RawBackendTls, RawCheckKind,
    RawInitial, RawLatencyOutliers, RawLoadShedding, RawPassive, RawPool, RawProtocol,
    RawProxyVersion, RawRetries, RawReuse, RawSuccessRate, RawTimeouts,
};
use super::super::resolve::{Lookup, Target};
use super::super::values::parse_percent;
use super::{is_token_text, ConfigError, Validator, U32_MAX};
use crate::{
    ActiveCheckConfig, AgentCheckConfig, Algorithm, AllDownPolicy, BackendConfig, BackendProtocol,
    BackendTls, CheckKind, ConnectionReuse, ContentRules, LatencyOutliersConfig,
    LoadSheddingConfig, PassiveCheckConfig, PoolConfig, RetryConfig, SuccessRateConfig,
    TrackTarget, UpstreamTimeouts, DEFAULT_BODY_LIMIT, MAX_BODY_LIMIT, MAX_GRPC_SERVICE,
    MAX_MATCH_TEXT, MAX_PROBE_BODY, MAX_PROBE_HEADERS,
};
use capataz_health::GrpcCodes;
use capataz_proxy_protocol::Version as ProxyVersion;

/// A probe request's method, extra header fields and body.
type ProbeRequest = (String, Vec<(String, String)>, Option<String>);

impl Validator<'_> {
    pub(super) fn pool(
        &self,
        name: Spanned<String>,
        mut raw: RawPool,
    ) -> Result<PoolConfig, ConfigError> {
        let name_span = name.span();
        let name = name.into_inner();
        self.pool_name(&name, &name_span)?;
        let at = format!("pools.{name}");
        let agent = match raw.agent.take() {
            None => None,
            Some(agent) => Some(self.agent(&format!("{at}.agent"), agent)?),
        };
        let source = self.source(&name, &at, raw.source.take())?;
        let backends = if source.is_dynamic() {
            if let Some(first) = raw.backends.as_ref().and_then(|b| b.first()) {
                return Err(self.error(
                    Some(first.span()),
                    &format!("{at}.backends"),
                    format!(
                        "this pool's backends come from its source (kind = {:?}), so it takes \
                         no backends list (remove backends, or the source table)",
                        source.kind()
                    ),
                ));
            }
            Vec::new()
        } else {
            self.backends(&name, &at, name_span.clone(), raw.backends.take())?
        };
        if agent.is_none() {
            if let Some(index) = backends.iter().position(|b| b.agent_port.is_some()) {
                return Err(self.error(
                    Some(name_span),
                    &format!("{at}.backends[{index}].agent_port"),
                    format!(
                        "agent_port needs agent checks on the pool (add [pools.{name}.agent] \
                         with its port, interval and timeout)"
                    ),
                ));
            }
        }
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
        if !source.is_dynamic() && backends.iter().all(|b| b.backup) {
            return Err(self.error(
                Some(name_span),
                &format!("{at}.backends"),
                "every backend is a backup; backups only stand in for primaries (leave \
                 backup = true out of at least one backend)"
                    .into(),
            ));
        }
        let min_healthy = self.min_healthy(&at, &raw, when_all_down)?;
        let protocol = match raw.protocol {
            None | Some(RawProtocol::Http1) => BackendProtocol::Http1,
            Some(RawProtocol::H2) => BackendProtocol::H2,
            Some(RawProtocol::H2c) => BackendProtocol::H2c,
        };
        let active = self.pool_active(&at, &name_span, protocol, raw.active)?;
        let tls = self.pool_tls(&name, &at, &name_span, raw.tls, protocol)?;
        let connection_reuse = match raw.connection_reuse {
            None | Some(RawReuse::Private) => ConnectionReuse::Private,
            Some(RawReuse::Shared) => ConnectionReuse::Shared,
        };
        let send_proxy_protocol = self.send_proxy(
            &at,
            &name_span,
            raw.send_proxy_protocol,
            protocol,
            connection_reuse,
        )?;
        Ok(PoolConfig {
            protocol,
            tls,
            active,
            passive: self.passive(&format!("{at}.passive"), raw.passive)?,
            retries: self.retries(&format!("{at}.retries"), raw.retries)?,
            timeouts: self.timeouts(&format!("{at}.timeouts"), raw.timeouts)?,
            name,
            backends,
            algorithm,
            when_all_down,
            slow_start: self.optional_duration(&raw.slow_start, &format!("{at}.slow_start"))?,
            gate_new_backends: raw.gate_new_backends.unwrap_or(true),
            connection_reuse,
            send_proxy_protocol,
            backups: match raw.backups {
                None | Some(RawBackupUse::First) => BackupUse::First,
                Some(RawBackupUse::All) => BackupUse::All,
            },
            min_healthy,
            close_tunnels_on_down: raw.close_tunnels_on_down.unwrap_or(false),
            source,
            agent,
        })
    }

    /// A pool's name: letters, digits, `_`, `.` and `-`.
    fn pool_name(&self, name: &str, name_span: &Range<usize>) -> Result<(), ConfigError> {
        let valid_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !valid_name {
            return Err(self.error(
                Some(name_span.clone()),
                &format!("pools.{name}"),
                format!(
                    "{name:?} is not a pool name (use letters, digits, '_', '.' and '-', e.g. [pools.web])"
                ),
            ));
        }
        Ok(())
    }

    /// `[pools.NAME.active]`; an HTTP/2 pool's default check a TCP connect, a gRPC check only
    /// over HTTP/2.
    fn pool_active(
        &self,
        at: &str,
        name_span: &Range<usize>,
        protocol: BackendProtocol,
        raw: RawActive,
    ) -> Result<ActiveCheckConfig, ConfigError> {
        let explicit_kind = raw.kind;
        let mut active = self.active(&format!("{at}.active"), raw)?;
        match (protocol, explicit_kind) {
            // An HTTP/2 pool's default check connects only: an HTTP/2 backend need not
            // answer `GET /healthz`; `kind = "http"` probes it over HTTP/2.
            (BackendProtocol::H2 | BackendProtocol::H2c, None) => active.kind = CheckKind::Tcp,
            (BackendProtocol::Http1, Some(RawCheckKind::Grpc)) => {
                return Err(self.error(
                    Some(name_span.clone()),
                    &format!("{at}.active.kind"),
                    r#"the "grpc" check speaks HTTP/2, and this pool's backends speak HTTP/1.1 (set protocol = "h2c", or "h2" over TLS, as gRPC backends need; or use kind = "http" or "tcp")"#.into(),
                ));
            }
            _ => {}
        }
        Ok(active)
    }

    /// TLS to the backends: required by `h2`, refused with `h2c`, else as `tls` says.
    fn pool_tls(
        &self,
        name: &str,
        at: &str,
        name_span: &Range<usize>,
        raw: Option<RawBackendTls>,
        protocol: BackendProtocol,
    ) -> Result<Option<BackendTls>, ConfigError> {
        Ok(match (raw, protocol) {
            (Some(RawBackendTls::Flag(false)), BackendProtocol::H2) => {
                return Err(self.error(
                    Some(name_span.clone()),
                    &format!("{at}.tls"),
                    r#"protocol = "h2" is HTTP/2 over TLS, and tls is false (remove tls = false, or use protocol = "h2c" for HTTP/2 without TLS)"#.into(),
                ));
            }
            (Some(RawBackendTls::Flag(true) | RawBackendTls::Table(_)), BackendProtocol::H2c) => {
                return Err(self.error(
                    Some(name_span.clone()),
                    &format!("{at}.tls"),
                    r#"protocol = "h2c" is HTTP/2 without TLS, and tls is on (use protocol = "h2" for HTTP/2 over TLS, or remove the tls settings)"#.into(),
                ));
            }
            (
                None | Some(RawBackendTls::Flag(false)),
                BackendProtocol::Http1 | BackendProtocol::H2c,
            ) => None,
            (None | Some(RawBackendTls::Flag(true)), _) => {
                Some(self.backend_tls(name, at, name_span.clone(), Default::default())?)
            }
            (Some(RawBackendTls::Table(table)), _) => {
                Some(self.backend_tls(name, at, name_span.clone(), table)?)
            }
        })
    }

    /// `send_proxy_protocol`: one client per connection, so HTTP/1.1 and private reuse only.
    fn send_proxy(
        &self,
        at: &str,
        name_span: &Range<usize>,
        raw: Option<RawProxyVersion>,
        protocol: BackendProtocol,
        connection_reuse: ConnectionReuse,
    ) -> Result<Option<ProxyVersion>, ConfigError> {
        let send_proxy_protocol = match raw {
            None => None,
            Some(RawProxyVersion::V1) => Some(ProxyVersion::V1),
            Some(RawProxyVersion::V2) => Some(ProxyVersion::V2),
        };
        if send_proxy_protocol.is_some() {
            if protocol != BackendProtocol::Http1 {
                return Err(self.error(
                    Some(name_span.clone()),
                    &format!("{at}.send_proxy_protocol"),
                    "a PROXY protocol header names one client for a whole connection, and an \
                     HTTP/2 backend connection carries many clients' requests at once (remove \
                     send_proxy_protocol, or speak HTTP/1.1 to these backends)"
                        .into(),
                ));
            }
            if connection_reuse == ConnectionReuse::Shared {
                return Err(self.error(
                    Some(name_span.clone()),
                    &format!("{at}.send_proxy_protocol"),
                    r#"a PROXY protocol header names one client for a whole connection, and connection_reuse = "shared" lets any client's request reuse it (remove connection_reuse = "shared": the default, "private", keeps each backend connection to the client connection it was opened for)"#
                        .into(),
                ));
            }
        }
        Ok(send_proxy_protocol)
    }

    /// `[pools.<name>.agent]`: its port is required (there is no conventional agent port).
    fn agent(&self, at: &str, raw: RawAgent) -> Result<AgentCheckConfig, ConfigError> {
        let Some(port) = &raw.port else {
            return Err(self.error(
                None,
                &format!("{at}.port"),
                "agent checks need the agent's port (add port = 9777 under the agent table)".into(),
            ));
        };
        let port = self.int(&Some(port.clone()), &format!("{at}.port"), 0, 1..=65535)? as u16;
        Ok(AgentCheckConfig {
            port,
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
        })
    }

    /// `min_healthy` (1 to 10,000, default 1) and `min_healthy_percent` (0-100, default 0):
    /// only with `when_all_down = "fail_open"`, since the threshold makes a pool fail open.
    fn min_healthy(
        &self,
        at: &str,
        raw: &RawPool,
        when_all_down: AllDownPolicy,
    ) -> Result<MinHealthy, ConfigError> {
        let count_key = format!("{at}.min_healthy");
        let percent_key = format!("{at}.min_healthy_percent");
        let count = self.int(&raw.min_healthy, &count_key, 1, 1..=10_000)? as u32;
        let percent = self.int(&raw.min_healthy_percent, &percent_key, 0, 0..=100)? as u8;
        let threshold = MinHealthy { count, percent };
        if threshold.is_set() && matches!(when_all_down, AllDownPolicy::Reject { .. }) {
            let (span, key) = match (&raw.min_healthy, &raw.min_healthy_percent) {
                (Some(v), _) if count > 1 => (v.span(), count_key),
                (_, Some(v)) => (v.span(), percent_key),
                (Some(v), None) => (v.span(), count_key),
                (None, None) => unreachable!("a threshold is set only from a key"),
            };
            return Err(self.error(
                Some(span),
                &key,
                "a minimum healthy share makes a pool fail open, but when_all_down is \
                 \"reject\" (set when_all_down = \"fail_open\", or leave the threshold out)"
                    .into(),
            ));
        }
        Ok(threshold)
    }

    pub(super) fn backends(
        &self,
        pool: &str,
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
        // Each name's index, so that a pool of many thousands of backends is checked in linear
        // time (a scan per backend took half a minute at 50,000).
        let mut seen: HashMap<String, usize> = HashMap::with_capacity(raw.len());
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
            let socket_addr =
                self.backend_address(&address, &format!("{at}.address"), || Target::Backend {
                    pool: pool.to_owned(),
                    index,
                })?;
            let (name, name_span) = match backend.name {
                None => (address.get_ref().clone(), address.span()),
                Some(name) => {
                    let span = name.span();
                    (self.name(name, &format!("{at}.name"))?, span)
                }
            };
            if let Some(&other) = seen.get(&name) {
                return Err(self.error(
                    Some(name_span),
                    &format!("{at}.name"),
                    format!(
                        "{name:?} is already the name of backends[{other}] \
                         (give each backend a unique name; it defaults to the address)"
                    ),
                ));
            }
            seen.insert(name.clone(), index);
            let weight = self.int(&backend.weight, &format!("{at}.weight"), 1, 1..=1000)? as u32;
            let agent_port = match &backend.agent_port {
                None => None,
                Some(port) => Some(self.int(
                    &Some(port.clone()),
                    &format!("{at}.agent_port"),
                    0,
                    1..=65535,
                )? as u16),
            };
            let track = backend.track.map(|track| {
                let text = track.into_inner();
                match text.split_once('/') {
                    Some((pool, backend)) => TrackTarget {
                        pool: pool.to_owned(),
                        backend: backend.to_owned(),
                    },
                    None => TrackTarget {
                        pool: pool.to_owned(),
                        backend: text,
                    },
                }
            });
            backends.push(BackendConfig {
                name,
                address: address.into_inner(),
                socket_addr,
                weight,
                backup: backend.backup.unwrap_or(false),
                agent_port,
                track,
            });
        }
        Ok(backends)
    }

    /// Checks a backend's `host:port`. An IP literal is its address; a name is queued for
    /// stage three (resolution) and gets a placeholder address until then.
    pub(super) fn backend_address(
        &self,
        address: &Spanned<String>,
        key: &str,
        target: impl FnOnce() -> Target,
    ) -> Result<SocketAddr, ConfigError> {
        const ADVICE: &str = r#"use host:port, e.g. "127.0.0.1:9001" or "backend.internal:8080""#;
        let text = address.get_ref();
        let fail = |why: &str| {
            self.error(
                Some(address.span()),
                key,
                format!("{text:?} {why} ({ADVICE})"),
            )
        };
        if let Ok(literal) = text.parse::<SocketAddr>() {
            if literal.port() == 0 {
                return Err(fail("has port 0"));
            }
            return Ok(literal);
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(fail("has no port"));
        };
        let port_ok = !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_ok_and(|p| p != 0);
        if !port_ok {
            return Err(fail("has a bad port (use 1-65535)"));
        }
        if !is_host_name(host) {
            return Err(fail("does not start with a host name or an IP address"));
        }
        self.lookups.borrow_mut().push(Lookup {
            target: target(),
            host_port: text.clone(),
            file: self.file.to_owned(),
            line: Some(self.line_at(address.span().start)),
            key: key.to_owned(),
            subject: format!("{text:?}"),
            advice: ADVICE,
        });
        Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
    }

    pub(super) fn active(
        &self,
        at: &str,
        raw: RawActive,
    ) -> Result<ActiveCheckConfig, ConfigError> {
        let kind = match raw.kind {
            None | Some(RawCheckKind::Http) => CheckKind::Http,
            Some(RawCheckKind::Tcp) => CheckKind::Tcp,
            Some(RawCheckKind::Grpc) => CheckKind::Grpc,
            Some(RawCheckKind::None) => CheckKind::None,
        };
        let grpc_service = self.grpc_service(at, kind, raw.grpc_service.as_ref())?;
        let request = self.probe_request(at, kind, &raw)?;
        let content = self.content_rules(at, kind, &request.0, &raw)?;
        let path = self.probe_path(at, kind, raw.path)?;
        let host = self.probe_host(at, raw.host)?;
        let expect = self.probe_expect(at, kind, raw.expect)?;
        let disable_on_404 = raw.disable_on_404.unwrap_or(false);
        if disable_on_404 && kind != CheckKind::Http {
            return Err(self.error(
                None,
                &format!("{at}.disable_on_404"),
                "disable_on_404 reads an HTTP status, but the check is not kind = \"http\" \
                 (use kind = \"http\", or leave disable_on_404 out)"
                    .into(),
            ));
        }
        let rise_after_maintenance = match &raw.rise_after_maintenance {
            None => None,
            Some(_) => Some(self.threshold(
                &raw.rise_after_maintenance,
                &format!("{at}.rise_after_maintenance"),
                2,
            )?),
        };
        let interval = self.duration(
            &raw.interval,
            &format!("{at}.interval"),
            Duration::from_secs(2),
        )?;
        Ok(ActiveCheckConfig {
            disable_on_404,
            rise_after_maintenance,
            kind,
            path,
            host,
            expect,
            interval,
            fast_interval: self.duration(
                &raw.fast_interval,
                &format!("{at}.fast_interval"),
                interval,
            )?,
            down_interval: self.duration(
                &raw.down_interval,
                &format!("{at}.down_interval"),
                interval,
            )?,
            method: request.0,
            headers: request.1,
            body: request.2,
            content,
            grpc_service,
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
                Some(RawInitial::Down | RawInitial::FirstProbe) => State::Down,
            },
            first_probe: matches!(raw.initial, Some(RawInitial::FirstProbe)),
        })
    }

    /// A gRPC check's service name (only with `kind = "grpc"`; empty: the whole server).
    fn grpc_service(
        &self,
        at: &str,
        kind: CheckKind,
        service: Option<&Spanned<String>>,
    ) -> Result<String, ConfigError> {
        Ok(match service {
            None => String::new(),
            Some(service) => {
                if kind != CheckKind::Grpc {
                    return Err(self.error(
                        Some(service.span()),
                        &format!("{at}.grpc_service"),
                        r#"grpc_service names the service a gRPC health check asks about, and the check is not kind = "grpc" (set kind = "grpc", or remove grpc_service)"#.into(),
                    ));
                }
                let name = service.get_ref();
                if name.len() > MAX_GRPC_SERVICE || name.chars().any(char::is_control) {
                    return Err(self.error(
                        Some(service.span()),
                        &format!("{at}.grpc_service"),
                        format!(
                            "this is not a gRPC service name (use the service's full name, e.g. \"shop.Cart\", at most {MAX_GRPC_SERVICE} bytes without control characters; empty asks about the whole server)"
                        ),
                    ));
                }
                name.clone()
            }
        })
    }

    /// The probe's path (`/healthz` by default; none for gRPC).
    fn probe_path(
        &self,
        at: &str,
        kind: CheckKind,
        raw: Option<Spanned<String>>,
    ) -> Result<String, ConfigError> {
        Ok(match raw {
            None => "/healthz".to_owned(),
            Some(path) if kind == CheckKind::Grpc => {
                return Err(self.error(
                    Some(path.span()),
                    &format!("{at}.path"),
                    r#"a gRPC health check calls /grpc.health.v1.Health/Check, not a path (remove path; grpc_service names the service to ask about)"#.into(),
                ));
            }
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
        })
    }

    /// The probe's Host header value, if set.
    fn probe_host(
        &self,
        at: &str,
        raw: Option<Spanned<String>>,
    ) -> Result<Option<String>, ConfigError> {
        Ok(match raw {
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
        })
    }

    /// The statuses a probe passes on (not for gRPC, which passes on SERVING).
    fn probe_expect(
        &self,
        at: &str,
        kind: CheckKind,
        raw: Option<Spanned<String>>,
    ) -> Result<StatusSet, ConfigError> {
        if let (CheckKind::Grpc, Some(expect)) = (kind, &raw) {
            return Err(self.error(
                Some(expect.span()),
                &format!("{at}.expect"),
                r#"a gRPC health check passes on SERVING, not on an HTTP status (remove expect, or use kind = "http")"#.into(),
            ));
        }
        Ok(match raw {
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
        })
    }

    /// The probe request's method, extra header fields and body.
    fn probe_request(
        &self,
        at: &str,
        kind: CheckKind,
        raw: &RawActive,
    ) -> Result<ProbeRequest, ConfigError> {
        let only_http = |span: std::ops::Range<usize>, key: &str| {
            self.error(
                Some(span),
                &format!("{at}.{key}"),
                format!(r#"{key} only applies to HTTP probes (set kind = "http" or remove {key})"#),
            )
        };
        let method = match &raw.method {
            None => "GET".to_owned(),
            Some(method) => {
                if kind != CheckKind::Http {
                    return Err(only_http(method.span(), "method"));
                }
                let text = method.get_ref();
                if text.is_empty()
                    || text.len() > 16
                    || !text.bytes().all(|b| b.is_ascii_uppercase())
                {
                    return Err(self.error(
                        Some(method.span()),
                        &format!("{at}.method"),
                        format!(
                            r#"{text:?} is not a request method (use upper-case letters, at most 16, e.g. "GET" or "POST")"#
                        ),
                    ));
                }
                text.clone()
            }
        };
        let mut headers = Vec::new();
        for (name, value) in raw.headers.iter().flatten() {
            let key = format!("{at}.headers.{name}");
            if kind != CheckKind::Http {
                return Err(only_http(value.span(), "headers"));
            }
            if headers.len() == MAX_PROBE_HEADERS {
                return Err(self.error(
                    Some(value.span()),
                    &key,
                    format!("a probe sends at most {MAX_PROBE_HEADERS} extra header fields"),
                ));
            }
            if http::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(self.error(
                    Some(value.span()),
                    &key,
                    format!(r#"{name:?} is not a header field name (use e.g. "X-Probe")"#),
                ));
            }
            let lower = name.to_ascii_lowercase();
            if matches!(
                lower.as_str(),
                "host" | "content-length" | "transfer-encoding" | "connection" | "user-agent"
            ) {
                return Err(self.error(
                    Some(value.span()),
                    &key,
                    format!(
                        "{name} is set by capataz (Host from host, Content-Length from body,                          Connection: close, its User-Agent); remove it"
                    ),
                ));
            }
            let text = value.get_ref();
            if text.len() > 4096 || text.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
                return Err(self.error(
                    Some(value.span()),
                    &key,
                    "is not a header field value (no control characters, at most 4096 bytes)"
                        .into(),
                ));
            }
            headers.push((name.clone(), text.clone()));
        }
        let body = match &raw.body {
            None => None,
            Some(body) => {
                if kind != CheckKind::Http {
                    return Err(only_http(body.span(), "body"));
                }
                if body.get_ref().len() > MAX_PROBE_BODY {
                    return Err(self.error(
                        Some(body.span()),
                        &format!("{at}.body"),
                        format!("the probe request body is at most {MAX_PROBE_BODY} bytes"),
                    ));
                }
                Some(body.get_ref().clone())
            }
        };
        Ok((method, headers, body))
    }

    /// The body and header rules an answer must meet.
    fn content_rules(
        &self,
        at: &str,
        kind: CheckKind,
        method: &str,
        raw: &RawActive,
    ) -> Result<ContentRules, ConfigError> {
        let text = |value: &Option<toml::Spanned<String>>, key: &str| {
            let Some(value) = value else {
                return Ok(None);
            };
            let full = format!("{at}.{key}");
            if kind != CheckKind::Http {
                return Err(self.error(
                    Some(value.span()),
                    &full,
                    format!(
                        r#"{key} only applies to HTTP probes (set kind = "http" or remove {key})"#
                    ),
                ));
            }
            let len = value.get_ref().len();
            if len == 0 || len > MAX_MATCH_TEXT {
                return Err(self.error(
                    Some(value.span()),
                    &full,
                    format!("use a text of 1 to {MAX_MATCH_TEXT} bytes"),
                ));
            }
            Ok(Some(value.get_ref().clone()))
        };
        let body_contains = text(&raw.body_contains, "body_contains")?;
        let body_not_contains = text(&raw.body_not_contains, "body_not_contains")?;
        let header_contains = text(&raw.expect_header_contains, "expect_header_contains")?;
        let header = match &raw.expect_header {
            None => {
                if let Some(value) = &raw.expect_header_contains {
                    return Err(self.error(
                        Some(value.span()),
                        &format!("{at}.expect_header_contains"),
                        "expect_header_contains needs expect_header (the field's name)".into(),
                    ));
                }
                None
            }
            Some(name) => {
                if kind != CheckKind::Http {
                    return Err(self.error(
                        Some(name.span()),
                        &format!("{at}.expect_header"),
                        r#"expect_header only applies to HTTP probes (set kind = "http" or remove expect_header)"#.into(),
                    ));
                }
                if http::header::HeaderName::from_bytes(name.get_ref().as_bytes()).is_err() {
                    return Err(self.error(
                        Some(name.span()),
                        &format!("{at}.expect_header"),
                        format!(
                            r#"{:?} is not a header field name (use e.g. "X-Ready")"#,
                            name.get_ref()
                        ),
                    ));
                }
                Some((name.get_ref().to_ascii_lowercase(), header_contains))
            }
        };
        let limit_key = format!("{at}.body_limit");
        let body_limit = self.int(
            &raw.body_limit,
            &limit_key,
            DEFAULT_BODY_LIMIT as i64,
            1..=MAX_BODY_LIMIT as i64,
        )? as usize;
        let rules = ContentRules {
            body_contains,
            body_not_contains,
            body_limit,
            header,
        };
        if rules.reads_body() && method == "HEAD" {
            let span = raw
                .body_contains
                .as_ref()
                .or(raw.body_not_contains.as_ref())
                .map(|v| v.span());
            return Err(self.error(
                span,
                &format!("{at}.method"),
                "a HEAD answer has no body to match (use GET, or remove the body rules)".into(),
            ));
        }
        Ok(rules)
    }

    pub(super) fn jitter(
        &self,
        value: &Option<Spanned<Value>>,
        key: &str,
    ) -> Result<f64, ConfigError> {
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
            _ => {
                self.report(self.error(
                    Some(value.span()),
                    key,
                    format!(
                        r#"{} is not a jitter within 0-50 % (use e.g. "10%", or a fraction such as 0.1)"#,
                        value.get_ref()
                    ),
                ));
                Ok(0.1)
            }
        }
    }

    pub(super) fn passive(
        &self,
        at: &str,
        raw: RawPassive,
    ) -> Result<PassiveCheckConfig, ConfigError> {
        let errors_before = self.error_count();
        let ejection_key = format!("{at}.ejection_time");
        let max_key = format!("{at}.max_ejection_time");
        let ejection_time =
            self.duration(&raw.ejection_time, &ejection_key, Duration::from_secs(30))?;
        let max_ejection_time =
            self.duration(&raw.max_ejection_time, &max_key, Duration::from_secs(300))?;
        // Compared only when both were read without error (not placeholders).
        if max_ejection_time < ejection_time && self.error_count() == errors_before {
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
            grpc_error_codes: self
                .grpc_codes(&raw.grpc_error_codes, &format!("{at}.grpc_error_codes"))?,
            latency_outliers: match raw.latency_outliers {
                Some(raw) => self.latency_outliers(&format!("{at}.latency_outliers"), raw)?,
                None => None,
            },
            load_shedding: match raw.load_shedding {
                Some(raw) => self.load_shedding(&format!("{at}.load_shedding"), raw)?,
                None => None,
            },
            success_rate: match raw.success_rate {
                Some(raw) => self.success_rate(&format!("{at}.success_rate"), raw)?,
                None => None,
            },
        })
    }

    /// `[pools.NAME.passive.success_rate]`: checked whole even when not enabled.
    fn success_rate(
        &self,
        at: &str,
        raw: RawSuccessRate,
    ) -> Result<Option<SuccessRateConfig>, ConfigError> {
        let stdev_factor_milli = match &raw.stdev_factor {
            None => 1900,
            Some(value) => {
                let n = match value.get_ref() {
                    Value::Float(f) => Some(*f),
                    Value::Integer(i) => Some(*i as f64),
                    _ => None,
                };
                match n {
                    Some(n) if (0.1..=10.0).contains(&n) => (n * 1000.0).round() as u32,
                    _ => {
                        return Err(self.error(
                            Some(value.span()),
                            &format!("{at}.stdev_factor"),
                            format!(
                                "{} is not a factor from 0.1 to 10 (use a number such as 1.9, \
                                 Envoy's default)",
                                value.get_ref()
                            ),
                        ))
                    }
                }
            }
        };
        let config = SuccessRateConfig {
            window: self.duration(
                &raw.window,
                &format!("{at}.window"),
                Duration::from_secs(10),
            )?,
            min_requests: self.int(
                &raw.min_requests,
                &format!("{at}.min_requests"),
                100,
                1..=1_000_000,
            )? as u32,
            min_backends: self.int(
                &raw.min_backends,
                &format!("{at}.min_backends"),
                5,
                2..=100_000,
            )? as u32,
            stdev_factor_milli,
        };
        Ok(raw.enabled.unwrap_or(false).then_some(config))
    }

    /// `[pools.NAME.passive.load_shedding]`: checked whole even when not enabled.
    fn load_shedding(
        &self,
        at: &str,
        raw: RawLoadShedding,
    ) -> Result<Option<LoadSheddingConfig>, ConfigError> {
        let config = LoadSheddingConfig {
            weight_percent: self.int(
                &raw.weight_percent,
                &format!("{at}.weight_percent"),
                10,
                1..=100,
            )? as u8,
            max_retry_after: self.duration(
                &raw.max_retry_after,
                &format!("{at}.max_retry_after"),
                Duration::from_secs(300),
            )?,
            default_retry_after: self.duration(
                &raw.default_retry_after,
                &format!("{at}.default_retry_after"),
                Duration::from_secs(1),
            )?,
        };
        Ok(raw.enabled.unwrap_or(false).then_some(config))
    }

    /// `[pools.NAME.passive.latency_outliers]`: checked whole even when not enabled.
    fn latency_outliers(
        &self,
        at: &str,
        raw: RawLatencyOutliers,
    ) -> Result<Option<LatencyOutliersConfig>, ConfigError> {
        let percentile = match &raw.percentile {
            None => Percentile::P99,
            Some(text) => match text.get_ref().as_str() {
                "p50" => Percentile::P50,
                "p99" => Percentile::P99,
                other => {
                    return Err(self.error(
                        Some(text.span()),
                        &format!("{at}.percentile"),
                        format!("{other:?} is not a percentile (use \"p50\" or \"p99\")"),
                    ))
                }
            },
        };
        let config = LatencyOutliersConfig {
            percentile,
            factor: NonZeroU32::new(
                self.int(&raw.factor, &format!("{at}.factor"), 3, 2..=1000)? as u32
            )
            .unwrap_or(NonZeroU32::MIN),
            windows: NonZeroU32::new(
                self.int(&raw.windows, &format!("{at}.windows"), 3, 1..=100)? as u32,
            )
            .unwrap_or(NonZeroU32::MIN),
            window: self.duration(
                &raw.window,
                &format!("{at}.window"),
                Duration::from_secs(10),
            )?,
            min_requests: self.int(
                &raw.min_requests,
                &format!("{at}.min_requests"),
                20,
                1..=1_000_000,
            )? as u32,
            min_latency: self.duration(
                &raw.min_latency,
                &format!("{at}.min_latency"),
                Duration::from_millis(5),
            )?,
        };
        Ok(raw.enabled.unwrap_or(false).then_some(config))
    }

    /// A list of gRPC status codes, each 1-16; the default set when absent.
    fn grpc_codes(
        &self,
        value: &Option<Spanned<Vec<Spanned<i64>>>>,
        key: &str,
    ) -> Result<GrpcCodes, ConfigError> {
        let Some(list) = value else {
            return Ok(GrpcCodes::DEFAULT_ERRORS);
        };
        let mut codes = Vec::with_capacity(list.get_ref().len());
        for code in list.get_ref() {
            let n = *code.get_ref();
            if !(1..=16).contains(&n) {
                return Err(self.error(
                    Some(code.span()),
                    key,
                    format!(
                        "{n} is not a gRPC error code (use codes 1-16, e.g. [14, 4, 13, 2] for \
                         UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN; [] counts none)"
                    ),
                ));
            }
            // 1..=16 fits in a u8.
            codes.push(n as u8);
        }
        Ok(GrpcCodes::of(codes))
    }

    pub(super) fn retries(&self, at: &str, raw: RawRetries) -> Result<RetryConfig, ConfigError> {
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

    pub(super) fn timeouts(
        &self,
        at: &str,
        raw: RawTimeouts,
    ) -> Result<UpstreamTimeouts, ConfigError> {
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
}

/// A DNS name as a resolver takes it: labels of letters, digits, `-` and `_`, separated by dots
/// (a trailing dot allowed), 253 bytes at most.
fn is_host_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}
