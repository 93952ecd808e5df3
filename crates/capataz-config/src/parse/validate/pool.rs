//! `[pools.NAME]`: its name, source, algorithm, TLS, PROXY protocol, agent check,
//! `min_healthy`, all-down policy, retries and timeouts. The backends are read in
//! `backends.rs`, the active check's table in `active.rs` (`pool_active` here fits its kind to
//! the pool's protocol), the passive check's in `passive.rs`.

use std::ops::Range;
use std::time::Duration;

use capataz_health::{BackupUse, MinHealthy};
use toml::Spanned;

use super::super::raw::RawBackupUse;
use super::super::raw::{
    RawActive, RawAgent, RawAlgorithm, RawAllDown, RawBackendTls, RawCheckKind, RawPool,
    RawProtocol, RawProxyVersion, RawRetries, RawReuse, RawTimeouts,
};
use super::{ConfigError, Validator, U32_MAX};
use crate::{
    ActiveCheckConfig, AgentCheckConfig, Algorithm, AllDownPolicy, BackendProtocol, BackendTls,
    CheckKind, ConnectionReuse, PoolConfig, RetryConfig, UpstreamTimeouts,
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
        let protocol = match raw.protocol {
            None | Some(RawProtocol::Http1) => BackendProtocol::Http1,
            Some(RawProtocol::H2) => BackendProtocol::H2,
            Some(RawProtocol::H2c) => BackendProtocol::H2c,
            Some(RawProtocol::Tcp) => BackendProtocol::Tcp,
        };
        let (limits, own_limits) = self.limits(&at, &raw, protocol)?;
        let mut backends = if source.is_dynamic() {
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
            Some(RawAlgorithm::Hash) => Algorithm::Hash,
            Some(RawAlgorithm::PeakEwma) => Algorithm::PeakEwma,
        };
        // Before `affinity`, which takes the sticky table out of `raw`.
        if protocol == BackendProtocol::Tcp {
            self.tcp_pool(&at, &raw)?;
        }
        let affinity = self.affinity(&at, &name_span, algorithm, &mut raw)?;
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
        for (backend, limit) in backends.iter_mut().zip(own_limits) {
            backend.limit = limit;
        }
        let active = self.pool_active(&at, &name_span, protocol, raw.active)?;
        let tls = self.pool_tls(&name, &at, &name_span, raw.tls, protocol)?;
        self.unix_pool(&at, &backends, tls.is_some(), agent.is_some())?;
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
            affinity,
            limits,
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
        let exchange_key = super::tcp_probe::exchange_key(&raw);
        let mut active = self.active(&format!("{at}.active"), raw)?;
        match (protocol, explicit_kind) {
            // An HTTP/2 pool's default check connects only: an HTTP/2 backend need not
            // answer `GET /healthz`; `kind = "http"` probes it over HTTP/2.
            (BackendProtocol::H2 | BackendProtocol::H2c, None) => active.kind = CheckKind::Tcp,
            // A tcp pool's backends speak no HTTP: its check connects (`tcp_pool` refused
            // "http" and "grpc").
            (BackendProtocol::Tcp, None) => active.kind = CheckKind::Tcp,
            (BackendProtocol::Http1, Some(RawCheckKind::Grpc)) => {
                return Err(self.error(
                    Some(name_span.clone()),
                    &format!("{at}.active.kind"),
                    r#"the "grpc" check speaks HTTP/2, and this pool's backends speak HTTP/1.1 (set protocol = "h2c", or "h2" over TLS, as gRPC backends need; or use kind = "http" or "tcp")"#.into(),
                ));
            }
            _ => {}
        }
        if let (Some((key, span)), false) = (exchange_key, active.kind == CheckKind::Tcp) {
            let (key, span) = match explicit_kind {
                Some(_) => ("kind", name_span.clone()),
                None => (key, span),
            };
            return Err(self.error(
                Some(span),
                &format!("{at}.active.{key}"),
                r#"send, send_hex, expect_text and expect_hex are a "tcp" check's exchange, and this check is not kind = "tcp" (set kind = "tcp", or remove them)"#.into(),
            ));
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
                BackendProtocol::Http1 | BackendProtocol::H2c | BackendProtocol::Tcp,
            ) => None,
            (None | Some(RawBackendTls::Flag(true)), _) => {
                Some(self.backend_tls(name, at, name_span.clone(), Default::default())?)
            }
            (Some(RawBackendTls::Table(table)), _) => {
                Some(self.backend_tls(name, at, name_span.clone(), table)?)
            }
        })
    }

    /// `send_proxy_protocol`: one client per connection, so HTTP/1.1 with private reuse, or
    /// TCP.
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
            if protocol.is_h2() {
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
