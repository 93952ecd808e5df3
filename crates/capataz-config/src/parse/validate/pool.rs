//! `[pools.NAME]`: backends (their addresses checked, names queued for resolution), the
//! algorithm, TLS, PROXY protocol, agent check, `min_healthy`, retries and timeouts. The
//! active check's table is read in `active.rs` (`pool_active` here fits its kind to the
//! pool's protocol), the passive check's in `passive.rs`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::time::Duration;

use capataz_health::{BackupUse, MinHealthy};
use toml::Spanned;

use super::super::raw::RawBackupUse;
use super::super::raw::{
    RawActive, RawAgent, RawAlgorithm, RawAllDown, RawBackend, RawBackendTls, RawCheckKind,
    RawPool, RawProtocol, RawProxyVersion, RawRetries, RawReuse, RawTimeouts,
};
use super::super::resolve::{Lookup, Target};
use super::{ConfigError, Validator, U32_MAX};
use crate::{
    ActiveCheckConfig, AgentCheckConfig, Algorithm, AllDownPolicy, BackendConfig, BackendProtocol,
    BackendTls, CheckKind, ConnectionReuse, PoolConfig, RetryConfig, TrackTarget, UpstreamTimeouts,
};
use capataz_proxy_protocol::Version as ProxyVersion;

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
