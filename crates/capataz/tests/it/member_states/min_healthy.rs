//! The minimum healthy share: with fewer primaries UP than `min_healthy`, the pool fails open.

use std::time::Duration;

use capataz::sim::Mode;
use capataz_health::AllDown;

use super::*;
use crate::support::balancer::backends;

#[tokio::test]
async fn the_pool_fails_open_at_its_minimum_healthy_share() {
    let b = backends(&["a", "b", "c", "d"]).await;
    let list: Vec<(&SimBackend, &str)> = b.iter().map(|s| (s, "")).collect();
    let mut r = Running::start(&config(&list, "min_healthy = 2", "")).await;
    for sim in &b[1..] {
        sim.set_health(Mode::Status(500));
    }
    let event = r
        .wait_for("the pool fails open below its share", |e| {
            matches!(
                e,
                Notice::AllDown {
                    policy: AllDown::BelowMinHealthy { .. },
                    ..
                }
            )
        })
        .await;
    assert!(
        event
            .sentence()
            .starts_with("pool=web has too few UP backends: failing open below its minimum healthy share: 1 of 4 primaries UP, needs 2 (min_healthy = 2)"),
        "{}",
        event.sentence()
    );
    // Every backend gets traffic again, the DOWN ones too.
    let seen = r.traffic(12).await;
    assert_eq!(seen.len(), 4, "{seen:?}");
    let pool = r.pool().await;
    assert_eq!(pool["all_down"], true);
    assert_eq!(pool["all_down_policy"], "fail_open");
    assert_eq!(pool["min_healthy"]["needed"], 2);
    assert!(
        pool["explain"]
            .as_str()
            .unwrap_or_default()
            .contains("(min_healthy = 2)"),
        "{pool}"
    );

    b[1].set_health(Mode::Status(200));
    r.wait_for("the pool recovers", |e| {
        matches!(e, Notice::Recovered { .. })
    })
    .await;
    let seen = r.traffic(12).await;
    let mut names: Vec<&String> = seen.keys().collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
    r.balancer.shutdown(Duration::from_secs(1)).await;
}
