//! Unit tests of the families and handles: label sets, bucket bounds, rebuilds, scopes, and
//! two registries sharing nothing.

use std::sync::atomic::Ordering;
use std::time::Duration;

use capataz_health::ProbeResult;
use prometheus_client::encoding::text;

use super::handles::{class_index, CLASSES};
use super::*;

/// Families registered into a registry of their own.
fn families(scope: HistogramScope) -> (Registry, Families) {
    let mut registry = Registry::default();
    let families = Families::register(&mut registry, scope);
    (registry, families)
}

#[test]
fn classes() {
    assert_eq!(CLASSES[class_index(101)], "1xx");
    assert_eq!(CLASSES[class_index(200)], "2xx");
    assert_eq!(CLASSES[class_index(304)], "3xx");
    assert_eq!(CLASSES[class_index(404)], "4xx");
    assert_eq!(CLASSES[class_index(599)], "5xx");
    assert_eq!(CLASSES[class_index(600)], "error");
    assert_eq!(CLASSES[class_index(99)], "error");
}

#[test]
fn histogram_buckets_are_inclusive_and_cumulative() {
    let h = latency_histogram();
    h.observe(0.0005); // exactly on the first bound
    h.observe(0.000501);
    h.observe(60.0); // past the last bound
    let mut registry = Registry::default();
    registry.register_with_unit("t", "test", Unit::Seconds, h);
    let mut out = String::new();
    text::encode(&mut out, &registry).unwrap();
    assert!(out.contains("t_seconds_count 3\n"), "{out}");
    assert!(out.contains("t_seconds_bucket{le=\"0.0005\"} 1\n"), "{out}");
    assert!(out.contains("t_seconds_bucket{le=\"0.001\"} 2\n"), "{out}");
    assert!(out.contains("t_seconds_bucket{le=\"30.0\"} 2\n"), "{out}");
    assert!(out.contains("t_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
    assert!(out.ends_with("# EOF\n"));
}

/// The lines of `registry` that mention `pool` and start with `name`.
fn lines(registry: &Registry, name: &str, pool: &str) -> Vec<String> {
    let mut out = String::new();
    text::encode_registry(&mut out, registry).unwrap();
    let pool = format!("pool=\"{pool}\"");
    out.lines()
        .filter(|l| l.starts_with(name) && l.contains(&pool))
        .map(str::to_owned)
        .collect()
}

#[test]
fn handles_survive_a_rebuild() {
    let (registry, families) = families(HistogramScope::Pool);
    let pool = families.pool("metrics_unit_pool");
    let first = pool.backend(&"a".into());
    first.answered(200, Duration::from_millis(1));
    first.unanswered();
    let again = families.pool("metrics_unit_pool").backend(&"a".into());
    again.answered(204, Duration::from_millis(1));
    assert_eq!(again.counts.requests[1].load(Ordering::Relaxed), 2);
    assert_eq!(again.counts.requests[5].load(Ordering::Relaxed), 1);
    pool.retry();
    pool.reject();
    let rebuilt = families.pool("metrics_unit_pool");
    assert_eq!(rebuilt.retries.get(), 1);
    assert_eq!(
        lines(
            &registry,
            "capataz_upstream_response_seconds_count",
            "metrics_unit_pool"
        ),
        ["capataz_upstream_response_seconds_count{pool=\"metrics_unit_pool\"} 2"]
    );
}

#[test]
fn pool_histograms_count_every_backend_of_the_pool() {
    let (registry, families) = families(HistogramScope::Pool);
    let pool = families.pool("metrics_unit_shared");
    let (a, b) = (pool.backend(&"a".into()), pool.backend(&"b".into()));
    a.answered(200, Duration::from_micros(300));
    b.answered(503, Duration::from_millis(20));
    b.answered(200, Duration::from_millis(20));
    a.unanswered(); // not timed: no answer came
    a.probe(ProbeResult::Pass, Duration::from_millis(2));
    b.probe(ProbeResult::Fail, Duration::from_secs(1));
    let counts = |name: &str| lines(&registry, name, "metrics_unit_shared");
    assert_eq!(
        counts("capataz_upstream_response_seconds_count"),
        ["capataz_upstream_response_seconds_count{pool=\"metrics_unit_shared\"} 3"]
    );
    assert_eq!(
        counts("capataz_probe_duration_seconds_count"),
        ["capataz_probe_duration_seconds_count{pool=\"metrics_unit_shared\"} 2"]
    );
    let buckets = counts("capataz_upstream_response_seconds_bucket");
    assert_eq!(buckets.len(), BUCKETS.len() + 1, "{buckets:?}");
    assert!(buckets.contains(
        &"capataz_upstream_response_seconds_bucket{le=\"0.0005\",pool=\"metrics_unit_shared\"} 1"
            .to_owned()
    ));
    assert!(buckets.contains(
        &"capataz_upstream_response_seconds_bucket{le=\"0.025\",pool=\"metrics_unit_shared\"} 3"
            .to_owned()
    ));
    // Counters stay per backend.
    assert_eq!(
        counts("capataz_requests_total")
            .iter()
            .filter(|l| l.contains("backend=\"b\"") && l.ends_with(" 1"))
            .count(),
        2,
        "b: one 2xx, one 5xx"
    );
}

#[test]
fn backend_histograms_carry_the_backend_label() {
    let (registry, families) = families(HistogramScope::Backend);
    let pool = families.pool("metrics_unit_own");
    let (a, b) = (pool.backend(&"a".into()), pool.backend(&"b".into()));
    a.answered(200, Duration::from_millis(1));
    b.answered(200, Duration::from_millis(1));
    b.answered(200, Duration::from_millis(1));
    b.probe(ProbeResult::Pass, Duration::from_millis(1));
    let mut counts = lines(
        &registry,
        "capataz_upstream_response_seconds_count",
        "metrics_unit_own",
    );
    counts.sort();
    assert_eq!(
        counts,
        [
            "capataz_upstream_response_seconds_count{pool=\"metrics_unit_own\",backend=\"a\"} 1",
            "capataz_upstream_response_seconds_count{pool=\"metrics_unit_own\",backend=\"b\"} 2",
        ]
    );
    let mut probes = lines(
        &registry,
        "capataz_probe_duration_seconds_count",
        "metrics_unit_own",
    );
    probes.sort();
    assert_eq!(
        probes,
        [
            "capataz_probe_duration_seconds_count{pool=\"metrics_unit_own\",backend=\"a\"} 0",
            "capataz_probe_duration_seconds_count{pool=\"metrics_unit_own\",backend=\"b\"} 1",
        ]
    );
}

#[test]
fn families_of_two_registries_share_no_counter() {
    let (first, one) = families(HistogramScope::Pool);
    let (second, two) = families(HistogramScope::Pool);
    one.pool("p")
        .backend(&"a".into())
        .answered(200, Duration::from_millis(1));
    one.pool("p").retry();
    let _idle = two.pool("p").backend(&"a".into());
    let count = |registry: &Registry, name: &str| lines(registry, name, "p");
    assert_eq!(
        count(
            &first,
            "capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"}"
        ),
        ["capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"} 1"]
    );
    assert_eq!(
        count(
            &second,
            "capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"}"
        ),
        ["capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"} 0"]
    );
    assert_eq!(two.pool("p").retries.get(), 0);
    assert_eq!(one.pool("p").retries.get(), 1);
}

#[test]
fn counters_of_backends_no_pool_holds_are_forgotten_as_new_ones_come() {
    let (registry, families) = families(HistogramScope::Backend);
    let pool = families.pool("metrics_unit_churn");
    let series = |registry: &Registry| {
        lines(registry, "capataz_requests_total", "metrics_unit_churn").len()
            + lines(
                registry,
                "capataz_upstream_response_seconds_count",
                "metrics_unit_churn",
            )
            .len()
    };
    // A source whose backends come and go under new names: 10,000 of them over time, at
    // most 10 alive at once.
    let mut alive = std::collections::VecDeque::new();
    for n in 0..10_000 {
        let backend = pool.backend(&format!("10.0.{}.{}:80", n / 256, n % 256).into());
        backend.answered(200, Duration::from_millis(1));
        alive.push_back(backend);
        if alive.len() > 10 {
            alive.pop_front();
        }
    }
    let held = alive.len();
    let shown = series(&registry);
    // Six request classes and one histogram count per backend shown; the map is swept when it
    // doubles, so at most twice the sweep floor of backends are shown.
    assert!(
        shown <= 7 * 2 * 64,
        "{shown} series for {held} live backends: removed backends' series are kept"
    );
    // The live ones keep theirs, with their counts.
    let last = alive.back().unwrap();
    assert_eq!(last.counts.requests[1].load(Ordering::Relaxed), 1);
    let again = pool.backend(&"10.0.39.15:80".into());
    assert_eq!(
        again.counts.requests[1].load(Ordering::Relaxed),
        1,
        "a live backend's counters are found again"
    );
}
