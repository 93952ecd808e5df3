//! `capataz status` and `capataz ctl`: the admin API from a terminal.
//!
//! A few plain HTTP/1.1 requests to the admin listener; the tables and sentences are drawn from
//! the same JSON the dashboard reads (`/status`, and for `capataz top` the history), so the
//! terminal and the page never disagree; `--json` prints that JSON instead. `top` is the live
//! view ([`top`]).

mod balance;
pub mod top;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use serde_json::Value;
use tokio::time::Instant;

use crate::oneshot;

/// How long connecting to the admin API may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the answer may take, body included, once connected: a peer that sends a head
/// and then stalls must not hang the command.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read: `/history/series` of ten thousand backends (180 samples each)
/// is near 200 MiB, so this bounds an endless answer, not a large fleet's.
const MAX_ANSWER: usize = 512 << 20;

/// Why a command against the admin API failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The admin API could not be reached.
    #[error("cannot reach the admin API at {addr}: {source} (is capataz running with an [admin] table?)")]
    Connect {
        /// Where it was looked for.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The exchange failed midway.
    #[error("admin API at {addr}: {message}")]
    Http {
        /// Where.
        addr: SocketAddr,
        /// What.
        message: String,
    },
    /// The admin API answered with an error.
    #[error("admin API answered {status}: {message}")]
    Refused {
        /// The status code.
        status: u16,
        /// Its error message.
        message: String,
    },
}

/// Sends one request to the admin API and returns the JSON answer.
pub async fn request(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    token: Option<&str>,
) -> Result<Value, CtlError> {
    let http = |message: String| CtlError::Http { addr, message };
    let connected = oneshot::connect(addr, None, Instant::now() + CONNECT_TIMEOUT).await;
    let mut connection = connected.map_err(|error| match error {
        oneshot::Error::Connect(source) => CtlError::Connect { addr, source },
        oneshot::Error::ConnectTimeout => CtlError::Connect {
            addr,
            source: std::io::ErrorKind::TimedOut.into(),
        },
        other => http(other.to_string()),
    })?;
    // Host names the address actually reached (`--admin 0.0.0.0:9901` reaches 127.0.0.1), which
    // the admin API's checks against web pages accept.
    let host = connection.peer().unwrap_or(addr);
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, host.to_string());
    if let Some(token) = token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.to_string()))?;
    let by = Instant::now() + ANSWER_TIMEOUT;
    let answered = |error: oneshot::Error| match error {
        oneshot::Error::HeadTimeout | oneshot::Error::BodyTimeout => {
            http("no answer within 30 s".into())
        }
        other => http(other.to_string()),
    };
    let response = connection.send(request, by).await.map_err(answered)?;
    let status = response.status().as_u16();
    let body = oneshot::read_body(response.into_body(), MAX_ANSWER, by)
        .await
        .map_err(answered)?;
    let value: Value =
        serde_json::from_slice(&body).map_err(|e| http(format!("answer is not JSON ({e})")))?;
    if status >= 400 {
        let mut message = value["error"].as_str().unwrap_or("no message").to_owned();
        if status == 401 {
            message.push_str("; pass --token TOKEN or set CAPATAZ_ADMIN_TOKEN");
        }
        return Err(CtlError::Refused { status, message });
    }
    Ok(value)
}

/// The admin path of an override: `/backends/<pool>/<backend>/<verb>[?ttl=<ttl>]`, each part
/// percent-encoded, so that any name the config allows (spaces, `/`, `?`, non-ASCII text) and
/// any `--ttl` text reach the admin API as written.
pub fn override_path(pool: &str, backend: &str, verb: &str, ttl: Option<&str>) -> String {
    let mut path = format!(
        "/backends/{}/{}/{}",
        percent_encode(pool),
        percent_encode(backend),
        percent_encode(verb)
    );
    if let Some(ttl) = ttl {
        path.push_str("?ttl=");
        path.push_str(&percent_encode(ttl));
    }
    path
}

/// Every byte but the unreserved ones of RFC 3986 (letters, digits, `-._~`).
const NOT_UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` with every byte but the unreserved ones of RFC 3986 written as `%XX`.
fn percent_encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, NOT_UNRESERVED).to_string()
}

/// `value` as the admin API's JSON is printed with `--json`: pretty, with a final newline.
pub fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

fn cell(value: &Value) -> String {
    match value {
        Value::String(s) => printable(s),
        Value::Null => "-".into(),
        other => printable(&other.to_string()),
    }
}

/// `text` safe to print on a terminal: control characters (an escape sequence in a backend's
/// name from the config, a newline) written as `\u{1b}` escapes.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `HH:MM:SS` of an RFC 3339 time from the admin API (which writes UTC), or `-`.
pub fn clock_of(value: &Value) -> String {
    match value.as_str() {
        Some(time)
            if time.len() >= 19 && time.is_char_boundary(11) && time.is_char_boundary(19) =>
        {
            time[11..19].to_owned()
        }
        _ => "-".into(),
    }
}

/// A latency in milliseconds for people, sub-millisecond ones as such (`0.4 ms`, `40 us`).
pub fn human_ms(ms: f64) -> String {
    if !ms.is_finite() || ms < 0.0 {
        return "-".into();
    }
    if ms == 0.0 {
        "0 ms".into()
    } else if ms < 0.1 {
        format!("{} us", ((ms * 1000.0).round() as u64).max(1))
    } else if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{} ms", ms.round() as u64)
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

/// What qualifies a backend's state, as words: a manual override, an ejection and its cause,
/// probation, requalification, load shedding, its agent, a backup's standing.
pub fn notes_of(b: &Value) -> String {
    let mut notes = Vec::new();
    let o = &b["override"];
    if o.is_object() {
        let until = match o["until"].as_str() {
            Some(_) => format!(" until {}", clock_of(&o["until"])),
            None => String::new(),
        };
        notes.push(format!("manual {}{until}", cell(&o["kind"])));
    }
    let e = &b["passive"]["ejection"];
    match e["state"].as_str() {
        Some("ejected") => {
            let cause = match e["cause"].as_str() {
                Some("traffic_errors") => " (traffic errors)",
                Some("probation_failed") => " (error on probation)",
                Some("latency_outlier") => " (latency outlier)",
                Some("error_rate") => " (error-rate outlier)",
                _ => "",
            };
            let until = match e["until"].as_str() {
                Some(_) => format!(" until {}", clock_of(&e["until"])),
                None => String::new(),
            };
            notes.push(format!("ejected{cause}{until}"));
        }
        Some("probation") => notes.push("probation".into()),
        _ => {}
    }
    if b["requalify"].is_object() {
        notes.push(format!(
            "requalifying {}/{}",
            cell(&b["requalify"]["passes"]),
            cell(&b["requalify"]["needs"])
        ));
    }
    let shed = &b["passive"]["shedding"];
    if shed.is_object() {
        notes.push(format!(
            "shedding (HTTP {}) until {}",
            cell(&shed["status"]),
            clock_of(&shed["until"])
        ));
    }
    let agent = &b["agent"];
    if agent.is_object()
        && (agent["hold"].is_string() || agent["weight_percent"].as_u64().is_some_and(|w| w < 100))
    {
        notes.push(format!("agent: {}", cell(&agent["says"])));
    }
    if b["active"]["track"].is_string() {
        notes.push(format!("tracks {}", cell(&b["active"]["track"])));
    }
    if b["role"] == "backup" {
        notes.push(
            if b["serving"] == true {
                "backup, serving"
            } else {
                "backup, standing by"
            }
            .into(),
        );
    }
    notes.join("; ")
}

/// Rows of cells laid out in columns (by characters), each line starting with `indent`; the
/// last column is not padded.
pub fn table(indent: &str, rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = indent.to_owned();
        for (c, text) in row.iter().enumerate() {
            line.push_str(text);
            if c + 1 < row.len() {
                let pad = widths[c] - text.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The weight column: the configured weight, or `effective of configured` when they differ.
fn weight_of(b: &Value) -> String {
    let effective = b["effective_weight"].as_f64();
    let weight = b["weight"].as_f64();
    match (effective, weight) {
        (Some(e), Some(w)) if (e - w).abs() > f64::EPSILON => format!("{e:.1} of {w}"),
        _ => cell(&b["weight"]),
    }
}

/// The last probe: `HTTP 200 in 0.4 ms`, or `-`.
fn last_probe_of(b: &Value) -> String {
    let last = &b["active"]["last_probe"];
    if !last.is_object() {
        return "-".into();
    }
    match last["latency_ms"].as_f64() {
        Some(ms) => format!("{} in {}", cell(&last["outcome"]), human_ms(ms)),
        None => cell(&last["outcome"]),
    }
}

/// Renders `/status` for a terminal: per pool a sentence, its queue and affinity when it has
/// them (`balance`), and a table, one line per backend followed by its explain sentence. Times are UTC, as the admin API writes them.
pub fn render_status(status: &Value) -> String {
    let mut out = format!("capataz status at {} UTC\n", clock_of(&status["time"]));
    let empty = Vec::new();
    for listener in status["listeners"].as_array().unwrap_or(&empty) {
        out.push_str(&listener_line(listener));
        out.push('\n');
    }
    for pool in status["pools"].as_array().unwrap_or(&empty) {
        out.push('\n');
        out.push_str(&format!(
            "pool {}: {} of {} backends eligible; {}\n",
            cell(&pool["name"]),
            cell(&pool["healthy"]),
            cell(&pool["backends_total"]),
            cell(&pool["explain"]),
        ));
        out.push_str(&balance::pool_lines(pool));
        let mut rows = vec![[
            "BACKEND",
            "ADDRESS",
            "STATE",
            "SINCE",
            "WEIGHT",
            "IN-FLIGHT",
            "LAST PROBE",
            "NOTES",
        ]
        .map(String::from)
        .to_vec()];
        let backends = pool["backends"].as_array().unwrap_or(&empty);
        for b in backends {
            rows.push(vec![
                cell(&b["name"]),
                cell(&b["address"]),
                cell(&b["state"]),
                clock_of(&b["since"]),
                weight_of(b),
                balance::in_flight_of(b),
                last_probe_of(b),
                notes_of(b),
            ]);
        }
        out.push_str(&table("  ", &rows));
        out.push_str("  why:\n");
        for b in backends {
            out.push_str(&format!(
                "    {}: {}\n",
                cell(&b["name"]),
                cell(&b["explain"])
            ));
        }
    }
    out
}

/// A client listener in the dashboard's words: the connections it holds, of its
/// `max_connections` when it has one, the waits at that limit, and whether it is full now.
fn listener_line(listener: &Value) -> String {
    let open = listener["open"].as_u64().unwrap_or(0);
    let mut line = format!(
        "listener {} ({}, {}): {open} connection{}",
        cell(&listener["name"]),
        cell(&listener["address"]),
        cell(&listener["mode"]),
        if open == 1 { "" } else { "s" },
    );
    if let Some(max) = listener["max_connections"].as_u64() {
        line.push_str(&format!(" of {max} max"));
    }
    if let Some(waited) = listener["limit_reached"].as_u64() {
        line.push_str(&format!("; {waited} waited at the limit"));
    }
    if listener["full"] == Value::Bool(true) {
        line.push_str(" full: new connections wait");
    }
    line
}

/// The sentence of an override's answer (`POST /backends/...`).
pub fn render_override(answer: &Value) -> String {
    let who = format!("{}/{}", cell(&answer["pool"]), cell(&answer["backend"]));
    let state = cell(&answer["state"]);
    let lasting = match answer["ttl_ms"].as_u64() {
        Some(ms) => format!(
            " for {}",
            capataz_health::pool::human_duration(Duration::from_millis(ms))
        ),
        None => " until cleared".into(),
    };
    match answer["override"].as_str() {
        Some(kind) => format!("{who} is {state} now: manual override {kind}{lasting}.\n"),
        None => format!("{who}: override cleared; it is {state} now, as its health checks say.\n"),
    }
}

/// The sentence of a reload's answer (`POST /reload`).
pub fn render_reload(answer: &Value) -> String {
    if answer["pending"] == Value::Bool(true) {
        return "the reload is still under way (reading its file, or building the pools): it \
                applies when it ends; its outcome is logged.\n"
            .to_owned();
    }
    format!(
        "reloaded: {} backends kept their health, {} added (gated until they pass their probes), \
         {} removed (drained); {} listeners added, {} removed.\n",
        cell(&answer["kept"]),
        cell(&answer["added"]),
        cell(&answer["removed"]),
        cell(&answer["listeners_added"]),
        cell(&answer["listeners_removed"]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_line_says_its_connections_of_its_limit_and_when_it_is_full() {
        let status = serde_json::json!({
            "time": "2026-12-05T14:00:00Z",
            "listeners": [
                { "name": "web", "address": "127.0.0.1:8080", "mode": "http", "open": 3,
                  "max_connections": 3, "full": true, "limit_reached": 2 },
                { "name": "db", "address": "unix:/run/db.sock", "mode": "tcp", "open": 1,
                  "max_connections": null, "full": false, "limit_reached": null },
            ],
            "pools": [],
        });
        assert_eq!(
            render_status(&status),
            "capataz status at 14:00:00 UTC\n\
             listener web (127.0.0.1:8080, http): 3 connections of 3 max; 2 waited at the \
             limit full: new connections wait\n\
             listener db (unix:/run/db.sock, tcp): 1 connection\n"
        );
    }

    /// Regression: the path was pasted together unencoded, so `capataz ctl down web "web 2"`
    /// failed with "invalid uri character" and a `/` or `?` in a name reached another endpoint.
    #[test]
    fn names_with_spaces_slashes_and_unicode_are_percent_encoded_in_the_path() {
        assert_eq!(
            override_path("web", "web1", "drain", Some("10m")),
            "/backends/web/web1/drain?ttl=10m"
        );
        assert_eq!(
            override_path("web", "web 2/x?y#z", "down", None),
            "/backends/web/web%202%2Fx%3Fy%23z/down"
        );
        assert_eq!(
            override_path("web", "w\u{e9}b", "up", Some("1s&ttl=1h")),
            "/backends/web/w%C3%A9b/up?ttl=1s%26ttl%3D1h"
        );
        assert_eq!(
            override_path("web", "[::1]:9001", "clear", None),
            "/backends/web/%5B%3A%3A1%5D%3A9001/clear"
        );
    }

    /// Regression: the answer's body was read without a limit, so a peer on the admin port
    /// announcing (or sending) gigabytes made `capataz ctl` buffer them for up to 30 s.
    #[tokio::test]
    async fn an_admin_answer_longer_than_the_limit_is_refused_without_being_read() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut head = [0u8; 4096];
            let _ = socket.read(&mut head).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{{",
                1u64 << 32
            );
            let _ = socket.write_all(head.as_bytes()).await;
            std::future::pending::<()>().await;
        });
        let started = std::time::Instant::now();
        let error = request(addr, http::Method::GET, "/status", None)
            .await
            .expect_err("too long");
        assert!(
            error.to_string().contains("longer than 536870912 bytes"),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(20), "{error}");
    }
}
