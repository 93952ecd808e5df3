//! A route answered with a redirect (`redirect`) rather than served by a pool.

use toml::Spanned;

use super::super::raw::{RawRedirect, RawRoute};
use super::header_rules::RulesFor;
use super::{ConfigError, Validator};
use crate::{Redirect, RedirectPath, RouteConfig, RouteTarget};

/// The statuses a redirect may have.
const STATUSES: [i64; 5] = [301, 302, 303, 307, 308];

impl Validator<'_> {
    /// A route whose `redirect` is `redirect` (and which has no pool).
    pub(super) fn redirect_route(
        &self,
        at: &str,
        span: std::ops::Range<usize>,
        mut raw: RawRoute,
        redirect: Spanned<RawRedirect>,
        rules_for: impl Fn(bool) -> RulesFor,
    ) -> Result<RouteConfig, ConfigError> {
        let key = format!("{at}.redirect");
        let mut route = self.route_matching(at, &mut raw, rules_for)?;
        let rewrites = raw.strip_prefix.is_some()
            || raw.replace_prefix.is_some()
            || raw.regex_rewrite.is_some();
        if rewrites || route.request_headers.is_some() || route.response_headers.is_some() {
            return Err(self.error(
                Some(span),
                &key,
                "a redirect route sends nothing to a backend: path rewrites and header rules \
                 have nothing to act on (use the redirect's path or prefix)"
                    .into(),
            ));
        }
        let table_span = redirect.span();
        let redirect = redirect.into_inner();
        let status = match &redirect.status {
            None => 302,
            Some(status) if STATUSES.contains(status.get_ref()) => *status.get_ref() as u16,
            Some(status) => {
                return Err(self.error(
                    Some(status.span()),
                    &format!("{key}.status"),
                    format!(
                        "{} is not a redirect status (use 301, 302, 303, 307 or 308)",
                        status.get_ref()
                    ),
                ))
            }
        };
        let scheme = match redirect.scheme {
            None => None,
            Some(scheme) if matches!(scheme.get_ref().as_str(), "http" | "https") => {
                Some(scheme.into_inner())
            }
            Some(scheme) => {
                return Err(self.error(
                    Some(scheme.span()),
                    &format!("{key}.scheme"),
                    format!(
                        r#"{:?} is not a scheme (use "http" or "https")"#,
                        scheme.get_ref()
                    ),
                ))
            }
        };
        let host = match redirect.host {
            None => None,
            Some(host) => Some(self.route_host(&host, &format!("{key}.host"))?),
        };
        let port = match &redirect.port {
            None => None,
            Some(_) => {
                Some(self.int(&redirect.port, &format!("{key}.port"), 0, 1..=65_535)? as u16)
            }
        };
        let path = match (redirect.path, redirect.prefix) {
            (Some(_), Some(prefix)) => {
                return Err(self.error(
                    Some(prefix.span()),
                    &format!("{key}.prefix"),
                    "give path (the whole path) or prefix (the route's path_prefix replaced), \
                     not both"
                        .into(),
                ))
            }
            (Some(path), None) => RedirectPath::Replace(self.redirect_path(&key, "path", path)?),
            (None, Some(prefix)) => {
                RedirectPath::Prefix(self.redirect_path(&key, "prefix", prefix)?)
            }
            (None, None) => RedirectPath::Same,
        };
        let strip_query = redirect.strip_query.unwrap_or(false);
        let redirect = Redirect {
            status,
            scheme,
            host,
            port,
            path,
            strip_query,
        };
        let to_itself = redirect.scheme.is_none()
            && redirect.host.is_none()
            && redirect.port.is_none()
            && redirect.path == RedirectPath::Same
            && !strip_query;
        if to_itself {
            return Err(self.error(
                Some(table_span),
                &key,
                "this redirect sends the client back to the URL it asked for (give at least \
                 one of scheme, host, port, path, prefix or strip_query = true)"
                    .into(),
            ));
        }
        route.target = RouteTarget::Redirect(Box::new(redirect));
        Ok(route)
    }

    fn redirect_path(
        &self,
        key: &str,
        name: &str,
        path: Spanned<String>,
    ) -> Result<String, ConfigError> {
        let text = path.get_ref();
        let ok = text.starts_with('/')
            && text
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
        if !ok {
            return Err(self.error(
                Some(path.span()),
                &format!("{key}.{name}"),
                format!(
                    r##"{text:?} is not a path (start it with "/", leave out spaces, "?" and "#")"##
                ),
            ));
        }
        Ok(path.into_inner())
    }
}
