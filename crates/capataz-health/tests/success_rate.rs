//! The success-rate detector on simulated time: a backend with intermittent errors, never
//! `consecutive_errors` in a row, is ejected when its success rate falls below the pool's mean
//! minus `stdev_factor` standard deviations; too few judged backends judge nothing.

use std::time::Duration;

use capataz_health::{
    EjectionPolicy, Outcome, Pool, Reason, Settings, State, SuccessRate, SuccessWindow, Transition,
};

const WINDOW: Duration = Duration::from_secs(10);

fn settings(min_backends: u32) -> Settings {
    Settings {
        ejection: Some(EjectionPolicy {
            base: Duration::from_secs(30),
            max: Duration::from_secs(300),
        }),
        success_rate: Some(SuccessRate {
            min_requests: 20,
            min_backends,
            stdev_factor_milli: 1900,
        }),
        ..Settings::default()
    }
}

fn w(requests: u64, errors: u64) -> SuccessWindow {
    SuccessWindow { requests, errors }
}

fn feed(pool: &mut Pool, windows: &[SuccessWindow], at: Duration) -> Vec<Transition> {
    let mut out = Vec::new();
    pool.success_window(windows, at, &mut out);
    out
}

#[test]
fn a_backend_failing_one_request_in_five_is_ejected_though_it_never_makes_a_streak() {
    let mut pool = Pool::new(settings(5), 5);
    // Its traffic, one error in five: consecutive_errors = 3 never fires.
    for i in 0..100u64 {
        let outcome = if i % 5 == 4 {
            Outcome::Status(500)
        } else {
            Outcome::Status(200)
        };
        let (_, t) = pool.observe(4, outcome, Duration::from_millis(i));
        assert!(t.is_none());
    }
    let windows = [w(100, 0), w(100, 0), w(100, 0), w(100, 0), w(100, 20)];
    let out = feed(&mut pool, &windows, WINDOW);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].backend, out[0].to), (4, State::Down));
    assert_eq!(
        out[0].reason.to_string(),
        "success rate 80.0 % against a pool mean of 96.0 % (outliers below 80.8 %) over the \
         last window; ejected for 30 s (ejection #1)"
    );
    assert!(matches!(out[0].reason, Reason::ErrorRate { .. }));
}

#[test]
fn fewer_judged_backends_than_min_backends_judge_nothing() {
    let mut pool = Pool::new(settings(5), 5);
    // One backend below min_requests: four judged.
    let windows = [w(100, 0), w(100, 0), w(100, 0), w(19, 0), w(100, 50)];
    assert!(feed(&mut pool, &windows, WINDOW).is_empty());
    let mut small = Pool::new(settings(5), 4);
    assert!(feed(&mut small, &windows[..4], WINDOW).is_empty());
}

#[test]
fn alike_error_rates_eject_nobody() {
    let mut pool = Pool::new(settings(5), 5);
    let windows = [w(100, 10), w(100, 10), w(100, 11), w(100, 9), w(100, 10)];
    for i in 1..=5 {
        assert!(feed(&mut pool, &windows, i * WINDOW).is_empty());
    }
    let perfect = [w(100, 0); 5];
    assert!(
        feed(&mut pool, &perfect, 6 * WINDOW).is_empty(),
        "no spread at all"
    );
}

#[test]
fn an_ejected_backend_comes_back_on_probation_and_one_error_ejects_it_again() {
    let mut pool = Pool::new(settings(5), 5);
    let windows = [w(100, 0), w(100, 0), w(100, 0), w(100, 0), w(100, 20)];
    feed(&mut pool, &windows, WINDOW);
    let mut out = Vec::new();
    pool.tick(WINDOW + Duration::from_secs(30), &mut out);
    assert_eq!(out[0].to, State::Up);
    let (_, t) = pool.observe(4, Outcome::Status(500), WINDOW + Duration::from_secs(31));
    let t = t.expect("ejected again");
    assert!(matches!(t.reason, Reason::ProbationFailed { ejection, .. } if ejection.nth == 2));
}

#[test]
fn the_cap_holds_for_success_rate_ejections() {
    let mut s = settings(5);
    s.max_ejected_percent = 10; // one of ten
    let mut pool = Pool::new(s, 10);
    // Two backends failing everything are both outliers (mean 80 %, stdev 40 %: below 4 %).
    let mut windows = [w(100, 0); 10];
    windows[3] = w(100, 100);
    windows[7] = w(100, 100);
    let out = feed(&mut pool, &windows, WINDOW);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].backend, 3);
    let mut uncapped = Pool::new(settings(5), 10);
    assert_eq!(feed(&mut uncapped, &windows, WINDOW).len(), 2);
}

#[test]
fn without_the_detector_windows_change_nothing() {
    let mut pool = Pool::new(Settings::default(), 5);
    let windows = [w(100, 0), w(100, 0), w(100, 0), w(100, 0), w(100, 90)];
    assert!(feed(&mut pool, &windows, WINDOW).is_empty());
}
