//! The two classification rules: one for probes (active), one for relayed traffic (passive).
//!
//! They differ on purpose. A probe asks for one route that must exist, so only the expected
//! statuses (by default 200-399, as HAProxy's `option httpchk`) pass and a 404 fails. A 404 on user
//! traffic is the client's business, so traffic only counts 5xx and failures to get a well-formed
//! answer as errors.

use std::fmt;
use std::str::FromStr;

use crate::probe::ProbeOutcome;
use crate::status::Outcome;

/// What a probe proved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// The backend answered with an expected status.
    Pass,
    /// Anything else.
    Fail,
    /// A `404` from a pool with `disable_on_404`: the backend asks to be drained. Neither a pass
    /// nor a failure: no streak moves. Only [`Rotation`](crate::Rotation) gives it; the probe
    /// rule alone never does.
    Drain,
}

impl ProbeResult {
    /// `PASS`, `FAIL` or `DRAIN`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Pass => "PASS",
            ProbeResult::Fail => "FAIL",
            ProbeResult::Drain => "DRAIN",
        }
    }
}

/// What one relayed response says about its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrafficResult {
    /// A well-formed answer that is not a counted 5xx.
    Ok,
    /// A counted 5xx, a timeout, a refusal, a reset or a malformed answer.
    Error,
}

impl TrafficResult {
    /// `OK` or `ERROR`.
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficResult::Ok => "OK",
            TrafficResult::Error => "ERROR",
        }
    }
}

const SET_WORDS: usize = 10;

/// A set of HTTP status codes within 100-599, written as a comma-separated list of codes and
/// inclusive ranges: `200-299,302`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusSet {
    bits: [u64; SET_WORDS],
}

impl StatusSet {
    /// The empty set.
    pub const fn empty() -> StatusSet {
        StatusSet {
            bits: [0; SET_WORDS],
        }
    }

    /// The codes `lo..=hi`. Codes outside 100-599 are left out.
    pub fn range(lo: u16, hi: u16) -> StatusSet {
        let mut set = StatusSet::empty();
        set.insert_range(lo, hi);
        set
    }

    fn insert_range(&mut self, lo: u16, hi: u16) {
        for code in lo.max(100)..=hi.min(599) {
            self.bits[usize::from(code / 64)] |= 1 << (code % 64);
        }
    }

    /// Whether `code` is in the set.
    pub fn contains(&self, code: u16) -> bool {
        let word = usize::from(code / 64);
        word < SET_WORDS && self.bits[word] & (1 << (code % 64)) != 0
    }

    /// Whether the set holds no code.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }
}

impl Default for StatusSet {
    /// 200-399: what HAProxy's `option httpchk` accepts.
    fn default() -> StatusSet {
        StatusSet::range(200, 399)
    }
}

/// Why a status list did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusSetError {
    item: String,
    problem: &'static str,
}

impl fmt::Display for StatusSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.item.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "{:?}: {}", self.item, self.problem)
        }
    }
}

impl std::error::Error for StatusSetError {}

impl FromStr for StatusSet {
    type Err = StatusSetError;

    fn from_str(text: &str) -> Result<StatusSet, StatusSetError> {
        let error = |item: &str, problem| StatusSetError {
            item: item.to_owned(),
            problem,
        };
        let code = |item: &str, part: &str| -> Result<u16, StatusSetError> {
            let part = part.trim();
            if part.len() != 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(error(
                    item,
                    "expected a three-digit status code or a range like 200-299",
                ));
            }
            // Three ASCII digits always parse.
            let value: u16 = part.parse().map_err(|_| error(item, "not a number"))?;
            if !(100..=599).contains(&value) {
                return Err(error(item, "status codes lie within 100-599"));
            }
            Ok(value)
        };
        if text.trim().is_empty() {
            return Err(error("", "the status list is empty"));
        }
        let mut set = StatusSet::empty();
        for item in text.split(',') {
            let (lo, hi) = match item.split_once('-') {
                Some((lo, hi)) => (code(item, lo)?, code(item, hi)?),
                None => {
                    let single = code(item, item)?;
                    (single, single)
                }
            };
            if lo > hi {
                return Err(error(item, "the range is reversed"));
            }
            set.insert_range(lo, hi);
        }
        Ok(set)
    }
}

impl fmt::Display for StatusSet {
    /// Writes the set back in its list form, ranges merged: `200-299,302`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut code = 100;
        while code <= 599 {
            if !self.contains(code) {
                code += 1;
                continue;
            }
            let start = code;
            while code < 599 && self.contains(code + 1) {
                code += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == code {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{code}")?;
            }
            code += 1;
        }
        Ok(())
    }
}

impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StatusSet({self})")
    }
}

/// The probe rule: PASS only for a well-formed status line whose code is expected, or for a
/// gRPC health check whose call ended OK (`grpc-status` 0) and reported `SERVING`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeRule {
    /// The statuses that pass; 200-399 by default.
    pub expect: StatusSet,
}

impl ProbeRule {
    /// Classifies one probe outcome with its content match: PASS only for an expected status
    /// whose answer broke no content rule.
    pub fn judge_probe(&self, probe: &ProbeOutcome) -> ProbeResult {
        match probe.mismatch {
            Some(_) => ProbeResult::Fail,
            None => self.judge(probe.outcome),
        }
    }

    /// Classifies one probe outcome.
    pub fn judge(&self, outcome: Outcome) -> ProbeResult {
        match outcome {
            Outcome::Status(code) if self.expect.contains(code) => ProbeResult::Pass,
            // A gRPC health call that ended OK; what it reported is the probe's mismatch.
            Outcome::Grpc(0) => ProbeResult::Pass,
            // A TCP probe reads no status: the connection opening is the whole check.
            Outcome::Connected => ProbeResult::Pass,
            _ => ProbeResult::Fail,
        }
    }
}

/// A set of gRPC status codes (0-31; the gRPC spec defines 0-16), the ones a relayed gRPC
/// call counts as a backend error with.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrpcCodes {
    bits: u32,
}

impl GrpcCodes {
    /// UNKNOWN (2), DEADLINE_EXCEEDED (4), INTERNAL (13), UNAVAILABLE (14): the codes a
    /// failing server, not a failing call, gives.
    pub const DEFAULT_ERRORS: GrpcCodes = GrpcCodes {
        bits: 1 << 2 | 1 << 4 | 1 << 13 | 1 << 14,
    };

    /// The empty set.
    pub const fn empty() -> GrpcCodes {
        GrpcCodes { bits: 0 }
    }

    /// The set of `codes`; codes above 31 are left out.
    pub fn of(codes: impl IntoIterator<Item = u8>) -> GrpcCodes {
        let mut set = GrpcCodes::empty();
        for code in codes {
            if code < 32 {
                set.bits |= 1 << code;
            }
        }
        set
    }

    /// Whether `code` is in the set.
    pub fn contains(&self, code: u8) -> bool {
        code < 32 && self.bits & (1 << code) != 0
    }

    /// The codes in the set, ascending.
    pub fn codes(&self) -> impl Iterator<Item = u8> + '_ {
        (0..32u8).filter(|&code| self.contains(code))
    }
}

impl Default for GrpcCodes {
    fn default() -> GrpcCodes {
        GrpcCodes::DEFAULT_ERRORS
    }
}

impl fmt::Debug for GrpcCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.codes()).finish()
    }
}

/// The traffic rule: ERROR for 5xx (503 optionally), timeouts, refusals, resets, malformed
/// answers, failed TLS handshakes and gRPC calls ending with one of `grpc_errors`; OK for any other well-formed
/// answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrafficRule {
    /// Whether a 503 (often a backend shedding load on purpose) counts as an error. Default: yes.
    pub count_503: bool,
    /// The `grpc-status` codes that count as errors. Default: [`GrpcCodes::DEFAULT_ERRORS`].
    pub grpc_errors: GrpcCodes,
}

impl Default for TrafficRule {
    fn default() -> TrafficRule {
        TrafficRule {
            count_503: true,
            grpc_errors: GrpcCodes::DEFAULT_ERRORS,
        }
    }
}

impl TrafficRule {
    /// Classifies one relayed response, or the failure to get one.
    pub fn judge(&self, outcome: Outcome) -> TrafficResult {
        match outcome {
            Outcome::Status(503) if !self.count_503 => TrafficResult::Ok,
            Outcome::Status(500..=599) => TrafficResult::Error,
            Outcome::Status(_) => TrafficResult::Ok,
            Outcome::Grpc(code) if self.grpc_errors.contains(code) => TrafficResult::Error,
            Outcome::Grpc(_) | Outcome::Connected => TrafficResult::Ok,
            Outcome::Timeout
            | Outcome::Refused
            | Outcome::Reset
            | Outcome::Malformed
            | Outcome::Tls => TrafficResult::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a TCP probe's connect was recorded as a 200, so `expect = "204"` failed
    /// every backend of a `tcp` check.
    #[test]
    fn a_tcp_connect_passes_whatever_the_expected_statuses() {
        let rule = ProbeRule {
            expect: "204".parse().expect("a status list"),
        };
        assert_eq!(rule.judge(Outcome::Connected), ProbeResult::Pass);
        assert_eq!(rule.judge(Outcome::Status(200)), ProbeResult::Fail);
        assert_eq!(rule.judge(Outcome::Refused), ProbeResult::Fail);
        assert_eq!(
            TrafficRule::default().judge(Outcome::Connected),
            TrafficResult::Ok
        );
        assert_eq!(Outcome::parse(b"CONNECTED"), Outcome::Connected);
        assert_eq!(Outcome::Connected.to_string(), "TCP connect succeeded");
    }

    fn probe(answer: &str) -> &'static str {
        ProbeRule::default()
            .judge(Outcome::parse(answer.as_bytes()))
            .as_str()
    }

    fn traffic(answer: &str) -> &'static str {
        TrafficRule::default()
            .judge(Outcome::parse(answer.as_bytes()))
            .as_str()
    }

    #[test]
    fn probe_rule_defaults() {
        for (answer, expected) in [
            ("HTTP/1.1 200 OK", "PASS"),
            ("HTTP/1.1 204", "PASS"),
            ("HTTP/1.0 301 Moved Permanently", "PASS"),
            ("HTTP/1.1 399 x", "PASS"),
            ("HTTP/1.1 199 x", "FAIL"),
            ("HTTP/1.1 100 Continue", "FAIL"),
            ("HTTP/1.1 400 Bad Request", "FAIL"),
            ("HTTP/1.1 404 Not Found", "FAIL"),
            ("HTTP/1.1 500 Internal Server Error", "FAIL"),
            ("HTTP/1.1 503 Backend 200 ms slow", "FAIL"),
            ("TIMEOUT", "FAIL"),
            ("REFUSED", "FAIL"),
            ("RESET", "FAIL"),
            ("HTTP/2 200", "FAIL"),
            ("HTTP/1.1 200OK", "FAIL"),
            ("garbage", "FAIL"),
            // A gRPC health call: only OK passes (the serving status is judged as a mismatch).
            ("GRPC 0", "PASS"),
            ("GRPC 12 UNIMPLEMENTED", "FAIL"),
            ("GRPC 14", "FAIL"),
        ] {
            assert_eq!(probe(answer), expected, "probe {answer:?}");
        }
    }

    #[test]
    fn traffic_rule_defaults() {
        for (answer, expected) in [
            ("HTTP/1.1 200 OK", "OK"),
            ("HTTP/1.1 100 Continue", "OK"),
            ("HTTP/1.1 301 Moved Permanently", "OK"),
            ("HTTP/1.1 401 Unauthorized", "OK"),
            ("HTTP/1.1 403 Forbidden", "OK"),
            ("HTTP/1.1 404 Not Found", "OK"),
            ("HTTP/1.1 499 x", "OK"),
            ("HTTP/1.1 500 Internal Server Error", "ERROR"),
            ("HTTP/1.1 502 Bad Gateway", "ERROR"),
            ("HTTP/1.1 503 Service Unavailable", "ERROR"),
            ("HTTP/1.1 599 x", "ERROR"),
            ("HTTP/1.1 404 Backend 500 errors", "OK"),
            ("TIMEOUT", "ERROR"),
            ("REFUSED", "ERROR"),
            ("RESET", "ERROR"),
            ("HTTP/1.1 600 x", "ERROR"),
            ("TLS", "ERROR"),
            ("GRPC 0", "OK"),
            ("GRPC 1", "OK"),
            ("GRPC 5", "OK"),
            ("GRPC 2", "ERROR"),
            ("GRPC 4", "ERROR"),
            ("GRPC 13", "ERROR"),
            ("GRPC 14", "ERROR"),
            ("GRPC 200", "OK"),
            ("http/1.1 200 OK", "ERROR"),
            ("garbage", "ERROR"),
        ] {
            assert_eq!(traffic(answer), expected, "traffic {answer:?}");
        }
    }

    #[test]
    fn configurable_rules() {
        let rule = ProbeRule {
            expect: "200-299,302".parse().unwrap(),
        };
        assert_eq!(rule.judge(Outcome::Status(204)), ProbeResult::Pass);
        assert_eq!(rule.judge(Outcome::Status(302)), ProbeResult::Pass);
        assert_eq!(rule.judge(Outcome::Status(301)), ProbeResult::Fail);
        let shedding = TrafficRule {
            count_503: false,
            ..TrafficRule::default()
        };
        assert_eq!(shedding.judge(Outcome::Status(503)), TrafficResult::Ok);
        assert_eq!(shedding.judge(Outcome::Status(502)), TrafficResult::Error);
        let only_unavailable = TrafficRule {
            grpc_errors: GrpcCodes::of([14]),
            ..TrafficRule::default()
        };
        assert_eq!(
            only_unavailable.judge(Outcome::Grpc(14)),
            TrafficResult::Error
        );
        assert_eq!(only_unavailable.judge(Outcome::Grpc(13)), TrafficResult::Ok);
        let none = TrafficRule {
            grpc_errors: GrpcCodes::empty(),
            ..TrafficRule::default()
        };
        assert_eq!(none.judge(Outcome::Grpc(14)), TrafficResult::Ok);
        assert_eq!(GrpcCodes::of([14, 4, 13, 2, 99]), GrpcCodes::DEFAULT_ERRORS);
        assert_eq!(format!("{:?}", GrpcCodes::DEFAULT_ERRORS), "[2, 4, 13, 14]");
    }

    #[test]
    fn status_set_parsing() {
        let set: StatusSet = "200-299,302".parse().unwrap();
        assert!(set.contains(200) && set.contains(299) && set.contains(302));
        assert!(!set.contains(199) && !set.contains(300) && !set.contains(303));
        assert_eq!(set.to_string(), "200-299,302");
        assert_eq!(
            " 204 , 200-203".parse::<StatusSet>().unwrap().to_string(),
            "200-204"
        );
        assert_eq!(StatusSet::default().to_string(), "200-399");
        for bad in [
            "", "abc", "200-", "-300", "2000", "20", "600", "099", "300-200", "200,,204",
        ] {
            assert!(
                bad.parse::<StatusSet>().is_err(),
                "{bad:?} should not parse"
            );
        }
        let err = "300-200".parse::<StatusSet>().unwrap_err().to_string();
        assert_eq!(err, "\"300-200\": the range is reversed");
    }
}
