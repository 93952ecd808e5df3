//! `[[pools.NAME.backends]]`: at least one; each backend's address (an IP literal, or a host
//! name checked for syntax and queued for resolution), its name (the address by default, unique
//! in the pool), weight, `agent_port` and `track`. Called from the pool's validation
//! (`pool.rs`).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;

use toml::Spanned;

use super::super::raw::RawBackend;
use super::super::resolve::{Lookup, Target};
use super::{ConfigError, Validator};
use crate::{BackendConfig, TrackTarget};

impl Validator<'_> {
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
                // Read with the pool's limits (`limits.rs`), which know its protocol.
                limit: None,
            });
        }
        Ok(backends)
    }

    /// Checks a backend's `host:port`. An IP literal is its address; a name is queued for
    /// stage three (resolution) and gets a placeholder address until then; a Unix socket
    /// (`unix:/path`, `unix.rs`) keeps the placeholder.
    pub(super) fn backend_address(
        &self,
        address: &Spanned<String>,
        key: &str,
        target: impl FnOnce() -> Target,
    ) -> Result<SocketAddr, ConfigError> {
        const ADVICE: &str = r#"use host:port, e.g. "127.0.0.1:9001" or "backend.internal:8080", or unix:/path for a Unix socket"#;
        let text = address.get_ref();
        if text.starts_with(crate::UNIX_PREFIX)
            || text.starts_with('/')
            || text.starts_with("unix@")
        {
            self.unix_backend(address, key)?;
            return Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        }
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
