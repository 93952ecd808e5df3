//! The latency-outlier detector on simulated time: a backend slower than `factor` times the
//! pool's median for `windows` judged windows is ejected with the timed-ejection rules, comes
//! back on probation, and is ejected again at once if still slow; thin windows judge nothing;
//! `min_latency` keeps microsecond noise from ejecting; the ejection cap holds.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::{
    Ejection, EjectionPolicy, LatencyOutliers, LatencyWindow, Outcome, Percentile, Pool, Reason,
    Settings, State, Transition,
};

const MS: Duration = Duration::from_millis(1);
const WINDOW: Duration = Duration::from_secs(10);

fn settings(max_ejected_percent: u8) -> Settings {
    Settings {
        ejection: Some(EjectionPolicy {
            base: Duration::from_secs(30),
            max: Duration::from_secs(300),
        }),
        max_ejected_percent,
        latency_outliers: Some(LatencyOutliers {
            percentile: Percentile::P99,
            factor: NonZeroU32::new(3).unwrap(),
            windows: NonZeroU32::new(3).unwrap(),
            min_requests: 20,
            min_latency: 5 * MS,
        }),
        ..Settings::default()
    }
}

fn w(requests: u64, p99_ms: u64) -> LatencyWindow {
    LatencyWindow {
        requests,
        p50: Duration::from_millis(p99_ms / 2),
        p99: Duration::from_millis(p99_ms),
    }
}

fn feed(pool: &mut Pool, windows: &[LatencyWindow], at: Duration) -> Vec<Transition> {
    let mut out = Vec::new();
    pool.latency_window(windows, at, &mut out);
    out
}

#[test]
fn a_backend_ten_times_slower_is_ejected_after_the_configured_windows_with_the_sentence() {
    let mut pool = Pool::new(settings(100), 3);
    let slow = [w(100, 38), w(100, 40), w(100, 412)];
    assert!(feed(&mut pool, &slow, WINDOW).is_empty());
    assert!(feed(&mut pool, &slow, 2 * WINDOW).is_empty());
    assert_eq!(pool.backend(2).passive.slow_windows, 2);
    let out = feed(&mut pool, &slow, 3 * WINDOW);
    assert_eq!(out.len(), 1);
    let t = out[0];
    assert_eq!((t.backend, t.from, t.to), (2, State::Up, State::Down));
    assert!(matches!(t.reason, Reason::SlowTraffic { windows: 3, .. }));
    assert_eq!(
        t.reason.to_string(),
        "p99 412 ms against a pool median of 40 ms over the last 3 windows; \
         ejected for 30 s (ejection #1)"
    );
    assert_eq!(pool.ejected(), 1);
}

#[test]
fn an_ejected_slow_backend_comes_back_on_probation_and_one_slow_window_ejects_it_again() {
    let mut pool = Pool::new(settings(100), 3);
    let slow = [w(100, 38), w(100, 40), w(100, 412)];
    for i in 1..=3 {
        feed(&mut pool, &slow, i * WINDOW);
    }
    // While ejected it relays nothing and is not judged.
    assert!(feed(&mut pool, &[w(100, 38), w(100, 40), w(0, 0)], 4 * WINDOW).is_empty());
    let mut out = Vec::new();
    pool.tick(3 * WINDOW + Duration::from_secs(30), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].to, State::Up);
    assert!(matches!(
        pool.backend(2).passive.ejection,
        Ejection::Probation { .. }
    ));
    let out = feed(&mut pool, &slow, 7 * WINDOW);
    assert_eq!(out.len(), 1, "one slow window on probation ejects again");
    match out[0].reason {
        Reason::SlowTraffic {
            windows: 1,
            ejection: Some(e),
            ..
        } => assert_eq!((e.nth, e.duration), (2, Duration::from_secs(60))),
        other => panic!("unexpected reason {other:?}"),
    }
}

#[test]
fn a_fast_window_on_probation_and_a_good_response_readmit_for_good() {
    let mut pool = Pool::new(settings(100), 3);
    let slow = [w(100, 38), w(100, 40), w(100, 412)];
    for i in 1..=3 {
        feed(&mut pool, &slow, i * WINDOW);
    }
    let mut out = Vec::new();
    pool.tick(Duration::from_secs(60), &mut out);
    let fast = [w(100, 38), w(100, 40), w(100, 41)];
    assert!(feed(&mut pool, &fast, Duration::from_secs(70)).is_empty());
    pool.observe(2, Outcome::Status(200), Duration::from_secs(71));
    assert_eq!(pool.backend(2).passive.ejection, Ejection::None);
    assert_eq!(pool.verdict(2), State::Up);
}

#[test]
fn a_window_after_two_slow_ones_keeps_or_restarts_their_count() {
    // (What backend 2's third window is, the slow windows counted after it, the ejections at
    // the fourth, slow again.)
    for (case, third, counted, ejected) in [
        (
            "a window with too few requests judges nothing and keeps the count",
            w(19, 412),
            2,
            1,
        ),
        ("a normal window starts the count again", w(100, 100), 0, 0),
    ] {
        let mut pool = Pool::new(settings(100), 3);
        let slow = [w(100, 38), w(100, 40), w(100, 412)];
        feed(&mut pool, &slow, WINDOW);
        feed(&mut pool, &slow, 2 * WINDOW);
        let after = feed(&mut pool, &[w(100, 38), w(100, 40), third], 3 * WINDOW);
        assert!(after.is_empty(), "{case}");
        assert_eq!(pool.backend(2).passive.slow_windows, counted, "{case}");
        assert_eq!(feed(&mut pool, &slow, 4 * WINDOW).len(), ejected, "{case}");
    }
}

#[test]
fn latencies_below_min_latency_never_eject_whatever_the_ratio() {
    let mut pool = Pool::new(settings(100), 3);
    let tiny = [
        LatencyWindow {
            requests: 100,
            p50: Duration::from_micros(50),
            p99: Duration::from_micros(100),
        },
        LatencyWindow {
            requests: 100,
            p50: Duration::from_micros(50),
            p99: Duration::from_micros(100),
        },
        LatencyWindow {
            requests: 100,
            p50: Duration::from_micros(2000),
            p99: Duration::from_micros(4000),
        },
    ];
    for i in 1..=10 {
        assert!(feed(&mut pool, &tiny, i * WINDOW).is_empty());
    }
}

#[test]
fn the_ejection_cap_holds_for_latency_ejections() {
    // 50 % of 3 backends: one at a time.
    let mut pool = Pool::new(settings(50), 3);
    let slow = [w(100, 40), w(100, 400), w(100, 412)];
    // The lower median of [40, 400, 412] is 400: nobody is 3x it. Two slow of four instead.
    let mut pool4 = Pool::new(settings(50), 4);
    let two_slow = [w(100, 38), w(100, 40), w(100, 400), w(100, 412)];
    let mut ejections = 0;
    for i in 1..=3 {
        ejections += feed(&mut pool4, &two_slow, i * WINDOW).len();
    }
    assert_eq!(ejections, 2, "50 % of 4 backends is 2");
    for i in 1..=5 {
        assert!(feed(&mut pool, &slow, i * WINDOW).is_empty());
    }
    let mut capped = Pool::new(settings(25), 4);
    let mut ejections = 0;
    for i in 1..=5 {
        ejections += feed(&mut capped, &two_slow, i * WINDOW).len();
    }
    assert_eq!(ejections, 1, "25 % of 4 backends is 1");
}

#[test]
fn p50_is_compared_when_configured() {
    let mut s = settings(100);
    s.latency_outliers.as_mut().unwrap().percentile = Percentile::P50;
    s.latency_outliers.as_mut().unwrap().windows = NonZeroU32::new(1).unwrap();
    let mut pool = Pool::new(s, 3);
    // p99 far out, p50 alike: no ejection.
    let tail = [
        LatencyWindow {
            requests: 100,
            p50: 20 * MS,
            p99: 40 * MS,
        },
        LatencyWindow {
            requests: 100,
            p50: 20 * MS,
            p99: 40 * MS,
        },
        LatencyWindow {
            requests: 100,
            p50: 21 * MS,
            p99: 900 * MS,
        },
    ];
    assert!(feed(&mut pool, &tail, WINDOW).is_empty());
    let out = feed(&mut pool, &[tail[0], tail[1], w(100, 400)], 2 * WINDOW);
    assert_eq!(out.len(), 1);
    assert!(out[0]
        .reason
        .to_string()
        .starts_with("p50 200 ms against a pool median of 20 ms over the last window"));
}

#[test]
fn without_the_detector_latency_windows_change_nothing() {
    let mut pool = Pool::new(Settings::default(), 3);
    let slow = [w(100, 38), w(100, 40), w(100, 412)];
    for i in 1..=10 {
        assert!(feed(&mut pool, &slow, i * WINDOW).is_empty());
    }
    assert_eq!(pool.backend(2).passive.slow_windows, 0);
}
