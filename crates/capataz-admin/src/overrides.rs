//! Manual overrides (`POST /backends/<pool>/<backend>/{drain,down,up,maintenance,clear}[?ttl=30s]`): the
//! query is parsed strictly, since a typo that was ignored (`?tll=10m`) would set an override
//! until cleared instead of for a while, and a TTL is bounded so that no clock arithmetic can
//! overflow.

use std::time::Duration;

use http::{Response, StatusCode};
use serde_json::json;

use super::query::QueryError;
use super::{error, json_response, Body};
use crate::config::DurationError;
use crate::events::OverrideKind;
use crate::supervisor::{OverrideRefused, Supervisor};

/// Reads the `ttl` of an override's query string (`?ttl=30s`, percent-encoding allowed): `None`
/// without one; an error for zero, above [`crate::config::MAX_DURATION`], a value that is not a
/// duration, a second `ttl`, or any other parameter (a typo such as `?tll=10m` would otherwise
/// set an override until cleared). Public for the fuzz target.
pub fn parse_ttl(query: Option<&str>) -> Result<Option<Duration>, TtlError> {
    let Some(value) = super::query::single(query, "ttl", "?ttl=30s")? else {
        return Ok(None);
    };
    match crate::config::parse_duration(&value) {
        Ok(Duration::ZERO) => Err(TtlError::Zero(value)),
        Ok(ttl) => Ok(Some(ttl)),
        Err(e) => Err(TtlError::Duration(e)),
    }
}

/// Why an override's `ttl` is refused, the rest of a 400 answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    /// The query string itself.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// A zero TTL (the value as written).
    #[error(
        "ttl: {0:?} is zero (use a duration above zero, e.g. \"30s\", or leave ttl out for an \
         override until cleared)"
    )]
    Zero(String),
    /// Not a duration, or above the maximum.
    #[error("ttl: {0}")]
    Duration(#[source] DurationError),
}

pub(super) async fn override_backend(
    supervisor: &Supervisor,
    pool: &str,
    backend: &str,
    action: &str,
    query: Option<&str>,
) -> Response<Body> {
    let kind = match action {
        "drain" => Some(OverrideKind::Drain),
        "down" => Some(OverrideKind::Down),
        "up" => Some(OverrideKind::Up),
        "maintenance" => Some(OverrideKind::Maintenance),
        "clear" => None,
        other => {
            return error(
                StatusCode::NOT_FOUND,
                format!("unknown action {other:?}: use drain, down, up, maintenance or clear"),
            )
        }
    };
    let ttl = match parse_ttl(query) {
        Ok(ttl) => ttl,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if kind.is_none() && ttl.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "clear takes no ttl: it ends the override now (to set one for a while, use drain, \
             down, up or maintenance with ?ttl=...)",
        );
    }
    match supervisor.set_override(pool, backend, kind, ttl).await {
        Ok(state) => json_response(
            StatusCode::OK,
            &json!({ "pool": pool, "backend": backend, "state": state,
                     "override": kind.map(|k| k.as_str()), "ttl_ms": ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)) }),
        ),
        Err(e @ (OverrideRefused::NoPool(_) | OverrideRefused::Backend(_))) => {
            error(StatusCode::NOT_FOUND, e.to_string())
        }
        // Only while the process ends: the admin listener stops with the balancer.
        Err(e @ OverrideRefused::Stopped(_)) => {
            error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl(None), Ok(None));
        assert_eq!(
            parse_ttl(Some("ttl=30s")),
            Ok(Some(Duration::from_secs(30)))
        );
        assert_eq!(
            parse_ttl(Some("ttl=8760h")),
            Ok(Some(crate::config::MAX_DURATION))
        );
        assert_eq!(
            parse_ttl(Some("ttl=1.5%6D&")),
            Ok(Some(Duration::from_secs(90)))
        );
        assert_eq!(parse_ttl(Some("")), Ok(None));
        for bad in [
            "ttl=18446744073709551615s",
            "ttl=9223372036854775807s",
            "ttl=8761h",
            "ttl=x",
            "ttl=0s",
            "ttl=0.0ms",
            "tll=10m",
            "TTL=10m",
            "a=b&ttl=1s",
            "ttl=1s&ttl=1h",
            "ttl=1s%26ttl%3D1h",
            "ttl=%zz",
        ] {
            assert!(parse_ttl(Some(bad)).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        /// Any query: no panic, and a TTL never above the maximum.
        #[test]
        fn the_admin_query_parser_never_panics_and_enforces_the_maximum(
            query in "((ttl|x)=[0-9.]{0,25}(ms|s|m|h)?&?){0,3}|\\PC{0,40}",
        ) {
            if let Ok(Some(ttl)) = parse_ttl(Some(&query)) {
                proptest::prop_assert!(ttl <= crate::config::MAX_DURATION);
            }
        }
    }
}
