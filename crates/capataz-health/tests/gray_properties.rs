//! Properties of the gray-failure detectors together (proptest): random sequences of probes,
//! traffic, latency windows, success-rate windows, load-shedding answers and time passing,
//! with the latency-outlier, success-rate and load-shedding detectors on and random
//! thresholds. Whatever happens:
//!
//! - the engine never panics;
//! - it never empties the pool by itself: with the balancer's default `fail_open` policy and no
//!   operator input, some backend always gets traffic, with a weight of at least one tenth;
//! - ejections stay within the cap (`max_ejected_percent`, at least one backend, none at 0),
//!   counted over every ejection whatever its detector, and the pool's count is the truth.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::{
    EjectionPolicy, Join, LatencyOutliers, LatencyWindow, LoadShedding, Outcome, Percentile,
    Policy, Rotation, Settings, State, SuccessRate, SuccessWindow,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Input {
    Probe(usize, Outcome),
    Traffic(usize, Outcome),
    Latency(Vec<LatencyWindow>),
    Success(Vec<SuccessWindow>),
    Shed(usize, u16, Duration),
    Wait,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        6 => (100u16..=599).prop_map(Outcome::Status),
        1 => Just(Outcome::Timeout),
        1 => Just(Outcome::Refused),
        1 => Just(Outcome::Reset),
        1 => Just(Outcome::Malformed),
    ]
}

fn latency_window() -> impl Strategy<Value = LatencyWindow> {
    (0u64..60, 0u64..2_000_000, 0u64..4).prop_map(|(requests, p50_us, spread)| LatencyWindow {
        requests,
        p50: Duration::from_micros(p50_us),
        p99: Duration::from_micros(p50_us.saturating_mul(1 + spread * 5)),
    })
}

fn success_window() -> impl Strategy<Value = SuccessWindow> {
    (0u64..200, 0u64..200).prop_map(|(requests, errors)| SuccessWindow {
        requests,
        errors: errors.min(requests),
    })
}

fn input(n: usize) -> impl Strategy<Value = Input> {
    prop_oneof![
        4 => (0..n, outcome()).prop_map(|(b, o)| Input::Probe(b, o)),
        4 => (0..n, outcome()).prop_map(|(b, o)| Input::Traffic(b, o)),
        2 => prop::collection::vec(latency_window(), n).prop_map(Input::Latency),
        2 => prop::collection::vec(success_window(), n).prop_map(Input::Success),
        1 => (0..n, prop_oneof![Just(429u16), Just(503u16)], 0u64..120_000)
            .prop_map(|(b, s, ms)| Input::Shed(b, s, Duration::from_millis(ms))),
        1 => Just(Input::Wait),
    ]
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        (1u32..4, 1u32..4, 1u32..5),
        0u8..=100,
        (2u32..10, 1u32..4, 0u32..30, 0u64..20),
        (1u32..50, 1u32..6, 0u32..4000),
        any::<bool>(),
    )
        .prop_map(
            |((rise, fall, errors), pct, (factor, windows, min_req, min_ms), rate, p99)| Settings {
                rise: NonZeroU32::new(rise).unwrap(),
                fall: NonZeroU32::new(fall).unwrap(),
                consecutive_errors: NonZeroU32::new(errors).unwrap(),
                ejection: Some(EjectionPolicy {
                    base: Duration::from_secs(1),
                    max: Duration::from_secs(10),
                }),
                max_ejected_percent: pct,
                latency_outliers: Some(LatencyOutliers {
                    percentile: if p99 {
                        Percentile::P99
                    } else {
                        Percentile::P50
                    },
                    factor: NonZeroU32::new(factor).unwrap(),
                    windows: NonZeroU32::new(windows).unwrap(),
                    min_requests: min_req,
                    min_latency: Duration::from_millis(min_ms),
                }),
                success_rate: Some(SuccessRate {
                    min_requests: rate.0,
                    min_backends: rate.1,
                    stdev_factor_milli: rate.2,
                }),
                ..Settings::default()
            },
        )
}

fn scenario() -> impl Strategy<Value = (Settings, u8, usize, Vec<(u64, Input)>)> {
    (1usize..7, settings(), 1u8..=100).prop_flat_map(|(n, settings, weight_percent)| {
        (
            Just(settings),
            Just(weight_percent),
            Just(n),
            prop::collection::vec((0u64..3_000, input(n)), 1..120),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_detectors_never_empty_the_pool_nor_exceed_the_cap(
        (settings, weight_percent, n, inputs) in scenario()
    ) {
        let policy = Policy {
            load_shedding: Some(LoadShedding {
                weight_percent,
                max: Duration::from_secs(60),
                default_relief: Duration::from_secs(5),
            }),
            ..Policy::default()
        };
        let join = Join::New { initial: State::Up, warm_up: false };
        let mut now = Duration::ZERO;
        let mut rotation = Rotation::new(settings, policy, (0..n).map(|_| (1, join)), now);
        let cap = match settings.max_ejected_percent {
            0 => 0,
            pct => (n * usize::from(pct) / 100).max(1),
        };
        for (after, input) in inputs {
            now += Duration::from_millis(after);
            match input {
                Input::Probe(b, o) => {
                    rotation.handle_probe(b, o, now);
                }
                Input::Traffic(b, o) => {
                    rotation.handle_traffic(b, o, now);
                }
                Input::Latency(windows) => rotation.handle_latency_window(&windows, now),
                Input::Success(windows) => rotation.handle_success_window(&windows, now),
                Input::Shed(b, status, relief) => {
                    prop_assert!(rotation.handle_shed(b, status, relief, now));
                }
                Input::Wait => rotation.handle_timeout(now),
            }
            while rotation.poll_event().is_some() {}
            let pool = rotation.pool();
            let ejected = pool.backends().iter().filter(|b| b.passive.is_ejected()).count();
            prop_assert_eq!(ejected, pool.ejected(), "the pool's count is the truth");
            prop_assert!(ejected <= cap, "{} ejected, cap {}", ejected, cap);
            let eligible = rotation.eligible(now);
            prop_assert!(!eligible.backends.is_empty(), "the engine emptied the pool");
            prop_assert!(eligible.weights.iter().all(|&w| w >= 1), "{:?}", eligible.weights);
        }
    }
}
