//! End-to-end tests of `GET /metrics` on loopback: a balancer with an admin listener, in-process
//! backends, and scrapes checked line by line as one valid exposition.
//!
//! Every balancer has its own registry, so a scrape shows only its own balancer's series: the
//! tests share the `it` binary with every other end-to-end test and still count exactly.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use capataz::config;
use capataz::server::Balancer;
use capataz::sim::{Mode, SimBackend};
use capataz_health::State;

use crate::support;
use crate::support::balancer::{backends, start, ConfigText};
use crate::support::events::{is_transition as went, wait_for};
use crate::support::wait::until_ok;

/// How often a scrape is asked again while a count is not there yet.
const EVERY: Duration = Duration::from_millis(20);

/// A config with an admin listener (with `admin` TOML added to its table), one client
/// listener, and one pool `pool` over `backends`, plus `extra` TOML appended (tables of the
/// pool, or `[alerts]`).
fn config_text(pool: &str, backends: &[SimBackend], admin: &str, extra: &str) -> String {
    ConfigText::sims(backends)
        .pool(pool)
        .admin(admin)
        .extra(extra)
        .build()
}

/// One HTTP/1.1 exchange on a fresh connection: status, `Content-Type` and body.
async fn exchange(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let answer = support::client::exchange(addr, method, path, &addr.to_string(), &[]).await;
    (
        answer.status,
        answer.content_type().to_owned(),
        answer.text(),
    )
}

/// One sample line.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A scrape, parsed.
struct Scrape(Vec<Sample>);

impl Scrape {
    /// The value of the one series named `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        assert_eq!(
            found.len(),
            1,
            "want one {name} {labels:?}, found {found:?}"
        );
        found[0].value
    }

    /// The sum over the series named `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses `{k="v",...}` (the braces included) with the exposition's escapes.
fn parse_labels(text: &str, line: &str) -> BTreeMap<String, String> {
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or_else(|| panic!("labels not in braces: {line}"));
    let mut labels = BTreeMap::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("a label without =\": {line}"));
        assert!(is_metric_name(key), "bad label name {key:?}: {line}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => panic!("bad escape {other:?}: {line}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("an unterminated label value: {line}"),
            }
        };
        assert!(
            labels.insert(key.to_owned(), value).is_none(),
            "label {key} twice: {line}"
        );
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    labels
}

/// Parses and checks a whole exposition: every line a descriptor or `name{labels} value`,
/// every sample under its family's `# TYPE`, no family twice, and one `# EOF`, last.
fn parse(text: &str) -> Scrape {
    assert!(text.ends_with("# EOF\n"), "no final # EOF:\n{text}");
    assert_eq!(text.matches("# EOF").count(), 1, "more than one # EOF");
    let mut families = HashSet::new();
    let mut family: Option<(String, String)> = None;
    let mut samples = Vec::new();
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name, what) = (parts.next(), parts.next(), parts.next());
            let name = name.unwrap_or_else(|| panic!("a descriptor without a name: {line}"));
            assert!(is_metric_name(name), "bad family name: {line}");
            match kind {
                Some("TYPE") => {
                    let what = what.unwrap_or_default();
                    assert!(
                        ["counter", "gauge", "histogram"].contains(&what),
                        "unexpected type: {line}"
                    );
                    assert!(families.insert(name.to_owned()), "family twice: {line}");
                    family = Some((name.to_owned(), what.to_owned()));
                }
                Some("HELP") => assert!(what.is_some_and(|h| !h.is_empty()), "empty help: {line}"),
                Some("UNIT") => assert!(
                    matches!(what, Some("seconds" | "bytes")),
                    "unexpected unit: {line}"
                ),
                _ => panic!("unknown descriptor: {line}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a sample without a value: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("a value that is not a number: {line}"));
        let (name, labels) = match series.find('{') {
            Some(at) => (&series[..at], parse_labels(&series[at..], line)),
            None => (series, BTreeMap::new()),
        };
        assert!(is_metric_name(name), "bad sample name: {line}");
        let (family, kind) = family
            .as_ref()
            .unwrap_or_else(|| panic!("a sample before any # TYPE: {line}"));
        let suffixes: &[&str] = match kind.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            _ => &[""],
        };
        assert!(
            suffixes
                .iter()
                .any(|s| name.strip_suffix(s) == Some(family.as_str())),
            "sample {name} outside its family {family}: {line}"
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Scrape(samples)
}

async fn scrape(balancer: &Balancer) -> Scrape {
    let admin = balancer.admin_addr().expect("the admin listener runs");
    let answer = support::client::exchange(
        admin,
        "GET",
        "/metrics",
        &admin.to_string(),
        &[("accept", "application/openmetrics-text; version=1.0.0")],
    )
    .await;
    let (status, content_type, body) = (
        answer.status,
        answer.content_type().to_owned(),
        answer.text(),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    parse(&body)
}

#[tokio::test]
async fn scrape_counts_requests_and_probes_and_shows_a_down_backend() {
    const POOL: &str = "metrics_probes";
    let b = backends(&["a", "b"]).await;
    let checks = format!(
        "[pools.{POOL}.active]\ninterval = \"30ms\"\ntimeout = \"100ms\"\nrise = 2\nfall = 3\n"
    );
    let (balancer, mut rx) = start(&config_text(POOL, &b, "", &checks)).await;
    let proxy = balancer.local_addrs()[0];
    const SENT: usize = 20;
    for _ in 0..SENT {
        assert_eq!(exchange(proxy, "GET", "/").await.0, 200);
    }
    b[1].set_health(Mode::Status(503));
    wait_for(&mut rx, "b DOWN", |e| went(e, "b", State::Down)).await;

    let m = scrape(&balancer).await;
    let pool = ("pool", POOL);
    let ok = m.sum("capataz_requests_total", &[pool, ("class", "2xx")]);
    assert!(ok >= SENT as f64, "2xx requests {ok} < {SENT}");
    for class in ["1xx", "3xx", "4xx", "5xx", "error"] {
        assert_eq!(
            m.sum("capataz_requests_total", &[pool, ("class", class)]),
            0.0
        );
    }
    // One latency histogram for the pool, timing the answers of both backends.
    let ok_a = m.value(
        "capataz_requests_total",
        &[pool, ("backend", "a"), ("class", "2xx")],
    );
    assert!(
        ok_a >= 1.0 && ok_a < ok,
        "round robin used both: a {ok_a} of {ok}"
    );
    assert_eq!(
        m.value("capataz_upstream_response_seconds_count", &[pool]),
        ok,
        "every answer of a and b is timed in the pool's histogram"
    );
    assert_eq!(
        m.value(
            "capataz_upstream_response_seconds_bucket",
            &[pool, ("le", "+Inf")]
        ),
        ok
    );
    assert_eq!(
        m.matching("capataz_upstream_response_seconds_bucket", &[pool])
            .count(),
        16,
        "15 bounds and +Inf, once for the pool"
    );
    for histogram in ["upstream_response", "probe_duration"] {
        let name = format!("capataz_{histogram}_seconds_count");
        assert!(
            m.matching(&name, &[pool])
                .all(|s| !s.labels.contains_key("backend")),
            "{name} is per pool by default"
        );
    }

    assert_eq!(
        m.value("capataz_backend_up", &[pool, ("backend", "a")]),
        1.0
    );
    assert_eq!(
        m.value("capataz_backend_up", &[pool, ("backend", "b")]),
        0.0
    );
    assert_eq!(m.value("capataz_pool_healthy_backends", &[pool]), 1.0);
    assert_eq!(m.value("capataz_pool_all_down", &[pool]), 0.0);
    assert_eq!(
        m.value("capataz_backend_in_flight", &[pool, ("backend", "a")]),
        0.0
    );
    assert_eq!(
        m.value(
            "capataz_backend_effective_weight",
            &[pool, ("backend", "a")]
        ),
        1.0
    );
    // Without fast_interval and down_interval, every state probes at `interval`.
    let interval = m.value(
        "capataz_backend_probe_interval_seconds",
        &[pool, ("backend", "b")],
    );
    assert_eq!(interval, 0.03);

    let b_fail = m.value(
        "capataz_probes_total",
        &[pool, ("backend", "b"), ("result", "fail")],
    );
    assert!(b_fail >= 3.0, "b failed {b_fail} probes, fall is 3");
    let a_pass = m.value(
        "capataz_probes_total",
        &[pool, ("backend", "a"), ("result", "pass")],
    );
    assert!(a_pass >= 1.0);
    assert_eq!(
        m.value("capataz_probe_duration_seconds_count", &[pool]),
        m.sum("capataz_probes_total", &[pool]),
        "every probe of a and b is timed in the pool's histogram"
    );
    assert_eq!(
        m.value(
            "capataz_transitions_total",
            &[pool, ("backend", "b"), ("to", "down")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "capataz_transitions_total",
            &[pool, ("backend", "a"), ("to", "down")]
        ),
        0.0
    );
    // Probes took b out, not traffic.
    assert_eq!(
        m.value("capataz_ejections_total", &[pool, ("backend", "b")]),
        0.0
    );
    assert_eq!(m.sum("capataz_rejected_total", &[pool]), 0.0);
}

#[tokio::test]
async fn scrape_counts_errors_retries_ejections_and_rejections() {
    const POOL: &str = "metrics_passive";
    let b = backends(&["a", "b"]).await;
    let extra = format!(
        "when_all_down = \"reject\"\n\n[pools.{POOL}.active]\nkind = \"none\"\n\n\
         [pools.{POOL}.passive]\nconsecutive_errors = 2\n"
    );
    let (balancer, mut rx) = start(&config_text(POOL, &b, "", &extra)).await;
    let proxy = balancer.local_addrs()[0];
    b[0].crash();
    // Each request that tries a first is refused there and retried on b.
    for _ in 0..6 {
        assert_eq!(exchange(proxy, "GET", "/").await.0, 200);
    }
    wait_for(&mut rx, "a ejected", |e| went(e, "a", State::Down)).await;

    let admin = balancer.admin_addr().unwrap();
    let (status, _, body) = exchange(admin, "POST", &format!("/backends/{POOL}/b/down")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(exchange(proxy, "GET", "/").await.0, 503);

    let m = scrape(&balancer).await;
    let pool = ("pool", POOL);
    let a = ("backend", "a");
    assert_eq!(
        m.value("capataz_requests_total", &[pool, a, ("class", "error")]),
        2.0
    );
    assert_eq!(m.value("capataz_retries_total", &[pool]), 2.0);
    assert_eq!(
        m.value(
            "capataz_requests_total",
            &[pool, ("backend", "b"), ("class", "2xx")]
        ),
        6.0
    );
    // Only b's answers are timed: a's attempts got none.
    assert_eq!(
        m.value("capataz_upstream_response_seconds_count", &[pool]),
        6.0
    );
    assert_eq!(m.value("capataz_ejections_total", &[pool, a]), 1.0);
    assert_eq!(
        m.value("capataz_transitions_total", &[pool, a, ("to", "down")]),
        1.0
    );
    // A manual override is not a verdict change.
    assert_eq!(
        m.value(
            "capataz_transitions_total",
            &[pool, ("backend", "b"), ("to", "down")]
        ),
        0.0
    );
    assert_eq!(m.value("capataz_rejected_total", &[pool]), 1.0);
    assert_eq!(m.value("capataz_pool_all_down", &[pool]), 1.0);
    assert_eq!(m.value("capataz_pool_healthy_backends", &[pool]), 0.0);
    assert_eq!(
        m.value("capataz_backend_up", &[pool, ("backend", "b")]),
        0.0
    );
    assert_eq!(
        m.sum("capataz_probes_total", &[pool]),
        0.0,
        "probes are off"
    );
}

#[tokio::test]
async fn scrape_exports_alert_counters_when_hooks_run() {
    const POOL: &str = "metrics_alerts";
    let b = backends(&["a", "b"]).await;
    let extra = format!(
        "[pools.{POOL}.active]\nkind = \"none\"\n\n[[alerts.commands]]\ncommand = [\"true\"]\n"
    );
    let (balancer, _rx) = start(&config_text(POOL, &b, "", &extra)).await;
    let m = scrape(&balancer).await;
    assert_eq!(
        m.value("capataz_alerts_delivered_total", &[("hook", "command")]),
        0.0
    );

    let admin = balancer.admin_addr().unwrap();
    let (status, _, body) = exchange(admin, "POST", &format!("/backends/{POOL}/a/drain")).await;
    assert_eq!(status, 200, "{body}");
    let m = until_ok("a delivered alert", EVERY, async || {
        let m = scrape(&balancer).await;
        match m.value("capataz_alerts_delivered_total", &[("hook", "command")]) {
            delivered if delivered >= 1.0 => Ok(m),
            _ => Err("none delivered".to_owned()),
        }
    })
    .await;
    for counter in ["failed", "dropped", "suppressed"] {
        let name = format!("capataz_alerts_{counter}_total");
        assert_eq!(m.value(&name, &[("hook", "command")]), 0.0, "{name}");
    }
    assert_eq!(
        m.value("capataz_alerts_delivered_total", &[("hook", "webhook")]),
        0.0
    );
    assert_eq!(
        m.value("capataz_backend_up", &[("pool", POOL), ("backend", "a")]),
        0.0
    );
}

#[tokio::test]
async fn scrape_without_hooks_has_no_alert_families() {
    const POOL: &str = "metrics_no_alerts";
    let b = backends(&["a"]).await;
    let extra = format!("[pools.{POOL}.active]\nkind = \"none\"\n");
    let (balancer, _rx) = start(&config_text(POOL, &b, "", &extra)).await;
    let m = scrape(&balancer).await;
    assert!(m.0.iter().all(|s| !s.name.starts_with("capataz_alerts_")));
    assert_eq!(
        m.value("capataz_backend_up", &[("pool", POOL), ("backend", "a")]),
        1.0
    );
}

#[tokio::test]
async fn scrape_with_backend_histograms_labels_each_backend() {
    const POOL: &str = "metrics_backend_histograms";
    let b = backends(&["a", "b"]).await;
    let checks = format!("[pools.{POOL}.active]\ninterval = \"30ms\"\ntimeout = \"100ms\"\n");
    let text = config_text(POOL, &b, "metrics_backend_histograms = true", &checks);
    let (balancer, _rx) = start(&text).await;
    let proxy = balancer.local_addrs()[0];
    for _ in 0..10 {
        assert_eq!(exchange(proxy, "GET", "/").await.0, 200);
    }
    let pool = ("pool", POOL);
    // Probes run on their own clock: wait until each backend has had one.
    let m = until_ok("a probe of both backends", EVERY, async || {
        let m = scrape(&balancer).await;
        let probed = |backend| {
            m.value(
                "capataz_probe_duration_seconds_count",
                &[pool, ("backend", backend)],
            ) >= 1.0
        };
        match probed("a") && probed("b") {
            true => Ok(m),
            false => Err("not both probed".to_owned()),
        }
    })
    .await;
    for backend in ["a", "b"] {
        let labels = [pool, ("backend", backend)];
        let answered = m.value(
            "capataz_requests_total",
            &[pool, ("backend", backend), ("class", "2xx")],
        );
        assert!(answered >= 1.0, "round robin sent {backend} nothing");
        assert_eq!(
            m.value("capataz_upstream_response_seconds_count", &labels),
            answered,
            "{backend}'s answers are timed in its own histogram"
        );
        assert_eq!(
            m.matching("capataz_upstream_response_seconds_bucket", &labels)
                .count(),
            16
        );
    }
    // No per-pool series beside them: a sum over backends counts each answer once.
    for histogram in ["upstream_response", "probe_duration"] {
        for suffix in ["bucket", "count", "sum"] {
            let name = format!("capataz_{histogram}_seconds_{suffix}");
            assert!(
                m.matching(&name, &[pool])
                    .all(|s| s.labels.contains_key("backend")),
                "{name} without a backend label"
            );
        }
    }
    assert_eq!(
        m.sum("capataz_upstream_response_seconds_count", &[pool]),
        10.0
    );
}

#[tokio::test]
async fn a_reload_keeps_the_histogram_scope_it_started_with() {
    const POOL: &str = "metrics_reload_scope";
    let b = backends(&["a"]).await;
    let extra = format!("[pools.{POOL}.active]\nkind = \"none\"\n");
    let (balancer, _rx) = start(&config_text(POOL, &b, "", &extra)).await;
    let on = config_text(POOL, &b, "metrics_backend_histograms = true", &extra);
    let on = config::parse_str(&on, "<test>").expect("valid test config");
    balancer.reload(&on).await.expect("reload");
    let proxy = balancer.local_addrs()[0];
    assert_eq!(exchange(proxy, "GET", "/").await.0, 200);

    // The pool's histogram goes on counting; no per-backend one appears beside it.
    let m = scrape(&balancer).await;
    let pool = ("pool", POOL);
    assert_eq!(
        m.value("capataz_upstream_response_seconds_count", &[pool]),
        1.0
    );
    assert!(m
        .matching("capataz_upstream_response_seconds_count", &[pool])
        .all(|s| !s.labels.contains_key("backend")));
}

/// The sample line of `series` (a name and its labels, as written), if the scrape has one.
fn sample_line<'a>(scrape: &'a str, series: &str) -> Option<&'a str> {
    scrape
        .lines()
        .find(|line| line.rsplit_once(' ').is_some_and(|(s, _)| s == series))
}

async fn scrape_text(balancer: &Balancer) -> String {
    let admin = balancer.admin_addr().expect("the admin listener runs");
    let (status, _, body) = exchange(admin, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Regression: every balancer kept its counters in one process-wide registry, so a
/// second balancer with the same pool and backend names reported the first one's traffic.
#[tokio::test]
async fn two_balancers_in_one_process_never_share_counters() {
    let b = backends(&["a"]).await;
    // Same pool and backend names in both, and the same backend behind them.
    let text = config_text("web", &b, "", "[pools.web.active]\nkind = \"none\"\n");
    let (busy, _rx_busy) = start(&text).await;
    let (idle, _rx_idle) = start(&text).await;
    const SENT: usize = 5;
    let proxy = busy.local_addrs()[0];
    for _ in 0..SENT {
        assert_eq!(exchange(proxy, "GET", "/").await.0, 200);
    }
    let requests = "capataz_requests_total{pool=\"web\",backend=\"a\",class=\"2xx\"}";
    let timed = "capataz_upstream_response_seconds_count{pool=\"web\"}";
    let busy_page = scrape_text(&busy).await;
    assert_eq!(
        sample_line(&busy_page, requests),
        Some(format!("{requests} {SENT}").as_str()),
        "{busy_page}"
    );
    assert_eq!(
        sample_line(&busy_page, timed),
        Some(format!("{timed} {SENT}").as_str()),
        "{busy_page}"
    );
    let idle_page = scrape_text(&idle).await;
    assert_eq!(
        sample_line(&idle_page, requests),
        Some(format!("{requests} 0").as_str()),
        "{idle_page}"
    );
    assert_eq!(
        sample_line(&idle_page, timed),
        Some(format!("{timed} 0").as_str()),
        "{idle_page}"
    );
    // Same families, same lines, whichever balancer: only the values differ. (Series within
    // a family come in hash order, so compare them sorted. A client request's series appears
    // with its first request: the idle balancer had none.)
    let shape = |page: &str| -> Vec<String> {
        let mut lines: Vec<String> = page
            .lines()
            .filter(|l| !l.contains("capataz_client_requests_total"))
            .map(|l| match l.strip_prefix('#') {
                Some(_) => l.to_owned(),
                None => l.rsplit_once(' ').map_or(l, |(s, _)| s).to_owned(),
            })
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(shape(&busy_page), shape(&idle_page));
}
