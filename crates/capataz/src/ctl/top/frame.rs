//! What one frame of `capataz top` says, laid out for a screen.
//!
//! Without a screen (output to a pipe or a file) a frame is everything: the title, per pool its
//! sentence, its queue and affinity lines (`ctl/balance.rs`: `capataz status`'s words) and a
//! table of all its backends, and the most recent events, sections apart. On a
//! terminal of `columns` x `rows` it never takes more: no line is wider than `columns` (a line
//! that would be is cut, ending in `…`; a long backend name gives way first so the figures stay
//! in their columns), and the frame is at most `rows` lines. When everything does not fit,
//! the sections close up, the events keep at least a quarter of the screen (3 lines at least),
//! the tables share the rest row by row, backends not UP first, each table ending in a
//! `+N more` line that counts the hidden backends by state, and the events area shows as many
//! of the latest events as fit.

use std::net::SocketAddr;

use serde_json::Value;

use super::fit::{cut, pad, width, Line};
use super::Reading;
use crate::ctl::{balance, cell, clock_of, human_ms, notes_of};

/// The size of the terminal a frame is drawn on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Screen {
    /// Its width, in columns.
    pub columns: usize,
    /// Its height, in lines.
    pub rows: usize,
}

/// The headers of a pool's table; the second column (the state) is coloured.
const HEADERS: [&str; 9] = [
    "BACKEND",
    "STATE",
    "WEIGHT",
    "IN-FLIGHT",
    "REQ/S",
    "ERR%",
    "P50",
    "P99",
    "NOTES",
];

/// Space before each table line, and between columns.
const INDENT: &str = "  ";
const GAP: usize = 2;

/// The narrowest a backend's name is cut to, however little room the line has.
const NAME_MIN: usize = 8;

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
fn colour_of(state: &str) -> &'static str {
    match state {
        "UP" => "32",
        "DOWN" | "FORCED_DOWN" => "31",
        _ => "33",
    }
}

/// A pool's part of a frame: its sentence, the lines under it (its queue and affinity, in
/// `capataz status`'s words), and its table's header and rows (cells).
struct PoolPart {
    sentence: Line,
    below: Vec<Line>,
    rows: Vec<Vec<String>>,
    states: Vec<String>,
}

fn pool_part(pool: &Value, series_pools: &[Value]) -> PoolPart {
    let empty = Vec::new();
    let series = series_pools.iter().find(|p| p["name"] == pool["name"]);
    let (rate, errors, p50, p99) =
        series.map_or((None, None, None, None), |p| last_sample(&p["series"]));
    let sentence = Line::plain(format!(
        "pool {}: {} of {} eligible; {} req/s, {} % errors, p50 {}, p99 {}; {}",
        cell(&pool["name"]),
        cell(&pool["healthy"]),
        cell(&pool["backends_total"]),
        rate_text(rate),
        pct_text(errors),
        ms_text(p50),
        ms_text(p99),
        cell(&pool["explain"]),
    ));
    let backends = pool["backends"].as_array().unwrap_or(&empty);
    let mut rows = Vec::with_capacity(backends.len());
    let mut states = Vec::with_capacity(backends.len());
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
        states.push(cell(&b["state"]));
        rows.push(vec![
            cell(&b["name"]),
            cell(&b["state"]),
            weight,
            balance::in_flight_of(b),
            rate_text(rate),
            pct_text(errors),
            ms_text(p50),
            ms_text(p99),
            notes_of(b),
        ]);
    }
    let below = balance::pool_lines(pool).lines().map(Line::plain).collect();
    PoolPart {
        sentence,
        below,
        rows,
        states,
    }
}

/// The width of each column of a table over `rows` (the header included), the backend's name
/// narrowed when the whole line would not fit in `columns`: to what leaves the notes their
/// room, but never below half the room the two share (nor below [`NAME_MIN`]).
fn column_widths(rows: &[Vec<String>], columns: Option<usize>) -> Vec<usize> {
    let mut widths: Vec<usize> = (0..HEADERS.len())
        .map(|c| {
            std::iter::once(HEADERS[c])
                .chain(rows.iter().filter_map(|r| r.get(c).map(String::as_str)))
                .map(width)
                .max()
                .unwrap_or(0)
        })
        .collect();
    if let Some(columns) = columns {
        let last = HEADERS.len() - 1;
        let fixed: usize = INDENT.len() + widths[1..last].iter().sum::<usize>() + GAP * last;
        let room = columns.saturating_sub(fixed);
        let (name, notes) = (widths[0], widths[last]);
        if name + notes > room {
            let narrowed = room.saturating_sub(notes).max(room / 2).max(NAME_MIN);
            widths[0] = name.min(narrowed);
        }
    }
    widths
}

/// One table line: the cells padded to their columns (the name cut to its own), the state
/// coloured, the last cell as long as it is.
fn table_line(cells: &[String], widths: &[usize], is_header: bool) -> Line {
    let mut line = Line::plain(INDENT);
    let last = cells.len().saturating_sub(1);
    for (c, text) in cells.iter().enumerate() {
        let text = if c == 0 {
            cut(text, widths[0])
        } else {
            text.clone()
        };
        let colour = (c == 1 && !is_header).then(|| colour_of(&text));
        if c == last {
            line.push(text, colour);
        } else {
            let gap = widths[c].saturating_sub(width(&text)) + GAP;
            line.push(text, colour);
            line.push(pad("", gap), None);
        }
    }
    line
}

/// Which of `states`' backends to show when only `shown` of them fit: those not UP first, then
/// the others, each in the pool's order; returned in the pool's order.
fn chosen(states: &[String], shown: usize) -> Vec<usize> {
    let mut picked: Vec<usize> = (0..states.len())
        .filter(|&i| states[i] != "UP")
        .chain((0..states.len()).filter(|&i| states[i] == "UP"))
        .take(shown)
        .collect();
    picked.sort_unstable();
    picked
}

/// `+N more: 25 UP, 2 DRAINING`: the backends left out, counted by state.
fn more_line(states: &[String], shown: &[usize]) -> Line {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for (i, state) in states.iter().enumerate() {
        if shown.binary_search(&i).is_ok() {
            continue;
        }
        match counts.iter_mut().find(|(s, _)| *s == state) {
            Some((_, n)) => *n += 1,
            None => counts.push((state, 1)),
        }
    }
    let hidden: usize = counts.iter().map(|(_, n)| n).sum();
    let by_state: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    Line::plain(format!("{INDENT}+{hidden} more: {}", by_state.join(", ")))
}

/// The lines a pool of `total` backends and `below` lines under its sentence takes with
/// `shown` of its backends: its sentence, those lines, the header, the rows and, when some are
/// hidden, the `+N more` line.
fn pool_cost(below: usize, shown: usize, total: usize) -> usize {
    2 + below + if shown < total { shown + 1 } else { total }
}

/// How many backends of each pool (`(below, total)`: lines under its sentence, backends) to
/// show in `budget` lines: as many pools as fit with none of their backends shown (one line
/// kept for `+N more pools` when not all do), then one row at a time to each in turn.
fn share_rows(totals: &[(usize, usize)], budget: usize) -> Vec<usize> {
    let mut used = 0;
    let mut pools = 0;
    for (i, &(below, total)) in totals.iter().enumerate() {
        let more_pools = usize::from(i + 1 < totals.len());
        if used + pool_cost(below, 0, total) + more_pools > budget {
            break;
        }
        used += pool_cost(below, 0, total);
        pools += 1;
    }
    if pools < totals.len() {
        used += 1;
    }
    let mut shown = vec![0; pools];
    let mut left = budget.saturating_sub(used);
    loop {
        let mut grew = false;
        for (i, n) in shown.iter_mut().enumerate() {
            let (below, total) = totals[i];
            if *n < total {
                let cost = pool_cost(below, *n + 1, total) - pool_cost(below, *n, total);
                if cost <= left {
                    *n += 1;
                    left -= cost;
                    grew = true;
                }
            }
        }
        if !grew {
            return shown;
        }
    }
}

/// One frame as lines (without line ends), fitted to `screen` when there is one. `events` is
/// the most events shown; `colour` adds ANSI colours to the states.
pub(super) fn frame(
    reading: &Reading,
    admin: SocketAddr,
    events: usize,
    screen: Option<Screen>,
    colour: bool,
) -> Vec<String> {
    let empty = Vec::new();
    let title = Line::plain(format!(
        "capataz top: {admin} at {} UTC (q or Ctrl-C quits)",
        clock_of(&reading.status["time"])
    ));
    let series_pools = reading.series["pools"].as_array().unwrap_or(&empty);
    let pools: Vec<PoolPart> = reading.status["pools"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|pool| pool_part(pool, series_pools))
        .collect();
    let kept = reading.events["events"].as_array().unwrap_or(&empty);
    let latest: Vec<Line> = kept
        .iter()
        .rev()
        .take(events)
        .map(|event| {
            Line::plain(format!(
                "{INDENT}{} UTC  {:<11}  {}",
                clock_of(&event["time"]),
                cell(&event["type"]),
                cell(&event["sentence"]),
            ))
        })
        .collect();

    let totals: Vec<(usize, usize)> = pools
        .iter()
        .map(|p| (p.below.len(), p.rows.len()))
        .collect();
    let event_lines = latest.len().max(1);
    let whole = 1 + totals.iter().map(|(b, n)| 3 + b + n).sum::<usize>() + 2 + event_lines;
    let rows = screen.map_or(usize::MAX, |s| s.rows);
    let columns = screen.map(|s| s.columns);
    // Everything, sections apart, when it fits; else closed up and shared out.
    let (spaced, shown, events_shown) = if whole <= rows {
        (true, totals.iter().map(|&(_, n)| n).collect(), latest.len())
    } else {
        let events_min = event_lines.min((rows / 4).max(3));
        let budget = rows.saturating_sub(1 + 1 + events_min);
        let shown = share_rows(&totals, budget);
        let used: usize = shown
            .iter()
            .zip(&totals)
            .map(|(&s, &(b, t))| pool_cost(b, s, t))
            .sum::<usize>()
            + usize::from(shown.len() < totals.len());
        let room = rows.saturating_sub(1 + used + 1);
        (false, shown, latest.len().min(room))
    };

    let mut lines = vec![title];
    for (pool, &count) in pools.iter().zip(&shown) {
        if spaced {
            lines.push(Line::default());
        }
        lines.push(pool.sentence.clone());
        lines.extend(pool.below.iter().cloned());
        let widths = column_widths(&pool.rows, columns);
        let header: Vec<String> = HEADERS.iter().map(|h| (*h).to_owned()).collect();
        lines.push(table_line(&header, &widths, true));
        let picked = chosen(&pool.states, count);
        for &i in &picked {
            lines.push(table_line(&pool.rows[i], &widths, false));
        }
        if picked.len() < pool.rows.len() {
            lines.push(more_line(&pool.states, &picked));
        }
    }
    if shown.len() < pools.len() {
        let hidden = &totals[shown.len()..];
        lines.push(Line::plain(format!(
            "+{} more pools ({} backends)",
            hidden.len(),
            hidden.iter().map(|&(_, n)| n).sum::<usize>()
        )));
    }
    if spaced {
        lines.push(Line::default());
    }
    lines.push(Line::plain(format!(
        "recent events ({events_shown} of {} kept):",
        kept.len()
    )));
    if kept.is_empty() {
        lines.push(Line::plain(format!("{INDENT}none yet")));
    }
    lines.extend(latest.into_iter().take(events_shown));
    lines.truncate(rows);
    lines
        .iter()
        .map(|line| line.render(columns, colour))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reading(backends: usize, events: usize) -> Reading {
        let backends: Vec<Value> = (0..backends)
            .map(|i| {
                let down = i % 7 == 5;
                json!({ "name": format!("app-server-{i:02}"), "state": if down { "DOWN" } else { "UP" },
                        "weight": 1, "effective_weight": 1.0, "in_flight": 0, "role": "primary",
                        "passive": {}, "active": {} })
            })
            .collect();
        let events: Vec<Value> = (0..events)
            .map(|i| json!({ "time": "2026-12-01T07:48:59.000Z", "type": "transition",
                "sentence": format!("pool=web backend=app-server-{i:02} UP -> DRAINING: manual override drain for 600 s, set through the admin API") }))
            .collect();
        Reading {
            status: json!({ "time": "2026-12-01T07:49:04.123Z", "pools": [{
                "name": "web", "healthy": 1, "backends_total": backends.len(),
                "explain": "served by its primary backends in rotation", "backends": backends }] }),
            series: json!({ "pools": [] }),
            events: json!({ "events": events }),
        }
    }

    const ADMIN: ([u8; 4], u16) = ([127, 0, 0, 1], 9901);

    /// The frame of `reading` (10 s between readings, no colours) on a screen of `columns`
    /// by `rows`.
    fn on_screen(reading: &Reading, columns: usize, rows: usize) -> Vec<String> {
        let screen = Screen { columns, rows };
        frame(reading, ADMIN.into(), 10, Some(screen), false)
    }

    #[test]
    fn a_frame_fits_its_screen_with_the_header_the_first_rows_and_what_is_not_up() {
        let screen = Screen {
            columns: 80,
            rows: 24,
        };
        let lines = frame(&reading(30, 60), ADMIN.into(), 100, Some(screen), false);
        assert_eq!(lines.len(), 24, "{lines:#?}");
        assert!(lines.iter().all(|l| width(l) <= 80), "{lines:#?}");
        assert!(lines[0].starts_with("capataz top: 127.0.0.1:9901 at 07:49:04 UTC"));
        assert!(
            lines[1].starts_with("pool web: 1 of 30 eligible"),
            "{lines:#?}"
        );
        assert!(lines[2].starts_with("  BACKEND"), "{lines:#?}");
        assert!(lines[3].starts_with("  app-server-00  UP"), "{lines:#?}");
        // The four DOWN backends (5, 12, 19, 26) are all among the rows shown.
        for i in [5, 12, 19, 26] {
            let name = format!("  app-server-{i:02}  DOWN");
            assert!(
                lines.iter().any(|l| l.starts_with(&name)),
                "{name}: {lines:#?}"
            );
        }
        let more = lines
            .iter()
            .find(|l| l.starts_with("  +"))
            .unwrap_or_else(|| panic!("no +N more: {lines:#?}"));
        let shown = lines
            .iter()
            .filter(|l| l.starts_with("  app-server-"))
            .count();
        assert_eq!(*more, format!("  +{} more: {} UP", 30 - shown, 30 - shown));
        let events_at = lines
            .iter()
            .position(|l| l.starts_with("recent events ("))
            .expect("the events header");
        assert!(24 - events_at > 6, "a quarter for the events: {lines:#?}");
        assert!(
            lines[events_at].starts_with(&format!(
                "recent events ({} of 60 kept)",
                24 - events_at - 1
            )),
            "{lines:#?}"
        );
        assert!(
            lines[events_at + 1].contains("app-server-59") && lines[events_at + 1].ends_with('…'),
            "the latest event first, cut: {lines:#?}"
        );
    }

    #[test]
    fn a_pools_queue_and_affinity_lines_are_under_its_sentence_and_counted_in_the_fit() {
        let mut r = reading(30, 60);
        let pool = &mut r.status["pools"][0];
        pool["queue"] = json!({"length": 3, "size": 64, "timeout_ms": 5000,
                               "refused_full": 2, "refused_timeout": 0});
        pool["affinity"] =
            json!({"hash": {"key": "client_ip", "balance_factor": 0}, "sticky": null});
        for (i, b) in pool["backends"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .enumerate()
        {
            b["in_flight"] = json!(i % 3);
            b["limit"] = json!(2);
        }
        let lines = on_screen(&r, 80, 24);
        assert_eq!(lines.len(), 24, "{lines:#?}");
        assert_eq!(
            lines[2],
            "  queue: 3 waiting of 64, timeout 5 s; refused 2 full, 0 timed out"
        );
        assert_eq!(lines[3], "  affinity: hash on client_ip");
        assert!(lines[4].starts_with("  BACKEND"), "{lines:#?}");
        let row: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(row[..4], ["app-server-00", "UP", "1", "0/2"], "{lines:#?}");
        let shown = lines
            .iter()
            .filter(|l| l.starts_with("  app-server-"))
            .count();
        let more = lines
            .iter()
            .find(|l| l.starts_with("  +"))
            .expect("+N more");
        assert!(
            more.starts_with(&format!("  +{} more:", 30 - shown)),
            "{more}"
        );
        let whole = frame(&r, ADMIN.into(), 10, None, false);
        assert_eq!(whole.len(), 1 + 1 + 4 + 30 + 1 + 1 + 10, "{whole:#?}");
    }

    #[test]
    fn a_frame_that_fits_is_whole_and_spaced_and_a_bigger_screen_shows_more() {
        let r = reading(3, 2);
        let lines = frame(&r, ADMIN.into(), 10, None, false);
        assert_eq!(lines.len(), 1 + 3 + 3 + 2 + 2, "{lines:#?}");
        assert_eq!(lines[1], "");
        let big = Screen {
            columns: 200,
            rows: 60,
        };
        assert_eq!(frame(&r, ADMIN.into(), 10, Some(big), false), lines);
        let small = on_screen(&reading(40, 40), 80, 24);
        let large = on_screen(&reading(40, 40), 120, 40);
        let rows = |lines: &[String]| {
            lines
                .iter()
                .filter(|l| l.starts_with("  app-server-"))
                .count()
        };
        assert!(rows(&large) > rows(&small), "{large:#?}");
        assert!(large.iter().all(|l| width(l) <= 120) && large.len() <= 40);
        assert!(
            large.iter().any(|l| width(l) > 80),
            "wider lines on a wider screen: {large:#?}"
        );
    }

    #[test]
    fn long_names_give_way_and_many_pools_are_counted_not_drawn() {
        let mut r = reading(2, 1);
        r.status["pools"][0]["backends"][0]["name"] = json!("n".repeat(300));
        let lines = on_screen(&r, 80, 24);
        let row = lines
            .iter()
            .find(|l| l.starts_with("  nnn"))
            .expect("the long name's row");
        assert!(
            row.contains("…  UP"),
            "the name is cut, the state stays: {row}"
        );
        let pools: Vec<Value> = (0..20).map(|_| r.status["pools"][0].clone()).collect();
        r.status["pools"] = Value::Array(pools);
        for rows in [24, 10, 3, 1] {
            let lines = on_screen(&r, 80, rows);
            assert!(lines.len() <= rows, "{rows}: {lines:#?}");
            assert!(lines.iter().all(|l| width(l) <= 80));
        }
        let lines = on_screen(&r, 80, 24);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("+") && l.contains("more pools")),
            "{lines:#?}"
        );
    }

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
        let text = frame(&reading, ([127, 0, 0, 1], 9901).into(), 10, None, false).join("\n");
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
        let coloured = frame(&reading, ([127, 0, 0, 1], 9901).into(), 10, None, true).join("\n");
        assert!(coloured.contains("\x1b[32mUP\x1b[0m"), "{coloured}");
    }
}
