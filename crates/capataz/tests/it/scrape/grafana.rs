//! The Grafana dashboard (`contrib/grafana/capataz.json`) queries only metrics capataz
//! exports: every metric name in its PromQL expressions and variable queries is a sample name
//! of a scrape after [`busy`] traffic.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{busy, sample_names, scrape};

const DASHBOARD: &str = include_str!("../../../../../contrib/grafana/capataz.json");

/// PromQL words that are neither functions (those are followed by `(`) nor metric names.
const KEYWORDS: [&str; 13] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects: every identifier that is not a function or
/// aggregation (followed by `(`), a keyword, a label (inside `{}` or in the label list of `by`,
/// `without`, `on`, `ignoring`, `group_left`, `group_right`), part of a string, a range or
/// subquery (`[...]`), a number, or a Grafana variable (`$name`, `${name}`).
fn metric_names(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let mut names = Vec::new();
    let mut i = 0;
    // Set after a word whose parenthesised list holds labels.
    let mut labels_follow = false;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'"' | b'\'' | b'`' => i = skip_string(bytes, i),
            b'{' => i = skip_until(bytes, i, b'}'),
            b'[' => i = skip_until(bytes, i, b']'),
            b'(' if labels_follow => {
                i = skip_until(bytes, i, b')');
                labels_follow = false;
            }
            b'$' => {
                i += 1;
                if bytes.get(i) == Some(&b'{') {
                    i = skip_until(bytes, i, b'}');
                } else {
                    while i < bytes.len() && is_word(bytes[i]) {
                        i += 1;
                    }
                }
            }
            b'0'..=b'9' | b'.' => {
                // A number (or a duration after `offset`), exponent and suffix included.
                while i < bytes.len() && (is_word(bytes[i]) || bytes[i] == b'.') {
                    i += 1;
                }
            }
            c if is_word_start(c) => {
                let start = i;
                while i < bytes.len() && is_word(bytes[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let rest = expr[i..].trim_start();
                let next = rest.as_bytes().first().copied();
                // `sum by (l) (...)`: an aggregation whose label list comes first.
                let next_word: String = rest
                    .bytes()
                    .take_while(|&c| is_word(c))
                    .map(|c| char::from(c).to_ascii_lowercase())
                    .collect();
                let lower = word.to_ascii_lowercase();
                if [
                    "by",
                    "without",
                    "on",
                    "ignoring",
                    "group_left",
                    "group_right",
                ]
                .contains(&lower.as_str())
                {
                    labels_follow = true;
                } else if next == Some(b'(')
                    || next_word == "by"
                    || next_word == "without"
                    || KEYWORDS.contains(&lower.as_str())
                {
                    // A function, an aggregation, or a keyword.
                } else {
                    names.push(word.to_owned());
                }
            }
            _ => i += 1,
        }
    }
    names
}

fn is_word_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The index past the string starting at `start` (its quote), escapes included.
fn skip_string(bytes: &[u8], start: usize) -> usize {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quote != b'`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The index past the `close` matching the opener at `start`, strings inside skipped.
fn skip_until(bytes: &[u8], start: usize, close: u8) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'\'' | b'`' => i = skip_string(bytes, i),
            c if c == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Every PromQL expression of the dashboard: the panels' `expr`s, and the metric of each
/// `label_values(metric, label)` variable query (as an expression of its own).
fn expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    ("definition", Value::String(query)) => {
                        let inner = query
                            .strip_prefix("label_values(")
                            .and_then(|q| q.strip_suffix(')'))
                            .unwrap_or_else(|| panic!("an unexpected variable query {query}"));
                        let (metric, _label) = inner.rsplit_once(',').expect("two arguments");
                        out.push(metric.to_owned());
                    }
                    _ => expressions(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| expressions(item, out)),
        _ => {}
    }
}

#[test]
fn promql_metric_names_leave_out_functions_labels_strings_and_variables() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (pool, le) (rate(a_bucket{pool=~\"$pool\", \
             x=\"}by(\"}[$__rate_interval])))"
        ),
        ["a_bucket"]
    );
    assert_eq!(
        metric_names(
            "sum by (l) (rate(a_total{c=\"5xx\"}[5m])) / on (l) group_left sum without (x) \
             (b_total offset 1h) > bool 0.5e3 and c:recorded"
        ),
        ["a_total", "b_total", "c:recorded"]
    );
    assert_eq!(
        metric_names("time() - start_seconds{job=~\"${job}\"} or vector(1)"),
        ["start_seconds"]
    );
    assert_eq!(
        metric_names("up{job='a\\'}'} * on() group_right(x) b"),
        ["up", "b"]
    );
}

#[tokio::test]
async fn every_metric_the_grafana_dashboard_queries_is_exported() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "{exprs:?}");
    let queried: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    // The dashboard covers the client side, pools and backends, health, reloads and the
    // process.
    for name in [
        "capataz_client_requests_total",
        "capataz_client_request_duration_seconds_bucket",
        "capataz_upstream_response_seconds_bucket",
        "capataz_backend_up",
        "capataz_ejections_total",
        "capataz_probes_total",
        "capataz_config_reloads_total",
        "process_cpu_seconds_total",
    ] {
        assert!(queried.contains(name), "the dashboard does not show {name}");
    }

    let busy = busy().await;
    let (_, page) = scrape(busy.admin, None).await;
    let exported = sample_names(&page);
    // `process_*` are exported on Linux only.
    let missing: Vec<&String> = queried
        .difference(&exported)
        .filter(|name| cfg!(target_os = "linux") || !name.starts_with("process_"))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics capataz does not export: {missing:?}\nexported: \
         {exported:?}"
    );
}
