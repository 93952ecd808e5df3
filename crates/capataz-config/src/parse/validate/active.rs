//! `[pools.NAME.active]`: the probe (kind, path, host, request, expected statuses and content
//! rules, gRPC service), its intervals, thresholds and initial state, and the jitter that
//! spreads probes out. Called from the pool's validation (`pool_active` in `pool.rs`, which
//! then fits the check's kind to the pool's protocol).

use std::time::Duration;

use capataz_health::{State, StatusSet};
use toml::{Spanned, Value};

use super::super::raw::{RawActive, RawCheckKind, RawInitial};
use super::super::values::parse_percent;
use super::{is_token_text, ConfigError, Validator};
use crate::{
    ActiveCheckConfig, CheckKind, ContentRules, DEFAULT_BODY_LIMIT, MAX_BODY_LIMIT,
    MAX_GRPC_SERVICE, MAX_MATCH_TEXT, MAX_PROBE_BODY, MAX_PROBE_HEADERS,
};

/// A probe request's method, extra header fields and body.
type ProbeRequest = (String, Vec<(String, String)>, Option<String>);

impl Validator<'_> {
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
        let tcp_exchange = self.tcp_exchange(at, &raw)?;
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
            tcp_exchange,
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
}
