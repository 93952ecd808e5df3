//! Maintenance: an override that also stops probes, after which the backend must pass `rise`
//! probes before it gets traffic again.

use std::time::Duration;

use capataz::sim::Mode;

use super::*;
use crate::support::balancer::backends;
use crate::support::wait::wait_until;

#[tokio::test]
async fn maintenance_stops_probes_and_requires_rise_passes_after() {
    let b = backends(&["a", "b"]).await;
    let text = config(
        &[(&b[0], ""), (&b[1], "")],
        "",
        "rise_after_maintenance = 3\n",
    );
    let mut r = Running::start(&text).await;
    wait_until("both probed", || {
        b[0].health_hits() > 0 && b[1].health_hits() > 0
    })
    .await;

    let (status, json) = r.admin("POST", "/backends/web/a/maintenance").await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["state"], "MAINTENANCE");
    assert_eq!(json["override"], "maintenance");
    // A probe of a may have been under way: count from the next probe of b on.
    let a_probes = b[0].health_hits();
    let b_probes = b[1].health_hits();
    wait_until("b probed ten more times", || {
        b[1].health_hits() >= b_probes + 10
    })
    .await;
    assert!(
        b[0].health_hits() <= a_probes + 1,
        "a was probed in maintenance: {} probes",
        b[0].health_hits() - a_probes
    );
    let status = r.backend("a").await;
    assert_eq!(status["state"], "MAINTENANCE");
    let explain = status["explain"].as_str().unwrap_or_default().to_owned();
    assert!(explain.starts_with("MAINTENANCE since "), "{explain}");
    assert!(
        explain.contains("no probes; on leaving it, it needs 3 passing probes in a row"),
        "{explain}"
    );
    assert_eq!(r.traffic(6).await.get("b"), Some(&6));

    // Leaving maintenance with a failing health route: requalifying, no traffic.
    b[0].set_health(Mode::Status(500));
    let (status, json) = r.admin("POST", "/backends/web/a/clear").await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["state"], "REQUALIFYING");
    let since_clear = b[0].health_hits();
    wait_until("a probed again", || b[0].health_hits() >= since_clear + 2).await;
    let status = r.backend("a").await;
    assert_eq!(status["state"], "REQUALIFYING");
    assert_eq!(status["requalify"]["needs"], 3);
    assert!(
        status["explain"]
            .as_str()
            .unwrap_or_default()
            .starts_with("REQUALIFYING: back from maintenance, needs 3 passing probes in a row"),
        "{status}"
    );
    assert_eq!(r.traffic(6).await.get("b"), Some(&6));

    // Passing probes requalify it after three in a row.
    let before = b[0].health_hits();
    b[0].set_health(Mode::Status(200));
    let event = r
        .wait_for("a requalified", |e| eligibility_to(e, "a", "UP").is_some())
        .await;
    assert!(
        event
            .sentence()
            .contains("3 passing probes in a row after maintenance"),
        "{}",
        event.sentence()
    );
    assert!(
        b[0].health_hits() >= before + 3,
        "requalified after {} probes",
        b[0].health_hits() - before
    );
    assert!(r.traffic(10).await.get("a").is_some_and(|&n| n > 0));
    r.balancer.shutdown(Duration::from_secs(1)).await;
}
