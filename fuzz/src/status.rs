//! Checks for the `status_line` target: `parse_status_line` and `Outcome::parse` on any bytes.
//!
//! Besides "never panics", each line is compared with a second, deliberately naive reading of
//! the grammar written in `capataz_health::status` (`HTTP/` DIGIT `.` DIGIT SP 3DIGIT, then
//! nothing or SP and a reason phrase of tab, space, visible ASCII and obs-text; code 100-599),
//! so a parser that accepts too much or too little fails, not only one that panics.
//!
//! This file uses nothing but `capataz_health` and `std`: the proptest smoke test
//! (`crates/capataz-health/tests/fuzz_smoke.rs`) includes it by path.

use capataz_health::{parse_status_line, Outcome};

/// Runs every check on one line; panics on the first violation.
pub fn check(line: &[u8]) {
    let parsed = parse_status_line(line);
    assert_eq!(parsed, reference(line), "line {line:?}");
    if let Some(code) = parsed {
        assert!(line.starts_with(b"HTTP/"), "accepted {line:?}");
        assert!((100..=599).contains(&code), "{line:?} gave {code}");
        assert_eq!(&line[9..12], code.to_string().as_bytes(), "{line:?}");
    }
    match Outcome::parse(line) {
        Outcome::Status(code) => assert_eq!(parsed, Some(code), "{line:?}"),
        Outcome::Timeout => assert_eq!(line, b"TIMEOUT"),
        Outcome::Refused => assert_eq!(line, b"REFUSED"),
        Outcome::Reset => assert_eq!(line, b"RESET"),
        Outcome::Tls => assert_eq!(line, b"TLS"),
        Outcome::Connected => assert_eq!(line, b"CONNECTED"),
        Outcome::Grpc(code) => {
            assert!(line.starts_with(b"GRPC "), "{line:?}");
            assert_eq!(&line[5..], code.to_string().as_bytes(), "{line:?}");
        }
        Outcome::Malformed => {
            assert_eq!(parsed, None, "{line:?}");
            assert!(![&b"TIMEOUT"[..], b"REFUSED", b"RESET", b"TLS", b"CONNECTED"].contains(&line));
        }
    }
}

/// The grammar, read character by character with no cleverness.
fn reference(line: &[u8]) -> Option<u16> {
    if line.len() < 12 || &line[..5] != b"HTTP/" {
        return None;
    }
    let digit = |i: usize| line[i].is_ascii_digit();
    if !(digit(5) && line[6] == b'.' && digit(7) && line[8] == b' ') {
        return None;
    }
    if !(digit(9) && digit(10) && digit(11)) {
        return None;
    }
    let code: u16 = std::str::from_utf8(&line[9..12]).ok()?.parse().ok()?;
    if !(100..=599).contains(&code) {
        return None;
    }
    if line.len() == 12 {
        return Some(code);
    }
    if line[12] != b' ' {
        return None;
    }
    for &b in &line[13..] {
        let visible = (0x21..=0x7e).contains(&b);
        let obs_text = b >= 0x80;
        if !(b == b'\t' || b == b' ' || visible || obs_text) {
            return None;
        }
    }
    Some(code)
}
