//! `capataz top`: a live terminal view of pools, backends and events, redrawn every interval
//! from the admin API (`/status`, `/history/series`, `/history/events`).
//!
//! On a terminal it clears the screen before each frame and colours the states with plain ANSI
//! escapes; anywhere else (a pipe, a file, a test) it prints the frames one after another,
//! uncoloured, each under a line of its own. It stops on `q` (read from standard input: on a
//! terminal without waiting for Enter, through `stty`), on Ctrl-C, or after `iterations`
//! frames.

use std::io::{IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use super::{cell, clock_of, human_ms, notes_of, printable, request, table, CtlError};

/// How `capataz top` runs.
#[derive(Clone, Debug)]
pub struct TopOptions {
    /// The admin API.
    pub admin: SocketAddr,
    /// Its bearer token, if it needs one.
    pub token: Option<String>,
    /// Time between frames.
    pub interval: Duration,
    /// Stop after this many frames (run until `q` or Ctrl-C when `None`).
    pub iterations: Option<u64>,
    /// The most recent events shown.
    pub events: usize,
}

/// What one frame is drawn from.
struct Reading {
    status: Value,
    series: Value,
    events: Value,
}

async fn read(options: &TopOptions) -> Result<Reading, CtlError> {
    let token = options.token.as_deref();
    let get = |path| request(options.admin, http::Method::GET, path, token);
    Ok(Reading {
        status: get("/status").await?,
        series: get("/history/series").await?,
        events: get("/history/events").await?,
    })
}

/// The last sample of a series object: requests per second, error share in percent, p50 and
/// p99 in milliseconds (each `None` when unknown).
fn last_sample(series: &Value) -> (Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
    let last = |key: &str| series[key].as_array().and_then(|a| a.last()).cloned();
    let requests = last("requests").and_then(|v| v.as_f64());
    let seconds = last("seconds").and_then(|v| v.as_f64());
    let errors = last("errors").and_then(|v| v.as_f64());
    let rate = match (requests, seconds) {
        (Some(r), Some(s)) if s > 0.0 => Some(r / s),
        _ => None,
    };
    let error_pct = match (requests, errors) {
        (Some(r), Some(e)) if r > 0.0 => Some(100.0 * e / r),
        _ => None,
    };
    let p50 = last("p50_ms").and_then(|v| v.as_f64());
    let p99 = last("p99_ms").and_then(|v| v.as_f64());
    (rate, error_pct, p50, p99)
}

fn rate_text(rate: Option<f64>) -> String {
    match rate {
        Some(r) if r >= 10.0 => format!("{r:.0}"),
        Some(r) => format!("{r:.1}"),
        None => "-".into(),
    }
}

fn pct_text(pct: Option<f64>) -> String {
    pct.map_or_else(|| "-".into(), |p| format!("{p:.1}"))
}

fn ms_text(ms: Option<f64>) -> String {
    ms.map_or_else(|| "-".into(), human_ms)
}

/// The ANSI colour of a state: green UP, red DOWN, yellow anything else.
fn coloured(state: &str, colour: bool) -> String {
    if !colour {
        return state.to_owned();
    }
    let code = match state {
        "UP" => "32",
        "DOWN" | "FORCED_DOWN" => "31",
        _ => "33",
    };
    format!("\x1b[{code}m{state}\x1b[0m")
}

/// One frame, as text. `colour` adds ANSI colours to the states (the table's columns are laid
/// out on the plain text first).
fn frame(reading: &Reading, admin: SocketAddr, events: usize, colour: bool) -> String {
    let mut out = format!(
        "capataz top: {admin} at {} UTC (q or Ctrl-C quits)\n",
        clock_of(&reading.status["time"])
    );
    let empty = Vec::new();
    let series_pools = reading.series["pools"].as_array().unwrap_or(&empty);
    for pool in reading.status["pools"].as_array().unwrap_or(&empty) {
        let series = series_pools.iter().find(|p| p["name"] == pool["name"]);
        let (rate, errors, p50, p99) =
            series.map_or((None, None, None, None), |p| last_sample(&p["series"]));
        out.push('\n');
        out.push_str(&format!(
            "pool {}: {} of {} eligible; {} req/s, {} % errors, p50 {}, p99 {}; {}\n",
            cell(&pool["name"]),
            cell(&pool["healthy"]),
            cell(&pool["backends_total"]),
            rate_text(rate),
            pct_text(errors),
            ms_text(p50),
            ms_text(p99),
            cell(&pool["explain"]),
        ));
        let mut rows = vec![[
            "BACKEND",
            "STATE",
            "WEIGHT",
            "IN-FLIGHT",
            "REQ/S",
            "ERR%",
            "P50",
            "P99",
            "NOTES",
        ]
        .map(String::from)
        .to_vec()];
        let backends = pool["backends"].as_array().unwrap_or(&empty);
        for b in backends {
            let backend_series = series.and_then(|p| {
                p["backends"]
                    .as_array()?
                    .iter()
                    .find(|s| s["name"] == b["name"])
            });
            let (rate, errors, p50, p99) =
                backend_series.map_or((None, None, None, None), |s| last_sample(&s["series"]));
            let weight = match (b["effective_weight"].as_f64(), b["weight"].as_f64()) {
                (Some(e), Some(w)) if (e - w).abs() > f64::EPSILON => format!("{e:.1}/{w}"),
                _ => cell(&b["weight"]),
            };
            rows.push(vec![
                cell(&b["name"]),
                cell(&b["state"]),
                weight,
                cell(&b["in_flight"]),
                rate_text(rate),
                pct_text(errors),
                ms_text(p50),
                ms_text(p99),
                notes_of(b),
            ]);
        }
        let text = table("  ", &rows);
        if colour {
            // Colour the state cell of each backend line (the second column), after layout.
            for (line, b) in text
                .lines()
                .zip(std::iter::once(&Value::Null).chain(backends))
            {
                let state = cell(&b["state"]);
                let name = cell(&b["name"]);
                let prefix = format!("  {name}");
                match (line.strip_prefix(&prefix), b.is_null()) {
                    (Some(rest), false) => {
                        let gap = rest.len() - rest.trim_start().len();
                        let after = &rest[gap..];
                        let tail = after.strip_prefix(state.as_str()).unwrap_or(after);
                        out.push_str(&prefix);
                        out.push_str(&rest[..gap]);
                        out.push_str(&coloured(&state, true));
                        out.push_str(tail);
                    }
                    _ => out.push_str(line),
                }
                out.push('\n');
            }
        } else {
            out.push_str(&text);
        }
    }
    let kept = reading.events["events"].as_array().unwrap_or(&empty);
    out.push_str(&format!(
        "\nrecent events ({} of {} kept):\n",
        kept.len().min(events),
        kept.len()
    ));
    if kept.is_empty() {
        out.push_str("  none yet\n");
    }
    for event in kept.iter().rev().take(events) {
        out.push_str(&format!(
            "  {} UTC  {:<11}  {}\n",
            clock_of(&event["time"]),
            cell(&event["type"]),
            cell(&event["sentence"]),
        ));
    }
    out
}

/// Puts the terminal on standard input in a mode where `q` arrives without Enter (and is not
/// echoed), and restores it when dropped. Does nothing when standard input is not a terminal
/// or `stty` is missing.
struct RawInput {
    saved: Option<String>,
}

impl RawInput {
    fn start() -> RawInput {
        if !std::io::stdin().is_terminal() {
            return RawInput { saved: None };
        }
        let saved = std::process::Command::new("stty")
            .arg("-g")
            .stdin(std::process::Stdio::inherit())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned());
        if saved.is_some() {
            let _ = std::process::Command::new("stty")
                .args(["-icanon", "-echo", "min", "1"])
                .stdin(std::process::Stdio::inherit())
                .status();
        }
        RawInput { saved }
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = std::process::Command::new("stty")
                .arg(saved)
                .stdin(std::process::Stdio::inherit())
                .status();
        }
    }
}

/// Watches standard input on a thread of its own (a blocking read; the process may end while
/// it waits) and says when a `q` arrives.
fn quit_key() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut byte = [0u8; 1];
        loop {
            match stdin.read(&mut byte) {
                Ok(1) if matches!(byte[0], b'q' | b'Q') => {
                    let _ = tx.send(());
                    return;
                }
                Ok(1) => {}
                // End of input (or an error): no key will come; keep running.
                _ => return,
            }
        }
    });
    rx
}

/// Runs `capataz top` until `q`, Ctrl-C or `options.iterations` frames, writing frames to
/// `out`. Fails only if the first reading fails (the admin API is not there); later failures
/// are shown in place of a frame, and reading goes on.
pub async fn run(options: TopOptions, out: &mut dyn Write) -> Result<(), CtlError> {
    let terminal = std::io::stdout().is_terminal();
    let _raw = RawInput::start();
    let mut quit = quit_key();
    let mut input_open = true;
    let mut shown = 0u64;
    let interval = options.interval.max(Duration::from_millis(100));
    loop {
        let text = match read(&options).await {
            Ok(reading) => frame(&reading, options.admin, options.events, terminal),
            Err(error) if shown == 0 => return Err(error),
            Err(error) => format!(
                "capataz top: {}: {} (retrying every {})\n",
                options.admin,
                printable(&error.to_string()),
                capataz_health::pool::human_duration(interval)
            ),
        };
        let written = if terminal {
            write!(out, "\x1b[H\x1b[2J{text}")
        } else {
            if shown > 0 {
                let _ = writeln!(out);
            }
            write!(out, "--- frame {} ---\n{text}", shown + 1)
        };
        // A reader that went away (`capataz top | head`) is a way to stop.
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
        shown += 1;
        if options.iterations.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        let pause = tokio::time::sleep(interval);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = &mut pause => break,
                key = &mut quit, if input_open => match key {
                    Ok(()) => return Ok(()),
                    // Standard input ended (or is not there): only Ctrl-C or the count stop it.
                    Err(_) => input_open = false,
                },
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_frame_shows_rates_latencies_notes_and_events_without_control_bytes() {
        let reading = Reading {
            status: json!({
                "time": "2026-12-01T07:49:04.123Z",
                "pools": [{
                    "name": "web", "healthy": 1, "backends_total": 2,
                    "explain": "served by its primary backends in rotation",
                    "backends": [
                        { "name": "a", "state": "UP", "weight": 1, "effective_weight": 1.0,
                          "in_flight": 0, "role": "primary", "passive": {}, "active": {} },
                        { "name": "b\u{1b}[2J", "state": "DOWN", "weight": 2,
                          "effective_weight": 2.0, "in_flight": 0, "role": "backup",
                          "serving": false, "active": { "track": "db/primary" },
                          "passive": { "ejection": { "state": "ejected",
                            "cause": "latency_outlier", "until": "2026-12-01T07:50:00.000Z" } } }
                    ]
                }]
            }),
            series: json!({ "pools": [{
                "name": "web",
                "series": { "requests": [10, 20], "seconds": [5.0, 5.0], "errors": [0, 1],
                            "p50_ms": [0.4, 0.41], "p99_ms": [1.0, 12.5] },
                "backends": [{ "name": "a", "series": { "requests": [20], "seconds": [5.0],
                    "errors": [0], "p50_ms": [0.04], "p99_ms": [0.9] } }]
            }]}),
            events: json!({ "events": [
                { "time": "2026-12-01T07:48:59.000Z", "type": "transition",
                  "sentence": "pool=web backend=b UP -> DOWN: 3 consecutive failed probes" }
            ]}),
        };
        let text = frame(&reading, ([127, 0, 0, 1], 9901).into(), 10, false);
        assert!(text.contains("at 07:49:04 UTC"), "{text}");
        assert!(
            text.contains("4.0 req/s, 5.0 % errors, p50 0.4 ms, p99 13 ms"),
            "{text}"
        );
        assert!(text.contains("40 us"), "a's p50 under 0.1 ms: {text}");
        assert!(
            text.contains(
                "ejected (latency outlier) until 07:50:00; tracks db/primary; backup, standing by"
            ),
            "{text}"
        );
        assert!(text.contains("07:48:59 UTC  transition"), "{text}");
        assert!(
            !text.contains('\u{1b}'),
            "a name's escape is shown, not sent: {text}"
        );
        let coloured = frame(&reading, ([127, 0, 0, 1], 9901).into(), 10, true);
        assert!(coloured.contains("\x1b[32mUP\x1b[0m"), "{coloured}");
    }
}
