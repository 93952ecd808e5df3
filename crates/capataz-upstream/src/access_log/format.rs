//! How a record is written: a text line (combined-like, then capataz's fields) or a JSON
//! object. Client-controlled strings are escaped so that one record is always one line whose
//! fields cannot be forged: in text as nginx's `escape=default` does (`"`, `\`, control
//! characters and bytes from 0x7F as `\xHH`), in JSON by serde_json.

use std::fmt::Write as _;

use capataz_config::UNIX_CLIENT;
use serde_json::{json, Value};

use super::AccessRecord;

/// The most bytes kept of a client-controlled field (target, method, headers, SNI); a longer
/// one is cut (at a character boundary) and ends with [`TRUNCATED`].
pub const MAX_FIELD: usize = 2048;

/// What ends a field cut at [`MAX_FIELD`] bytes.
const TRUNCATED: &str = "...";

/// `text` bounded to [`MAX_FIELD`] bytes, and whether it was cut.
pub(super) fn bounded(text: &str) -> (String, bool) {
    if text.len() <= MAX_FIELD {
        return (text.to_owned(), false);
    }
    let mut end = MAX_FIELD - TRUNCATED.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = String::with_capacity(MAX_FIELD);
    cut.push_str(&text[..end]);
    cut.push_str(TRUNCATED);
    (cut, true)
}

/// Appends `text` to `out` escaped as nginx's `escape=default`: `"`, `\`, bytes below 0x20
/// and from 0x7F up as `\xHH`, so the result holds no line break, quote or backslash of
/// the client's.
pub(super) fn escape_text(out: &mut String, text: &str) {
    for byte in text.bytes() {
        match byte {
            b'"' | b'\\' | 0..=0x1F | 0x7F..=0xFF => {
                let _ = write!(out, "\\x{byte:02X}");
            }
            _ => out.push(char::from(byte)),
        }
    }
}

/// `value` quoted and escaped, or `-` when absent.
fn quoted(out: &mut String, value: Option<&str>) {
    match value {
        Some(value) => {
            out.push('"');
            escape_text(out, value);
            out.push('"');
        }
        None => out.push('-'),
    }
}

/// `value` escaped (unquoted), or `-` when absent. A space is escaped too (`\x20`), so a
/// name with one (a pool's key, a `unix:` path) stays one field of the line.
fn bare(out: &mut String, value: Option<&str>) {
    let Some(value) = value else {
        out.push('-');
        return;
    };
    for (index, part) in value.split(' ').enumerate() {
        if index > 0 {
            out.push_str("\\x20");
        }
        escape_text(out, part);
    }
}

/// Appends the text line of `record` (with its newline) to `out`. The field order is
/// documented in docs/config.md and pinned by a test there and here.
pub(super) fn text(out: &mut String, listener: &str, record: &AccessRecord) {
    if record.client == UNIX_CLIENT {
        out.push_str("unix");
    } else {
        let _ = write!(out, "{}", record.client.ip());
    }
    let _ = write!(out, " - - [{}] \"", capataz_timefmt::rfc3339(record.time));
    escape_text(out, &record.method);
    out.push(' ');
    escape_text(out, &record.target);
    let _ = write!(out, " {}\" ", record.protocol);
    match record.status {
        Some(status) => {
            let _ = write!(out, "{status}");
        }
        None => out.push('-'),
    }
    let _ = write!(out, " {} ", record.bytes);
    quoted(out, record.referer.as_deref());
    out.push(' ');
    quoted(out, record.user_agent.as_deref());
    out.push_str(" listener=");
    bare(out, Some(listener));
    out.push_str(" route=");
    quoted(out, record.route.as_deref());
    out.push_str(" pool=");
    bare(out, record.pool.as_deref());
    out.push_str(" backend=");
    bare(out, record.backend.as_deref());
    let _ = write!(
        out,
        " attempts={} ended_by={} phase={} duration={:.6} queued=",
        record.attempts,
        record.termination.ended_by.as_str(),
        record.termination.phase.as_str(),
        record.duration.as_secs_f64(),
    );
    match record.queued {
        Some(queued) => {
            let _ = write!(out, "{:.6}", queued.as_secs_f64());
        }
        None => out.push('-'),
    }
    let _ = write!(out, " tls={} sni=", record.tls_version.unwrap_or("-"));
    quoted(out, record.sni.as_deref());
    let _ = write!(
        out,
        " client_port={} truncated={} reason={}",
        record.client.port(),
        record.truncated,
        record.reason.unwrap_or("-"),
    );
    // A TCP session's line only: the bytes read from the client.
    if let Some(bytes_in) = record.bytes_in {
        let _ = write!(out, " bytes_in={bytes_in}");
    }
    // Only for a pool that hashes or is sticky: other lines are as they were.
    if let Some(affinity) = record.affinity {
        let _ = write!(out, " affinity={affinity}");
    }
    // Only on a listener that gives ids: other lines are as they were.
    if let Some(id) = &record.request_id {
        out.push_str(" request_id=");
        quoted(out, Some(id));
    }
    out.push('\n');
}

/// Appends the JSON line of `record` (with its newline) to `out`.
pub(super) fn json(out: &mut String, listener: &str, record: &AccessRecord) {
    let mut value: Value = json!({
        "time": capataz_timefmt::rfc3339(record.time),
        "listener": listener,
        "client": if record.client == UNIX_CLIENT {
            "unix".to_owned()
        } else {
            record.client.ip().to_string()
        },
        "client_port": record.client.port(),
        "method": record.method,
        "target": record.target,
        "protocol": record.protocol,
        "status": record.status,
        "bytes": record.bytes,
        "bytes_in": record.bytes_in,
        "referer": record.referer,
        "user_agent": record.user_agent,
        "route": record.route,
        "pool": record.pool.as_deref(),
        "backend": record.backend.as_deref(),
        "attempts": record.attempts,
        "ended_by": record.termination.ended_by.as_str(),
        "phase": record.termination.phase.as_str(),
        "duration": record.duration.as_secs_f64(),
        "queued": record.queued.map(|q| q.as_secs_f64()),
        "tls_version": record.tls_version,
        "sni": record.sni,
        "truncated": record.truncated,
        "reason": record.reason,
        "affinity": record.affinity,
    });
    if let (Some(id), Some(object)) = (&record.request_id, value.as_object_mut()) {
        object.insert("request_id".into(), Value::from(id.as_str()));
    }
    // serde_json escapes every control character: the object is one line.
    out.push_str(&value.to_string());
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use super::*;
    use crate::access_log::{EndedBy, Phase, Termination};

    fn record() -> AccessRecord {
        AccessRecord {
            time: UNIX_EPOCH + Duration::from_millis(1_796_306_709_123),
            started: Instant::now(),
            duration: Duration::from_micros(1500),
            client: "192.0.2.7:50000".parse().unwrap(),
            method: "GET".into(),
            target: "/a?b=\"c\"\r\nforged=1".into(),
            protocol: "HTTP/1.1",
            referer: None,
            user_agent: Some("curl/8 \\ \u{e9}".into()),
            tls_version: Some("TLSv1.3"),
            sni: Some("app.example".into()),
            truncated: false,
            request_id: None,
            status: Some(200),
            bytes: 42,
            bytes_in: None,
            route: Some("/".into()),
            pool: Some("web".into()),
            backend: Some("web-1".into()),
            attempts: 1,
            termination: Termination {
                ended_by: EndedBy::Nobody,
                phase: Phase::Done,
            },
            queued: None,
            reason: None,
            affinity: None,
        }
    }

    #[test]
    fn the_text_line_has_its_documented_fields_in_order_and_escaped() {
        let mut out = String::new();
        text(&mut out, "public", &record());
        assert_eq!(
            out,
            "192.0.2.7 - - [2026-12-03T14:05:09.123Z] \"GET /a?b=\\x22c\\x22\\x0D\\x0Aforged=1 \
             HTTP/1.1\" 200 42 - \"curl/8 \\x5C \\xC3\\xA9\" listener=public route=\"/\" \
             pool=web backend=web-1 attempts=1 ended_by=- phase=- duration=0.001500 \
             queued=- tls=TLSv1.3 sni=\"app.example\" client_port=50000 truncated=false reason=-\n"
        );
    }

    #[test]
    fn a_name_with_a_space_stays_one_field_of_the_text_line() {
        let mut spaced = record();
        spaced.pool = Some("web pool".into());
        spaced.backend = Some("unix:/run/my app.sock".into());
        let mut out = String::new();
        text(&mut out, "pub lic", &spaced);
        assert!(
            out.contains(
                " listener=pub\\x20lic route=\"/\" pool=web\\x20pool \
                 backend=unix:/run/my\\x20app.sock attempts=1 "
            ),
            "{out}"
        );
    }

    #[test]
    fn a_tcp_sessions_line_has_no_status_and_ends_with_the_bytes_read_from_the_client() {
        let mut session = AccessRecord::session("192.0.2.7:50000".parse().unwrap(), "db".into());
        session.time = UNIX_EPOCH + Duration::from_millis(1_796_306_709_123);
        session.bytes = 7;
        session.bytes_in = Some(14);
        session.backend = Some("db-1".into());
        session.attempts = 2;
        session.affinity = Some("moved:failed");
        session.duration = Duration::from_millis(250);
        session.termination = Termination {
            ended_by: EndedBy::Timeout,
            phase: Phase::Idle,
        };
        let mut out = String::new();
        text(&mut out, "redis", &session);
        assert_eq!(
            out,
            "192.0.2.7 - - [2026-12-03T14:05:09.123Z] \"- - TCP\" - 7 - - listener=redis \
             route=- pool=db backend=db-1 attempts=2 ended_by=timeout phase=idle \
             duration=0.250000 queued=- tls=- sni=- client_port=50000 truncated=false reason=- bytes_in=14 \
             affinity=moved:failed\n"
        );
        let mut out = String::new();
        json(&mut out, "redis", &session);
        let back: Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(back["bytes_in"], 14);
        assert_eq!(back["status"], Value::Null);
        assert_eq!(back["protocol"], "TCP");
        assert_eq!(back["affinity"], "moved:failed");
        let mut out = String::new();
        json(&mut out, "public", &record());
        let back: Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(back["bytes_in"], Value::Null, "a request has none");
        assert_eq!(
            back["affinity"],
            Value::Null,
            "nor has a pool without affinity"
        );
    }

    #[test]
    fn the_json_line_is_one_line_that_parses_back() {
        let mut out = String::new();
        json(&mut out, "public", &record());
        assert_eq!(out.matches('\n').count(), 1);
        let back: Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(back["target"], "/a?b=\"c\"\r\nforged=1");
        assert_eq!(back["status"], 200);
        assert_eq!(back["referer"], Value::Null);
        assert_eq!(back["ended_by"], "-");
        assert_eq!(back["sni"], "app.example");
        assert_eq!(back["reason"], Value::Null);
    }

    #[test]
    fn a_long_field_is_cut_at_a_character_boundary_and_marked() {
        let long = "\u{e9}".repeat(MAX_FIELD);
        let (cut, was_cut) = bounded(&long);
        assert!(was_cut);
        assert!(cut.len() <= MAX_FIELD);
        assert!(cut.ends_with(TRUNCATED));
        assert_eq!(bounded("/short"), ("/short".to_owned(), false));
    }
}
