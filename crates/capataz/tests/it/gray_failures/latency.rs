//! A backend at ten times its pool's latency is ejected by the latency-outlier detector within
//! the configured windows, comes back on probation, and (still slow) is ejected again, for
//! longer; `/status` explains it with the percentiles.

use std::time::Duration;

use capataz::sim::Mode;
use capataz_health::{Reason, State};

use super::*;
use crate::support::balancer::backends;
use crate::support::events::transition_of;

const DETECTOR: &str = r#"
[pools.web.passive]
ejection_time = "1s"
max_ejection_time = "10s"

[pools.web.passive.latency_outliers]
enabled = true
percentile = "p50"
factor = 3
windows = 2
window = "300ms"
min_requests = 3
min_latency = "5ms"
"#;

#[tokio::test]
async fn a_backend_at_ten_times_the_latency_is_ejected_within_the_windows_and_readmitted_on_probation(
) {
    let b = backends(&["a", "b", "slow"]).await;
    b[0].set_traffic(Mode::Delay(Duration::from_millis(10), 200));
    b[1].set_traffic(Mode::Delay(Duration::from_millis(10), 200));
    b[2].set_traffic(Mode::Delay(Duration::from_millis(100), 200));
    let mut r = Running::start(&config(&b, DETECTOR), 6).await;

    let event = r
        .wait_for("slow ejected", |e| {
            transition_of(e, "slow", State::Down).is_some()
        })
        .await;
    let t = *transition_of(&event, "slow", State::Down).expect("the transition");
    let Reason::SlowTraffic {
        latency,
        median,
        windows,
        ejection: Some(ejection),
        ..
    } = t.reason
    else {
        panic!("not a latency ejection: {}", t.reason);
    };
    assert_eq!(windows, 2, "within the configured windows");
    assert_eq!(ejection.nth, 1);
    assert!(latency > median * 3, "{latency:?} against {median:?}");
    assert!(
        t.reason.to_string().contains(" against a pool median of "),
        "{}",
        t.reason
    );
    let explain = r.backend("slow").await["explain"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        explain.contains("a latency outlier: p50 ") && explain.contains("over the last 2 windows"),
        "{explain}"
    );
    assert!(r
        .metrics()
        .await
        .contains("capataz_ejections_total{pool=\"web\",backend=\"slow\"} 1"));

    let event = r
        .wait_for("slow back on probation", |e| {
            transition_of(e, "slow", State::Up).is_some()
        })
        .await;
    let back = transition_of(&event, "slow", State::Up).expect("the transition");
    assert!(
        matches!(back.reason, Reason::EjectionExpired { nth: 1, .. }),
        "{}",
        back.reason
    );

    // Still slow: ejected again, for longer.
    let event = r
        .wait_for("slow ejected again", |e| {
            transition_of(e, "slow", State::Down).is_some()
        })
        .await;
    match transition_of(&event, "slow", State::Down).map(|t| t.reason) {
        Some(Reason::SlowTraffic {
            ejection: Some(e), ..
        }) => assert_eq!((e.nth, e.duration), (2, Duration::from_secs(2))),
        other => panic!("unexpected {other:?}"),
    }
    // The fast backends were never judged outliers.
    r.stop().await;
}
