//! `[fleet]`: shared probing with the other instances of a group, through etcd. The endpoints,
//! TLS and credentials are an etcd source's (the same checks, the same `EtcdAccess`).

use std::time::Duration;

use toml::Spanned;

use super::super::raw::{RawFleet, RawSource};
use super::{ConfigError, EtcdOwner, Validator};
use crate::FleetConfig;

/// The longest group or instance name, in bytes.
pub(crate) const MAX_NAME: usize = 64;

/// The longest key prefix, in bytes.
const MAX_PREFIX: usize = 512;

/// The most owners per backend.
const MAX_OWNERS: i64 = 64;

/// Whether `name` may be a group or an instance name: 1 to [`MAX_NAME`] bytes of letters,
/// digits, `.`, `_`, `-` and `:` (it becomes one etcd key segment).
pub(crate) fn key_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
        && name != "."
        && name != ".."
}

impl Validator<'_> {
    pub(super) fn fleet(&self, raw: Spanned<RawFleet>) -> Result<FleetConfig, ConfigError> {
        let span = raw.span();
        let raw = raw.into_inner();
        let at = "fleet";
        let mut access = RawSource {
            endpoints: raw.endpoints,
            tls: raw.tls,
            username: raw.username,
            password: raw.password,
            password_file: raw.password_file,
            ..RawSource::default()
        };
        let endpoints = self.etcd_endpoints(EtcdOwner::Fleet, at, span.clone(), &mut access)?;
        let Some(group) = raw.group else {
            return Err(self.error(
                Some(span),
                "fleet.group",
                r#"a fleet needs its group, the name the instances sharing the probing have in common (add group = "edge")"#.into(),
            ));
        };
        if !key_safe(group.get_ref()) {
            return Err(self.error(
                Some(group.span()),
                "fleet.group",
                format!(
                    "{:?} is not a group name (use 1 to {MAX_NAME} letters, digits, '.', '_', '-' \
                     or ':', e.g. \"edge\")",
                    group.get_ref()
                ),
            ));
        }
        let instance = match raw.instance {
            None => None,
            Some(instance) if key_safe(instance.get_ref()) => Some(instance.into_inner()),
            Some(instance) => {
                return Err(self.error(
                    Some(instance.span()),
                    "fleet.instance",
                    format!(
                        "{:?} is not an instance name (use 1 to {MAX_NAME} letters, digits, '.', \
                         '_', '-' or ':', unique in the group, e.g. \"lb-1\")",
                        instance.get_ref()
                    ),
                ));
            }
        };
        let prefix = match raw.prefix {
            None => "/capataz".to_owned(),
            Some(prefix) => {
                let text = prefix.get_ref().trim_end_matches('/');
                if text.is_empty() || text.len() > MAX_PREFIX || text.chars().any(char::is_control)
                {
                    return Err(self.error(
                        Some(prefix.span()),
                        "fleet.prefix",
                        format!(
                            "{:?} is not a key prefix (use 1 to {MAX_PREFIX} bytes of text \
                             without control characters, other than \"/\", e.g. \"/capataz\")",
                            prefix.get_ref()
                        ),
                    ));
                }
                text.to_owned()
            }
        };
        let owners = self.int(&raw.owners, "fleet.owners", 2, 1..=MAX_OWNERS)? as usize;
        let lease_ttl =
            self.duration(&raw.lease_ttl, "fleet.lease_ttl", Duration::from_secs(10))?;
        if lease_ttl < Duration::from_secs(2) {
            return Err(self.error(
                raw.lease_ttl.as_ref().map(|v| v.span()),
                "fleet.lease_ttl",
                "the lease must last at least 2s (a shorter one expires between two keepalives)"
                    .into(),
            ));
        }
        let timeout = self.duration(&raw.timeout, "fleet.timeout", Duration::from_secs(2))?;
        // Whole seconds: etcd's leases are.
        let lease_ttl = Duration::from_secs(lease_ttl.as_secs());
        // A keepalive comes a third of the lease after the last one; when it hangs for
        // `timeout` and the next endpoint is tried, both must fit in the lease, or one slow
        // etcd member lets the lease lapse (the group drops this instance) before it notices.
        if timeout >= lease_ttl / 2 {
            return Err(self.error(
                raw.timeout
                    .as_ref()
                    .or(raw.lease_ttl.as_ref())
                    .map(|v| v.span()),
                "fleet.timeout",
                format!(
                    "{} is not less than half of fleet.lease_ttl ({}): a keepalive that waits \
                     this long lets the lease expire before the next etcd endpoint is tried \
                     (shorten fleet.timeout or lengthen fleet.lease_ttl)",
                    capataz_health::pool::human_duration(timeout),
                    capataz_health::pool::human_duration(lease_ttl)
                ),
            ));
        }
        Ok(FleetConfig {
            endpoints,
            prefix,
            group: group.into_inner(),
            owners,
            lease_ttl,
            instance,
            timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::key_safe;

    #[test]
    fn key_safe_names_are_one_key_segment() {
        assert!(key_safe("edge"));
        assert!(key_safe("lb-1.example:8080"));
        assert!(!key_safe(""));
        assert!(!key_safe("a/b"));
        assert!(!key_safe(".."));
        assert!(!key_safe("a b"));
        assert!(!key_safe(&"x".repeat(65)));
    }
}
