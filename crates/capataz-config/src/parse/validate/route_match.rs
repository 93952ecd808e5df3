//! A route's matchers beyond `host` and `path_prefix`: `name`, `methods`, `path`,
//! `path_regex`, `headers` and `query` (see `route_rules`).

use http::{HeaderName, HeaderValue, Method};
use toml::Spanned;

use super::super::raw::{RawRoute, RawValueMatch};
use super::{ConfigError, Validator};
use crate::{HeaderMatch, PathRewrite, QueryMatch, RouteMatch, RouteRegex, ValueMatch};

impl Validator<'_> {
    /// The route's `name`, if written.
    pub(super) fn route_name(
        &self,
        at: &str,
        raw: &mut RawRoute,
    ) -> Result<Option<String>, ConfigError> {
        let Some(name) = raw.name.take() else {
            return Ok(None);
        };
        let text = name.get_ref();
        if text.is_empty() || text.chars().any(|c| c.is_control() || c == '"') {
            return Err(self.error(
                Some(name.span()),
                &format!("{at}.name"),
                "a route's name must be non-empty text without quotes or control characters \
                 (or leave the key out: the route is then labelled by its host and path prefix)"
                    .into(),
            ));
        }
        Ok(Some(name.into_inner()))
    }

    /// The matchers written on the route; `None` when it has none.
    pub(super) fn route_match(
        &self,
        at: &str,
        raw: &mut RawRoute,
    ) -> Result<Option<Box<RouteMatch>>, ConfigError> {
        let mut matches = RouteMatch::default();
        if let Some(methods) = raw.methods.take() {
            if methods.is_empty() {
                return Err(self.error(
                    None,
                    &format!("{at}.methods"),
                    r#"list at least one method (e.g. ["GET", "HEAD"]), or leave the key out to match any"#.into(),
                ));
            }
            for (index, method) in methods.into_iter().enumerate() {
                matches
                    .methods
                    .push(self.method(&format!("{at}.methods[{index}]"), &method)?);
            }
        }
        if let Some(path) = raw.path.take() {
            let text = path.get_ref();
            if !text.starts_with('/') || !is_path(text) {
                return Err(self.error(
                    Some(path.span()),
                    &format!("{at}.path"),
                    format!(
                        r##"{text:?} is not a path (start it with "/", leave out spaces, "?" and "#", e.g. "/login")"##
                    ),
                ));
            }
            matches.path = Some(path.into_inner());
        }
        if let Some(pattern) = raw.path_regex.take() {
            matches.path_regex = Some(self.regex(&format!("{at}.path_regex"), &pattern)?);
        }
        for (index, entry) in raw.headers.take().into_iter().flatten().enumerate() {
            let at = format!("{at}.headers[{index}]");
            matches.headers.push(self.header_match(&at, entry)?);
        }
        for (index, entry) in raw.query.take().into_iter().flatten().enumerate() {
            let at = format!("{at}.query[{index}]");
            matches.query.push(self.query_match(&at, entry)?);
        }
        if matches == RouteMatch::default() {
            return Ok(None);
        }
        Ok(Some(Box::new(matches)))
    }

    /// `strip_prefix`, `replace_prefix` or `regex_rewrite` (one at most).
    pub(super) fn path_rewrite(
        &self,
        at: &str,
        span: std::ops::Range<usize>,
        raw: &mut RawRoute,
    ) -> Result<Option<Box<PathRewrite>>, ConfigError> {
        let strip = raw.strip_prefix.take().filter(|strip| *strip.get_ref());
        let replace = raw.replace_prefix.take();
        let regex = raw.regex_rewrite.take();
        let given = [strip.is_some(), replace.is_some(), regex.is_some()];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(self.error(
                Some(span),
                &format!("{at}.regex_rewrite"),
                "a route rewrites its path one way: give one of strip_prefix, replace_prefix and \
                 regex_rewrite"
                    .into(),
            ));
        }
        if strip.is_some() {
            return Ok(Some(Box::new(PathRewrite::StripPrefix)));
        }
        if let Some(prefix) = replace {
            let text = prefix.get_ref();
            if !text.starts_with('/') || !is_path(text) {
                return Err(self.error(
                    Some(prefix.span()),
                    &format!("{at}.replace_prefix"),
                    format!(
                        r##"{text:?} is not a path prefix (start it with "/", leave out spaces, "?" and "#", e.g. "/v2/")"##
                    ),
                ));
            }
            return Ok(Some(Box::new(PathRewrite::ReplacePrefix(
                prefix.into_inner(),
            ))));
        }
        let Some(rewrite) = regex else {
            return Ok(None);
        };
        let table_span = rewrite.span();
        let rewrite = rewrite.into_inner();
        let key = format!("{at}.regex_rewrite");
        let (Some(pattern), Some(substitution)) = (rewrite.pattern, rewrite.substitution) else {
            return Err(self.error(
                Some(table_span),
                &key,
                r#"regex_rewrite needs a pattern and a substitution (e.g. { pattern = "^/v1/(.*)", substitution = "/api/$1" })"#.into(),
            ));
        };
        let regex = RouteRegex::unanchored(pattern.get_ref()).map_err(|why| {
            self.error(
                Some(pattern.span()),
                &format!("{key}.pattern"),
                format!(
                    "{:?} is not a usable regex: {why} (the regex crate's syntax)",
                    pattern.get_ref()
                ),
            )
        })?;
        if !is_path(substitution.get_ref()) {
            return Err(self.error(
                Some(substitution.span()),
                &format!("{key}.substitution"),
                format!(
                    r##"{:?} cannot be part of a path (leave out spaces, "?", "#" and control characters; $1 or ${{name}} for a group)"##,
                    substitution.get_ref()
                ),
            ));
        }
        Ok(Some(Box::new(PathRewrite::Regex {
            pattern: regex,
            substitution: substitution.into_inner(),
        })))
    }

    fn method(&self, key: &str, method: &Spanned<String>) -> Result<Method, ConfigError> {
        let text = method.get_ref();
        let parsed = Method::from_bytes(text.as_bytes()).ok();
        match parsed {
            Some(parsed) if !text.bytes().any(|b| b.is_ascii_lowercase()) => Ok(parsed),
            _ => Err(self.error(
                Some(method.span()),
                key,
                format!(
                    r#"{text:?} is not a method (methods are case-sensitive words in capitals, e.g. "GET", "POST", "PURGE")"#
                ),
            )),
        }
    }

    /// A regex that must match the whole text; a bad one is an error quoting the `regex`
    /// crate's.
    fn regex(&self, key: &str, pattern: &Spanned<String>) -> Result<RouteRegex, ConfigError> {
        RouteRegex::new(pattern.get_ref()).map_err(|why| {
            self.error(
                Some(pattern.span()),
                key,
                format!(
                    "{:?} is not a usable regex: {why} (the regex crate's syntax; it must match \
                     the whole value)",
                    pattern.get_ref()
                ),
            )
        })
    }

    fn header_match(
        &self,
        at: &str,
        entry: Spanned<RawValueMatch>,
    ) -> Result<HeaderMatch, ConfigError> {
        let span = entry.span();
        let mut entry = entry.into_inner();
        let Some(name) = entry.name.take() else {
            return Err(self.error(
                Some(span),
                &format!("{at}.name"),
                r#"a header matcher needs the field's name (e.g. name = "X-Canary")"#.into(),
            ));
        };
        let Ok(parsed) = HeaderName::from_bytes(name.get_ref().as_bytes()) else {
            return Err(self.error(
                Some(name.span()),
                &format!("{at}.name"),
                format!(
                    r#"{:?} is not a header field name (a word such as "X-Canary", without spaces or ":")"#,
                    name.get_ref()
                ),
            ));
        };
        let value = self.value_match(at, span, entry, |text| {
            // hyper trims a field's surrounding whitespace: such a value could never match.
            HeaderValue::from_str(text).is_ok() && text.trim() == text
        })?;
        Ok(HeaderMatch {
            name: parsed,
            value,
        })
    }

    fn query_match(
        &self,
        at: &str,
        entry: Spanned<RawValueMatch>,
    ) -> Result<QueryMatch, ConfigError> {
        let span = entry.span();
        let mut entry = entry.into_inner();
        let name = match entry.name.take() {
            Some(name) if !name.get_ref().is_empty() && is_query_text(name.get_ref()) => name,
            Some(name) => {
                return Err(self.error(
                    Some(name.span()),
                    &format!("{at}.name"),
                    format!(
                        r##"{:?} is not a query parameter name (as sent, percent-encoded: no spaces, "&", "=" or "#")"##,
                        name.get_ref()
                    ),
                ))
            }
            None => {
                return Err(self.error(
                    Some(span),
                    &format!("{at}.name"),
                    r#"a query matcher needs the parameter's name (e.g. name = "version")"#
                        .into(),
                ))
            }
        };
        // A value may hold "=" (`a=b=c` is `a` with `b=c`).
        let value = self.value_match(at, span, entry, |text| {
            text.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'&' && b != b'#')
        })?;
        Ok(QueryMatch {
            name: name.into_inner(),
            value,
        })
    }

    /// Exactly one of `value` (which `valid` must accept), `value_regex` and `present = true`.
    fn value_match(
        &self,
        at: &str,
        span: std::ops::Range<usize>,
        entry: RawValueMatch,
        valid: impl Fn(&str) -> bool,
    ) -> Result<ValueMatch, ConfigError> {
        let given = [
            entry.value.is_some(),
            entry.value_regex.is_some(),
            entry.present.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(self.error(
                Some(span),
                at,
                "give exactly one of value (exact), value_regex (a whole match) and \
                 present = true"
                    .into(),
            ));
        }
        if let Some(value) = entry.value {
            if !valid(value.get_ref()) {
                return Err(self.error(
                    Some(value.span()),
                    &format!("{at}.value"),
                    format!(
                        "{:?} can never be received as written (no control characters, no \
                         surrounding spaces; in a query no spaces, \"&\" or \"#\")",
                        value.get_ref()
                    ),
                ));
            }
            return Ok(ValueMatch::Exact(value.into_inner()));
        }
        if let Some(pattern) = entry.value_regex {
            return Ok(ValueMatch::Regex(
                self.regex(&format!("{at}.value_regex"), &pattern)?,
            ));
        }
        match entry.present {
            Some(present) if !*present.get_ref() => Err(self.error(
                Some(present.span()),
                &format!("{at}.present"),
                "present = false is not a matcher (write present = true, or leave the entry \
                 out)"
                    .into(),
            )),
            _ => Ok(ValueMatch::Present),
        }
    }
}

/// Whether `text` may be a path as a request target carries it: visible ASCII, no `?` or `#`
/// (empty is one too: a substitution may remove what it matched).
fn is_path(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#')
}

/// Whether `text` may be a query parameter's name or value as sent: visible ASCII, no `&`,
/// `=` or `#`.
fn is_query_text(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_graphic() && b != b'&' && b != b'#' && b != b'=')
}
