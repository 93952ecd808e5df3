//! The fleet's keys and values in etcd, pure: where a group's members and verdicts live, the
//! verdict an owner publishes (`{"state":"DOWN","streak":3,"last":"REFUSED"}`), and reading
//! them back, bounded and refusing anything else.

use capataz_health::{replay, Outcome, PublishedWhy, State};
use serde::{Deserialize, Serialize};

/// The longest value read (a verdict is about 50 bytes).
pub(crate) const MAX_VALUE: usize = 1024;

/// The keys of one group under a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupKeys {
    /// `<prefix>/groups/<group>/`: everything the group writes.
    pub(crate) root: String,
}

/// What a key of the group is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GroupKey<'a> {
    /// A member's registration.
    Member(&'a str),
    /// A verdict: pool, backend address, publishing instance.
    Verdict {
        pool: &'a str,
        address: &'a str,
        by: &'a str,
    },
}

impl GroupKeys {
    pub(crate) fn new(prefix: &str, group: &str) -> GroupKeys {
        GroupKeys {
            root: format!("{prefix}/groups/{group}/"),
        }
    }

    /// `<root>members/<instance>`.
    pub(crate) fn member(&self, instance: &str) -> String {
        format!("{}members/{instance}", self.root)
    }

    /// `<root>verdicts/<pool>/<address>/<instance>`.
    pub(crate) fn verdict(&self, pool: &str, address: &str, instance: &str) -> String {
        format!("{}verdicts/{pool}/{address}/{instance}", self.root)
    }

    /// What `key` is, or `None` for a key of the group that is neither.
    pub(crate) fn parse<'k>(&self, key: &'k str) -> Option<GroupKey<'k>> {
        let rest = key.strip_prefix(self.root.as_str())?;
        if let Some(name) = rest.strip_prefix("members/") {
            return (!name.is_empty() && !name.contains('/')).then_some(GroupKey::Member(name));
        }
        let rest = rest.strip_prefix("verdicts/")?;
        // The pool's name and the instance's have no '/', nor has an address (`host:port`).
        let mut parts = rest.rsplitn(3, '/');
        let by = parts.next()?;
        let address = parts.next()?;
        let pool = parts.next()?;
        if [pool, address, by].iter().any(|p| p.is_empty()) || pool.contains('/') {
            return None;
        }
        Some(GroupKey::Verdict { pool, address, by })
    }
}

/// A published verdict, as written.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    state: String,
    #[serde(default)]
    streak: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last: Option<String>,
}

/// An owner's active verdict for one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) state: State,
    pub(crate) why: PublishedWhy,
}

/// The value published for `verdict`.
pub(crate) fn encode(verdict: &Verdict) -> String {
    let wire = Wire {
        state: verdict.state.as_str().to_owned(),
        streak: verdict.why.streak,
        last: verdict
            .why
            .last
            .map(|outcome| replay::answer(outcome).into_owned()),
    };
    // A struct of strings and a number always serializes.
    serde_json::to_string(&wire).unwrap_or_default()
}

/// Why a value is not a verdict (the `reason` of a skipped key).
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerdictError {
    #[error("the value is {0} bytes, more than a verdict's {MAX_VALUE}")]
    TooLong(usize),
    #[error("not a verdict ({0}); expected {{\"state\": \"UP\"|\"DOWN\", ...}}")]
    NotJson(#[source] serde_json::Error),
    #[error("state {0:?} is neither UP nor DOWN")]
    State(String),
    #[error("last {0:?} is not a probe outcome")]
    Last(String),
}

/// The verdict in `value`, or why it is none.
pub(crate) fn decode(value: &[u8]) -> Result<Verdict, VerdictError> {
    if value.len() > MAX_VALUE {
        return Err(VerdictError::TooLong(value.len()));
    }
    let wire: Wire = serde_json::from_slice(value).map_err(VerdictError::NotJson)?;
    let state = match wire.state.as_str() {
        "UP" => State::Up,
        "DOWN" => State::Down,
        other => return Err(VerdictError::State(other.to_owned())),
    };
    let last = match wire.last {
        None => None,
        Some(text) => Some(parse_outcome(&text).ok_or(VerdictError::Last(text))?),
    };
    Ok(Verdict {
        state,
        why: PublishedWhy {
            streak: wire.streak,
            last,
        },
    })
}

/// An outcome written as `capataz replay` scripts write it (`HTTP/1.1 503`, `TIMEOUT`,
/// `GRPC 14`, `MALFORMED`, ...), read back with [`Outcome::parse`]; any other text is refused,
/// not read as malformed.
fn parse_outcome(text: &str) -> Option<Outcome> {
    match Outcome::parse(text.as_bytes()) {
        Outcome::Malformed if text != "MALFORMED" => None,
        outcome => Some(outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip_and_hostile_values_are_refused() {
        for last in [
            None,
            Some(Outcome::Status(503)),
            Some(Outcome::Refused),
            Some(Outcome::Grpc(14)),
            Some(Outcome::Malformed),
            Some(Outcome::Connected),
        ] {
            let verdict = Verdict {
                state: State::Down,
                why: PublishedWhy { streak: 3, last },
            };
            assert_eq!(decode(encode(&verdict).as_bytes()).ok(), Some(verdict));
        }
        for bad in [
            &b"{}"[..],
            b"not json",
            br#"{"state":"MAYBE"}"#,
            br#"{"state":"UP","last":"999"}"#,
            br#"{"state":"UP","streak":-1}"#,
            br#"{"state":"UP","extra":1}"#,
            b"\xff\xfe{\"state\":\"UP\"}",
            br#"{"state":"UP","last":"\ud800"}"#,
        ] {
            assert!(decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let huge = format!(r#"{{"state":"UP","last":"{}"}}"#, "x".repeat(5000));
        assert!(decode(huge.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("bytes"));
    }

    #[test]
    fn group_keys_parse_back() {
        let keys = GroupKeys::new("/capataz", "edge");
        let member = keys.member("lb-1");
        assert_eq!(keys.parse(&member), Some(GroupKey::Member("lb-1")));
        let verdict = keys.verdict("web", "[::1]:8080", "lb-1");
        assert_eq!(
            keys.parse(&verdict),
            Some(GroupKey::Verdict {
                pool: "web",
                address: "[::1]:8080",
                by: "lb-1"
            })
        );
        assert_eq!(keys.parse("/capataz/groups/edge/verdicts/a/b"), None);
        assert_eq!(keys.parse("/capataz/groups/edge/other"), None);
        assert_eq!(keys.parse("/capataz/groups/edge/members/"), None);
        assert_eq!(keys.parse("/elsewhere"), None);
    }
}
