//! `[pools.NAME]`: backends (their addresses checked, names queued for resolution), the
//! algorithm, active and passive checks, retries and timeouts.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::time::Duration;

use capataz_health::{BackupUse, MinHealthy, State, StatusSet};
use toml::{Spanned, Value};

use super::super::locate::line_of;
use super::super::raw::RawBackupUse;
use super::super::raw::{
    RawActive, RawAlgorithm, RawAllDown, RawBackend, RawBackendTls, RawCheckKind, RawInitial,
    RawPassive, RawPool, RawProtocol, RawRetries, RawReuse, RawTimeouts,
};
use super::super::resolve::{Lookup, Target};
use super::super::values::parse_percent;
use super::{is_token_text, ConfigError, Validator, U32_MAX};
use crate::config::{
    ActiveCheckConfig, Algorithm, AllDownPolicy, BackendConfig, BackendProtocol, CheckKind,
    ConnectionReuse, PassiveCheckConfig, PoolConfig, RetryConfig, UpstreamTimeouts,
};
use capataz_health::GrpcCodes;

impl Validator<'_> {
    pub(super) fn pool(
        &self,
        name: Spanned<String>,
        mut raw: RawPool,
    ) -> Result<PoolConfig, ConfigError> {
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
        let backends = self.backends(&name, &at, name_span.clone(), raw.backends.take())?;
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
        if backends.iter().all(|b| b.backup) {
            return Err(self.error(
                Some(name_span),
                &format!("{at}.backends"),
                "every backend is a backup; backups only stand in for primaries (leave \
                 backup = true out of at least one backend)"
                    .into(),
            ));
        }
        let min_healthy = self.min_healthy(&at, &raw, when_all_down)?;
        let explicit_kind = raw.active.kind;
        let protocol = match raw.protocol {
            None | Some(RawProtocol::Http1) => BackendProtocol::Http1,
            Some(RawProtocol::H2) => BackendProtocol::H2,
            Some(RawProtocol::H2c) => BackendProtocol::H2c,
        };
        let mut active = self.active(&format!("{at}.active"), raw.active)?;
        if protocol != BackendProtocol::Http1 {
            // The http probe speaks HTTP/1.1, which an HTTP/2 backend need not.
            match explicit_kind {
                None => active.kind = CheckKind::Tcp,
                Some(RawCheckKind::Http) => {
                    return Err(self.error(
                        Some(name_span),
                        &format!("{at}.active.kind"),
                        r#"the "http" probe speaks HTTP/1.1, and this pool's backends speak HTTP/2 (use kind = "tcp", the default for HTTP/2 pools, or "none")"#.into(),
                    ));
                }
                Some(_) => {}
            }
        }
        let tls = match (raw.tls, protocol) {
            (Some(RawBackendTls::Flag(false)), BackendProtocol::H2) => {
                return Err(self.error(
                    Some(name_span),
                    &format!("{at}.tls"),
                    r#"protocol = "h2" is HTTP/2 over TLS, and tls is false (remove tls = false, or use protocol = "h2c" for HTTP/2 without TLS)"#.into(),
                ));
            }
            (Some(RawBackendTls::Flag(true) | RawBackendTls::Table(_)), BackendProtocol::H2c) => {
                return Err(self.error(
                    Some(name_span),
                    &format!("{at}.tls"),
                    r#"protocol = "h2c" is HTTP/2 without TLS, and tls is on (use protocol = "h2" for HTTP/2 over TLS, or remove the tls settings)"#.into(),
                ));
            }
            (
                None | Some(RawBackendTls::Flag(false)),
                BackendProtocol::Http1 | BackendProtocol::H2c,
            ) => None,
            (None | Some(RawBackendTls::Flag(true)), _) => {
                Some(self.backend_tls(&name, &at, name_span.clone(), Default::default())?)
            }
            (Some(RawBackendTls::Table(table)), _) => {
                Some(self.backend_tls(&name, &at, name_span.clone(), table)?)
            }
        };
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
            connection_reuse: match raw.connection_reuse {
                None | Some(RawReuse::Private) => ConnectionReuse::Private,
                Some(RawReuse::Shared) => ConnectionReuse::Shared,
            },
            backups: match raw.backups {
                None | Some(RawBackupUse::First) => BackupUse::First,
                Some(RawBackupUse::All) => BackupUse::All,
            },
            min_healthy,
            close_tunnels_on_down: raw.close_tunnels_on_down.unwrap_or(false),
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
            backends.push(BackendConfig {
                name,
                address: address.into_inner(),
                socket_addr,
                weight,
                backup: backend.backup.unwrap_or(false),
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
            line: Some(line_of(self.text, address.span().start)),
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
        Ok(ActiveCheckConfig {
            disable_on_404,
            rise_after_maintenance,
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
        })
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
