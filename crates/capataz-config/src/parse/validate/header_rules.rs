//! `request_headers` and `response_headers` (on a listener and on a route), a listener's
//! `forwarded` and `request_id` (see `header_rules`).

use http::HeaderName;
use toml::Spanned;

use super::super::raw::{RawForwarded, RawHeaderRules, RawHsts, RawRequestId};
use super::{ConfigError, Validator};
use crate::{ForwardedFields, HeaderRules, Hsts, RequestIdConfig, Template, Variable};

/// Fields no rule may touch: how a message is framed and what its connection does are
/// capataz's, not a rule's.
const UNTOUCHABLE: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Which rules are being read: request or response, and whether the listener has a request
/// id for `%{request_id}`.
#[derive(Clone, Copy)]
pub(super) struct RulesFor {
    pub(super) response: bool,
    pub(super) request_id: bool,
}

impl Validator<'_> {
    /// `forwarded`, and the older `forwarded_headers` it replaces (not both).
    pub(super) fn forwarded(
        &self,
        at: &str,
        span: std::ops::Range<usize>,
        forwarded: Option<RawForwarded>,
        forwarded_headers: Option<bool>,
    ) -> Result<ForwardedFields, ConfigError> {
        Ok(match (forwarded, forwarded_headers) {
            (Some(_), Some(_)) => {
                return Err(self.error(
                    Some(span),
                    &format!("{at}.forwarded"),
                    "forwarded and forwarded_headers say the same thing (keep forwarded: \
                     \"x-forwarded\", \"rfc7239\", \"both\" or \"none\")"
                        .into(),
                ))
            }
            (None, None | Some(true)) | (Some(RawForwarded::XForwarded), None) => {
                ForwardedFields::XForwarded
            }
            (None, Some(false)) | (Some(RawForwarded::None), None) => ForwardedFields::None,
            (Some(RawForwarded::Rfc7239), None) => ForwardedFields::Rfc7239,
            (Some(RawForwarded::Both), None) => ForwardedFields::Both,
        })
    }

    /// `[listeners.tls]`'s `hsts` (`at` is the TLS table's path).
    pub(super) fn hsts(&self, at: &str, raw: Spanned<RawHsts>) -> Result<Hsts, ConfigError> {
        let span = raw.span();
        let raw = raw.into_inner();
        const YEAR: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
        let hsts = Hsts {
            max_age: self.duration(&raw.max_age, &format!("{at}.hsts.max_age"), YEAR)?,
            include_subdomains: raw.include_subdomains.unwrap_or(false),
            preload: raw.preload.unwrap_or(false),
        };
        if hsts.preload && (!hsts.include_subdomains || hsts.max_age < YEAR) {
            return Err(self.error(
                Some(span),
                &format!("{at}.hsts.preload"),
                "preload lists take a site only with include_subdomains = true and a max_age of \
                 a year at least (\"8760h\")"
                    .into(),
            ));
        }
        Ok(hsts)
    }

    /// A listener's `request_id`.
    pub(super) fn request_id(
        &self,
        at: &str,
        raw: Spanned<RawRequestId>,
    ) -> Result<RequestIdConfig, ConfigError> {
        let raw = raw.into_inner();
        let header = match raw.header {
            None => HeaderName::from_static("x-request-id"),
            Some(name) => self.rule_name(&format!("{at}.request_id.header"), &name)?,
        };
        Ok(RequestIdConfig {
            header,
            keep_incoming: raw.keep_incoming.unwrap_or(true),
            response: raw.response.unwrap_or(false),
        })
    }

    /// One `request_headers` or `response_headers` table at `at`; `None` when it is absent or
    /// says nothing.
    pub(super) fn header_rules(
        &self,
        at: &str,
        raw: Option<RawHeaderRules>,
        what: RulesFor,
    ) -> Result<Option<Box<HeaderRules>>, ConfigError> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        let mut rules = HeaderRules::default();
        for (index, name) in raw.remove.into_iter().flatten().enumerate() {
            rules
                .remove
                .push(self.rule_name(&format!("{at}.remove[{index}]"), &name)?);
        }
        for (verb, map, into) in [
            ("set", raw.set, &mut rules.set),
            ("add", raw.add, &mut rules.add),
        ] {
            for (name, value) in map.into_iter().flatten() {
                let key = format!("{at}.{verb}.{}", name.get_ref());
                let parsed = self.rule_name(&key, &name)?;
                into.push((parsed, self.rule_value(&key, &value, what)?));
            }
        }
        if rules == HeaderRules::default() {
            return Ok(None);
        }
        Ok(Some(Box::new(rules)))
    }

    fn rule_name(&self, key: &str, name: &Spanned<String>) -> Result<HeaderName, ConfigError> {
        let parsed = HeaderName::from_bytes(name.get_ref().as_bytes()).map_err(|_| {
            self.error(
                Some(name.span()),
                key,
                format!(
                    r#"{:?} is not a header field name (a word such as "X-Env", without spaces or ":")"#,
                    name.get_ref()
                ),
            )
        })?;
        if UNTOUCHABLE.contains(&parsed.as_str()) {
            return Err(self.error(
                Some(name.span()),
                key,
                format!(
                    "{} is a connection or framing field, which capataz sets itself (rules \
                     may not touch {})",
                    name.get_ref(),
                    UNTOUCHABLE.join(", ")
                ),
            ));
        }
        Ok(parsed)
    }

    fn rule_value(
        &self,
        key: &str,
        value: &Spanned<String>,
        what: RulesFor,
    ) -> Result<Template, ConfigError> {
        let template = Template::parse(value.get_ref()).map_err(|why| {
            self.error(
                Some(value.span()),
                key,
                format!("{:?}: {why}", value.get_ref()),
            )
        })?;
        let refuse = |why: &str| {
            Err(self.error(
                Some(value.span()),
                key,
                format!("{:?}: {why}", value.get_ref()),
            ))
        };
        if !what.response && template.uses(Variable::Backend) {
            return refuse(
                "%{backend} is known only for answers (use it in response_headers; a request \
                 may go to several backends)",
            );
        }
        if !what.request_id && template.uses(Variable::RequestId) {
            return refuse(
                "%{request_id} needs the listener's request_id (add request_id = {} to the \
                 listener)",
            );
        }
        Ok(template)
    }
}
