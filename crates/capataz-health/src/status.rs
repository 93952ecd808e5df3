//! Parsing what a backend answered into an [`Outcome`].
//!
//! The engine only ever looks at the status line of an answer, so this module is the one place
//! that decides what a well-formed status line is. The grammar is RFC 9112's status line with the
//! version and code fixed in width: `HTTP/` DIGIT `.` DIGIT, one space, exactly three digits, then
//! optionally one space and a reason phrase (possibly empty). The code is read from its own field
//! only, and a code outside 100-599 is not a status code at all (RFC 9110 section 15).

use std::fmt;

/// What one exchange with a backend came to, as far as health is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A well-formed status line; the code is always within 100-599.
    Status(u16),
    /// No answer before the deadline.
    Timeout,
    /// The connection was refused.
    Refused,
    /// The connection was reset (or closed) before a status line arrived.
    Reset,
    /// Bytes arrived, but they were not a status line.
    Malformed,
    /// The TLS handshake failed: the backend's certificate is not trusted or not for its name,
    /// or the backend refused the protocol or the handshake.
    Tls,
    /// A gRPC call ended with this `grpc-status` (0 is OK; 1-16 are the codes of the gRPC
    /// spec; a status that is not a number within 0-255 is recorded as UNKNOWN, 2). Its HTTP
    /// status was 200: a gRPC answer with another HTTP status is judged by that status.
    Grpc(u8),
    /// A TCP probe's connection opened. Nothing was read, so there is no status: it passes
    /// whatever the probe rule expects of a status. (Before it existed a TCP connect was
    /// recorded as a 200, which `expect = "204"` then failed on every backend.)
    Connected,
}

impl Outcome {
    /// Reads the textual form used by `capataz replay` and probe logs: `TIMEOUT`, `REFUSED`,
    /// `RESET`, `TLS`, `CONNECTED` (a TCP probe's connection opened), `GRPC <code>` (a gRPC
    /// status, 0-255, optionally followed by a space and its name, as the display writes it),
    /// or a status line as received. Anything
    /// that is none of these is [`Outcome::Malformed`].
    pub fn parse(answer: &[u8]) -> Outcome {
        match answer {
            b"TIMEOUT" => Outcome::Timeout,
            b"REFUSED" => Outcome::Refused,
            b"RESET" => Outcome::Reset,
            b"TLS" => Outcome::Tls,
            b"CONNECTED" => Outcome::Connected,
            [b'G', b'R', b'P', b'C', b' ', rest @ ..] => {
                match parse_grpc_status(grpc_code_of(rest)) {
                    Some(code) => Outcome::Grpc(code),
                    None => Outcome::Malformed,
                }
            }
            line => match parse_status_line(line) {
                Some(code) => Outcome::Status(code),
                None => Outcome::Malformed,
            },
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Status(code) => write!(f, "HTTP {code}"),
            Outcome::Timeout => f.write_str("TIMEOUT"),
            Outcome::Refused => f.write_str("REFUSED"),
            Outcome::Reset => f.write_str("RESET"),
            Outcome::Malformed => f.write_str("malformed status line"),
            Outcome::Tls => f.write_str("TLS"),
            Outcome::Grpc(code) => match grpc_code_name(*code) {
                Some(name) => write!(f, "GRPC {code} {name}"),
                None => write!(f, "GRPC {code}"),
            },
            Outcome::Connected => f.write_str("TCP connect succeeded"),
        }
    }
}

/// The name the gRPC spec gives a status code (`UNAVAILABLE` for 14), for codes 0-16.
pub fn grpc_code_name(code: u8) -> Option<&'static str> {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(usize::from(code)).copied()
}

/// The code of `GRPC <code>` or `GRPC <code> <NAME>` (the name is what [`Outcome`]'s display
/// adds, and is not checked).
fn grpc_code_of(rest: &[u8]) -> &[u8] {
    match rest.iter().position(|&b| b == b' ') {
        Some(space) => &rest[..space],
        None => rest,
    }
}

/// Parses one status line (without its line ending) and returns its code.
///
/// Returns `None` for anything that is not exactly `HTTP/` DIGIT `.` DIGIT SP 3DIGIT, optionally
/// followed by SP and a reason phrase, or whose code lies outside 100-599. The reason phrase may
/// be empty and may hold any of RFC 9112's reason-phrase bytes (tab, space, visible ASCII and
/// obs-text); other control bytes make the line malformed. Never panics, whatever the bytes.
pub fn parse_status_line(line: &[u8]) -> Option<u16> {
    let (head, rest) = line.split_at_checked(12)?;
    let [b'H', b'T', b'T', b'P', b'/', major, b'.', minor, b' ', d0, d1, d2] = *head else {
        return None;
    };
    if !(major.is_ascii_digit()
        && minor.is_ascii_digit()
        && d0.is_ascii_digit()
        && d1.is_ascii_digit()
        && d2.is_ascii_digit())
    {
        return None;
    }
    let code = u16::from(d0 - b'0') * 100 + u16::from(d1 - b'0') * 10 + u16::from(d2 - b'0');
    if !(100..=599).contains(&code) {
        return None;
    }
    match rest {
        [] => Some(code),
        [b' ', reason @ ..] if reason.iter().all(|&b| is_reason_byte(b)) => Some(code),
        _ => None,
    }
}

/// Parses a `grpc-status` value: one to three ASCII digits, 0-255. Anything else is `None`
/// (a caller judging a backend's answer reads that as UNKNOWN, 2, as gRPC clients do).
pub fn parse_grpc_status(value: &[u8]) -> Option<u8> {
    if value.is_empty() || value.len() > 3 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = value
        .iter()
        .fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
    u8::try_from(n).ok()
}

fn is_reason_byte(b: u8) -> bool {
    b == b'\t' || (b >= b' ' && b != 0x7f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expected: Option<u16>) {
        assert_eq!(
            parse_status_line(line.as_bytes()),
            expected,
            "line {line:?}"
        );
    }

    #[test]
    fn well_formed_lines() {
        check("HTTP/1.1 200 OK", Some(200));
        check("HTTP/1.0 301 Moved Permanently", Some(301));
        check("HTTP/1.1 200", Some(200));
        check("HTTP/1.1 200 ", Some(200));
        check("HTTP/1.1 503 Backend 200 ms slow", Some(503));
        check("HTTP/9.9 100 Continue", Some(100));
        check("HTTP/1.1 599 x", Some(599));
        check("HTTP/1.1 200 OK\twith tab", Some(200));
        check("HTTP/1.1 200 caf\u{e9}", Some(200));
        check("HTTP/1.1 404 Not Found", Some(404));
    }

    #[test]
    fn malformed_lines() {
        for line in [
            "HTTP/2 200",
            "HTTP/1.1 2000 OK",
            "HTTP/1.1 20 OK",
            "HTTP/1.1 200OK",
            "http/1.1 200 OK",
            "garbage",
            "",
            "HTTP/1.1",
            "HTTP/1.1 ",
            "HTTP/1.1  200 OK",
            "HTTP/1.1 099 Low",
            "HTTP/1.1 000",
            "HTTP/1.1 600 High",
            "HTTP/1.1 999 x",
            "HTTP/1.1 2x0 OK",
            "HTTP/11 200 OK",
            "HTTP/1.12 200 OK",
            "HTTP/a.1 200 OK",
            "HTTP/1,1 200 OK",
            " HTTP/1.1 200 OK",
            "HTTP/1.1\t200 OK",
            "HTTPS/1.1 200 OK",
            "HTTP/1.1 200 OK\r",
            "HTTP/1.1 200 O\x00K",
        ] {
            check(line, None);
        }
    }

    #[test]
    fn answers() {
        assert_eq!(Outcome::parse(b"TIMEOUT"), Outcome::Timeout);
        assert_eq!(Outcome::parse(b"REFUSED"), Outcome::Refused);
        assert_eq!(Outcome::parse(b"RESET"), Outcome::Reset);
        assert_eq!(Outcome::parse(b"timeout"), Outcome::Malformed);
        assert_eq!(Outcome::parse(b"HTTP/1.1 204"), Outcome::Status(204));
        assert_eq!(Outcome::parse(b"HTTP/1.1 20 OK"), Outcome::Malformed);
        assert_eq!(Outcome::parse(b"GRPC 14"), Outcome::Grpc(14));
        assert_eq!(Outcome::parse(b"TLS"), Outcome::Tls);
        assert_eq!(Outcome::parse(b"GRPC 0"), Outcome::Grpc(0));
        for bad in [
            &b"GRPC"[..],
            b"GRPC ",
            b"GRPC 256",
            b"GRPC -1",
            b"GRPC 1a",
            b"GRPC 0014",
        ] {
            assert_eq!(Outcome::parse(bad), Outcome::Malformed, "{bad:?}");
        }
    }

    #[test]
    fn display() {
        assert_eq!(Outcome::Status(503).to_string(), "HTTP 503");
        assert_eq!(Outcome::Timeout.to_string(), "TIMEOUT");
        assert_eq!(Outcome::Malformed.to_string(), "malformed status line");
        assert_eq!(Outcome::Grpc(14).to_string(), "GRPC 14 UNAVAILABLE");
        assert_eq!(Outcome::Grpc(200).to_string(), "GRPC 200");
        assert_eq!(Outcome::parse(b"GRPC 12 UNIMPLEMENTED"), Outcome::Grpc(12));
        assert_eq!(Outcome::parse(b"GRPC 200"), Outcome::Grpc(200));
        assert_eq!(
            Outcome::parse(Outcome::Grpc(4).to_string().as_bytes()),
            Outcome::Grpc(4)
        );
    }
}
