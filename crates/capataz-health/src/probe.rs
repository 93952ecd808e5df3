//! What one probe came to beyond its status line: a [`ProbeOutcome`] is the exchange's
//! [`Outcome`] plus, when the pool matches bodies or headers, the first rule the answer broke
//! ([`Mismatch`]). The runtime reads the answer and decides the match; the engine only judges
//! the outcome ([`ProbeRule::judge_probe`](crate::ProbeRule::judge_probe)) and says it in its
//! sentences (`body did not contain "ok"`).
//!
//! A mismatch keeps the text it names in a [`Snippet`]: at most [`Snippet::MAX`] bytes, copied,
//! so reasons stay `Copy` and bounded whatever the configuration says.

use std::fmt;

use crate::status::Outcome;

/// A short copy of a configured text (a body substring, a header name or value), cut at a
/// character boundary after [`Snippet::MAX`] bytes and then written with a trailing `...`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Snippet {
    bytes: [u8; Snippet::MAX],
    len: u8,
    cut: bool,
}

impl Snippet {
    /// The most bytes of the text kept.
    pub const MAX: usize = 40;

    /// A copy of `text`, cut at a character boundary if longer than [`Snippet::MAX`] bytes.
    pub fn new(text: &str) -> Snippet {
        let mut end = text.len().min(Snippet::MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; Snippet::MAX];
        bytes[..end].copy_from_slice(&text.as_bytes()[..end]);
        Snippet {
            bytes,
            // `end` is at most `MAX`, 40.
            len: end as u8,
            cut: end < text.len(),
        }
    }

    /// The text kept (a prefix of the original when it was cut).
    pub fn as_str(&self) -> &str {
        // Built from a `&str` cut at a character boundary.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// Whether the original text was longer than what is kept.
    pub fn is_cut(&self) -> bool {
        self.cut
    }
}

impl fmt::Display for Snippet {
    /// The text quoted and escaped like a Rust string: `"ok"`, `"a\"b"`, `"long tex..."`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for c in self.as_str().chars() {
            write!(f, "{}", c.escape_debug())?;
        }
        if self.cut {
            f.write_str("...")?;
        }
        f.write_str("\"")
    }
}

impl fmt::Debug for Snippet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The first content rule an answer broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mismatch {
    /// The body (as far as it was read) did not contain the expected text.
    BodyLacks(Snippet),
    /// The body (as far as it was read) contained a forbidden text.
    BodyHas(Snippet),
    /// The expected header field was absent.
    HeaderAbsent(Snippet),
    /// The expected header field was present, but no value of it contained the expected text.
    HeaderLacks {
        /// The field's name.
        name: Snippet,
        /// The expected text.
        value: Snippet,
    },
    /// A gRPC health check's call succeeded, and the serving status it reported is not
    /// `SERVING` (1): `NOT_SERVING` (2), `SERVICE_UNKNOWN` (3), `UNKNOWN` (0) or a value the
    /// protocol does not define.
    GrpcServing(u64),
    /// A `tcp` check's answer (as far as it was read) did not contain the expected text.
    AnswerLacks(Snippet),
    /// A `tcp` check's answer did not start with the expected bytes (kept as the hex digits
    /// they were written in, `52`).
    AnswerStart(Snippet),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::BodyLacks(text) => write!(f, "body did not contain {text}"),
            Mismatch::BodyHas(text) => write!(f, "body contained {text}"),
            Mismatch::AnswerLacks(text) => write!(f, "answer did not contain {text}"),
            Mismatch::AnswerStart(hex) => write!(f, "answer did not start with hex {hex}"),
            Mismatch::HeaderAbsent(name) => write!(f, "header {name} was missing"),
            Mismatch::HeaderLacks { name, value } => {
                write!(f, "header {name} did not contain {value}")
            }
            Mismatch::GrpcServing(status) => match status {
                0 => f.write_str("gRPC health UNKNOWN"),
                1 => f.write_str("gRPC health SERVING"),
                2 => f.write_str("gRPC health NOT_SERVING"),
                3 => f.write_str("gRPC health SERVICE_UNKNOWN"),
                other => write!(f, "gRPC health status {other}"),
            },
        }
    }
}

/// One probe's outcome: the exchange's [`Outcome`], and whether the answer broke a content rule.
/// `mismatch` is `None` when no content rule is configured, when the answer met them all, and
/// when there was no answer to match (a timeout, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeOutcome {
    /// The exchange's outcome (the status line, or why there was none).
    pub outcome: Outcome,
    /// The first content rule the answer broke.
    pub mismatch: Option<Mismatch>,
}

impl From<Outcome> for ProbeOutcome {
    fn from(outcome: Outcome) -> ProbeOutcome {
        ProbeOutcome {
            outcome,
            mismatch: None,
        }
    }
}

impl fmt::Display for ProbeOutcome {
    /// `HTTP 200`, or `HTTP 200, body did not contain "ok"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.outcome)?;
        match self.mismatch {
            Some(mismatch) => write!(f, ", {mismatch}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_are_quoted_escaped_and_cut_at_a_character_boundary() {
        assert_eq!(Snippet::new("ok").to_string(), r#""ok""#);
        assert_eq!(Snippet::new("a\"b\n").to_string(), r#""a\"b\n""#);
        let long = "é".repeat(30);
        let snippet = Snippet::new(&long);
        assert!(snippet.is_cut());
        assert_eq!(snippet.as_str(), "é".repeat(20));
        assert!(snippet.to_string().ends_with("...\""));
        assert_eq!(Snippet::new("").to_string(), "\"\"");
    }

    #[test]
    fn mismatches_say_what_was_wrong() {
        let outcome = ProbeOutcome {
            outcome: Outcome::Status(200),
            mismatch: Some(Mismatch::BodyLacks(Snippet::new("ok"))),
        };
        assert_eq!(
            outcome.to_string(),
            r#"HTTP 200, body did not contain "ok""#
        );
        let header = Mismatch::HeaderLacks {
            name: Snippet::new("X-Ready"),
            value: Snippet::new("yes"),
        };
        assert_eq!(
            header.to_string(),
            r#"header "X-Ready" did not contain "yes""#
        );
        assert_eq!(
            Mismatch::HeaderAbsent(Snippet::new("X-Ready")).to_string(),
            r#"header "X-Ready" was missing"#
        );
        assert_eq!(
            Mismatch::BodyHas(Snippet::new("maintenance")).to_string(),
            r#"body contained "maintenance""#
        );
    }

    #[test]
    fn a_tcp_answer_that_starts_otherwise_fails_a_connected_probe_and_says_so() {
        let probe = ProbeOutcome {
            outcome: Outcome::Connected,
            mismatch: Some(Mismatch::AnswerStart(Snippet::new("52"))),
        };
        assert_eq!(
            crate::ProbeRule::default().judge_probe(&probe),
            crate::ProbeResult::Fail
        );
        assert!(
            probe
                .to_string()
                .ends_with(r#"answer did not start with hex "52""#),
            "{probe}"
        );
    }
}
