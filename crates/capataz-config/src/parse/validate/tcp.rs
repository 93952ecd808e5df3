//! TCP mode: a listener's `mode`, `pool` and `session_timeout`, and what a pool with
//! `protocol = "tcp"` may not say. A `tcp` listener relays byte streams to one `tcp` pool; the
//! keys that only mean something for HTTP are refused on either, each with its line and key,
//! so nobody believes a key works that is ignored.

use std::ops::Range;

use toml::Spanned;

use super::super::raw::{RawCheckKind, RawListener, RawMode, RawPool};
use super::{ConfigError, Validator};
use crate::{BackendProtocol, PoolConfig, TcpListenerConfig};

impl Validator<'_> {
    /// A listener's mode: `Some` for `mode = "tcp"` (its pool and session limit), `None` for
    /// HTTP, which takes neither `pool` nor `session_timeout`.
    pub(super) fn listener_mode(
        &self,
        at: &str,
        span: &Range<usize>,
        raw: &RawListener,
        pools: &[PoolConfig],
    ) -> Result<Option<TcpListenerConfig>, ConfigError> {
        let tcp = raw
            .mode
            .as_ref()
            .is_some_and(|mode| *mode.get_ref() == RawMode::Tcp);
        if !tcp {
            if let Some(pool) = &raw.pool {
                return Err(self.error(
                    Some(pool.span()),
                    &format!("{at}.pool"),
                    "an HTTP listener routes with [[listeners.routes]] tables (write pool in a \
                     route, or set mode = \"tcp\" to relay byte streams to this pool)"
                        .into(),
                ));
            }
            if let Some(limit) = &raw.session_timeout {
                return Err(self.error(
                    Some(limit.span()),
                    &format!("{at}.session_timeout"),
                    "session_timeout limits a TCP session, and this listener serves HTTP (set \
                     mode = \"tcp\", or remove session_timeout)"
                        .into(),
                ));
            }
            if let Some(key) = super::sni::sni_key(raw) {
                return Err(self.error(
                    None,
                    &format!("{at}.{key}"),
                    format!(
                        "{key} routes TLS passthrough on a tcp listener, and this listener \
                         serves HTTP (set mode = \"tcp\", or route with [[listeners.routes]] \
                         and host)"
                    ),
                ));
            }
            return Ok(None);
        }
        self.no_http_keys(at, raw)?;
        let sni = self.sni_routing(at, raw, pools)?;
        let pool = match &raw.pool {
            Some(pool) => Some(self.tcp_pool_index(&format!("{at}.pool"), pool, pools)?),
            // Sessions that no route takes are closed.
            None if sni.is_some() => None,
            None => {
                return Err(self.error(
                    Some(span.clone()),
                    &format!("{at}.pool"),
                    "a mode = \"tcp\" listener relays to one pool (add pool = NAME, naming a \
                     pool with protocol = \"tcp\")"
                        .into(),
                ))
            }
        };
        let session_timeout =
            self.optional_duration(&raw.session_timeout, &format!("{at}.session_timeout"))?;
        Ok(Some(TcpListenerConfig {
            pool,
            session_timeout,
            sni,
        }))
    }

    /// The index of the pool `pool` names, for `key`: a pool with `protocol = "tcp"`.
    pub(super) fn tcp_pool_index(
        &self,
        key: &str,
        pool: &Spanned<String>,
        pools: &[PoolConfig],
    ) -> Result<usize, ConfigError> {
        let pool_index = match pools.iter().position(|p| p.name == *pool.get_ref()) {
            Some(index) => index,
            // Its own errors are reported; the config is refused, so any index will do.
            None if self.failed_pools.borrow().contains(pool.get_ref()) => 0,
            None => {
                return Err(self.error(
                    Some(pool.span()),
                    key,
                    format!(
                        "{:?} is not a pool (add [pools.{}] with protocol = \"tcp\")",
                        pool.get_ref(),
                        pool.get_ref()
                    ),
                ))
            }
        };
        if let Some(found) = pools.get(pool_index) {
            if found.protocol != BackendProtocol::Tcp && found.name == *pool.get_ref() {
                return Err(self.error(
                    Some(pool.span()),
                    key,
                    format!(
                        "pool {:?} speaks HTTP to its backends, and a mode = \"tcp\" listener \
                         relays byte streams (set protocol = \"tcp\" on [pools.{}])",
                        found.name, found.name
                    ),
                ));
            }
        }
        Ok(pool_index)
    }

    /// The keys of an HTTP listener, refused on a `tcp` one.
    fn no_http_keys(&self, at: &str, raw: &RawListener) -> Result<(), ConfigError> {
        let http2 = &raw.http2;
        let http2_written = http2.max_concurrent_streams.is_some()
            || http2.max_backend_connections.is_some()
            || http2.initial_stream_window_size.is_some()
            || http2.initial_connection_window_size.is_some()
            || http2.max_frame_size.is_some()
            || http2.keepalive_interval.is_some()
            || http2.keepalive_timeout.is_some();
        let written = [
            ("routes", !raw.routes.is_empty()),
            ("request_body_timeout", raw.request_body_timeout.is_some()),
            ("max_header_bytes", raw.max_header_bytes.is_some()),
            ("forwarded_headers", raw.forwarded_headers.is_some()),
            ("h2c", raw.h2c.is_some()),
            ("http2", http2_written),
            ("https_redirect", raw.https_redirect.is_some()),
            ("https_redirect_port", raw.https_redirect_port.is_some()),
            ("forwarded", raw.forwarded.is_some()),
            ("request_id", raw.request_id.is_some()),
            ("request_headers", raw.request_headers.is_some()),
            ("response_headers", raw.response_headers.is_some()),
            ("error_pages", raw.error_pages.is_some()),
            (
                "tls.hsts",
                raw.tls.as_ref().is_some_and(|tls| tls.hsts.is_some()),
            ),
            (
                "tls.http3",
                raw.tls.as_ref().is_some_and(|tls| tls.http3.is_some()),
            ),
        ];
        match written.iter().find(|(_, written)| *written) {
            Some((key, _)) => Err(self.error(
                None,
                &format!("{at}.{key}"),
                format!(
                    "{key} is an HTTP setting, and this listener has mode = \"tcp\" (remove \
                     {key}, or serve HTTP with mode = \"http\")"
                ),
            )),
            None => Ok(()),
        }
    }

    /// A `tcp` pool: the keys that only mean something for HTTP backends are refused; its
    /// active check connects (`kind = "tcp"`) unless it says `"none"`. `tls` applies: the
    /// sessions are relayed over TLS to the backends.
    pub(super) fn tcp_pool(&self, at: &str, raw: &RawPool) -> Result<(), ConfigError> {
        let timeouts = &raw.timeouts;
        let written = [
            ("connection_reuse", raw.connection_reuse.is_some()),
            // A session has no cookie, header, path or query: it hashes its client's address.
            ("sticky", raw.sticky.is_some()),
            (
                "hash_key",
                raw.hash_key
                    .as_ref()
                    .is_some_and(|key| key.get_ref() != "client_ip"),
            ),
            (
                "timeouts.response_header",
                timeouts.response_header.is_some(),
            ),
            ("timeouts.body_idle", timeouts.body_idle.is_some()),
            ("timeouts.idle", timeouts.idle.is_some()),
            (
                "active.kind",
                matches!(
                    raw.active.kind,
                    Some(RawCheckKind::Http | RawCheckKind::Grpc)
                ),
            ),
            ("active.path", raw.active.path.is_some()),
            ("active.expect", raw.active.expect.is_some()),
            ("active.method", raw.active.method.is_some()),
            ("active.body", raw.active.body.is_some()),
            ("active.body_contains", raw.active.body_contains.is_some()),
            ("active.expect_header", raw.active.expect_header.is_some()),
        ];
        match written.iter().find(|(_, written)| *written) {
            Some((key, _)) => Err(self.error(
                None,
                &format!("{at}.{key}"),
                format!(
                    "{key} is an HTTP setting, and this pool has protocol = \"tcp\" (remove \
                     {key}; a tcp pool's active check is kind = \"tcp\")"
                ),
            )),
            None => Ok(()),
        }
    }

    /// A route (or a listener's single default route) to pool `pool`: an HTTP listener cannot
    /// route to a `tcp` pool.
    pub(super) fn routable(
        &self,
        key: &str,
        span: Option<Range<usize>>,
        pool: &PoolConfig,
    ) -> Result<(), ConfigError> {
        if pool.protocol == BackendProtocol::Tcp {
            return Err(self.error(
                span,
                key,
                format!(
                    "pool {:?} relays byte streams (protocol = \"tcp\"), and this listener \
                     serves HTTP (relay to it from a listener with mode = \"tcp\" and pool = \
                     {:?})",
                    pool.name, pool.name
                ),
            ));
        }
        Ok(())
    }
}
