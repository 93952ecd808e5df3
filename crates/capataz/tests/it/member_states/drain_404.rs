//! `disable_on_404`: a `404` on the health route drains the backend (in-flight requests finish,
//! no new ones), and a passing probe brings it back at once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use capataz::sim::Mode;

use super::*;
use crate::support::balancer::backends;
use crate::support::wait::wait_until;

#[tokio::test]
async fn a_404_on_the_health_route_drains() {
    let b = backends(&["a", "b"]).await;
    let text = config(&[(&b[0], ""), (&b[1], "")], "", "disable_on_404 = true\n");
    let mut r = Running::start(&text).await;
    let pool = r.balancer.pool("web").expect("pool web");
    // One slow request in flight on each backend (round robin alternates first attempts).
    for sim in &b {
        sim.set_traffic(Mode::Delay(Duration::from_secs(3), 200));
    }
    let proxy = r.balancer.local_addrs()[0];
    let slow: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move { exchange(proxy, "GET", "/slow", "app.test", &[]).await })
        })
        .collect();
    wait_until("a request in flight on a", || {
        pool.backends[0].in_flight.load(Ordering::Relaxed) == 1
    })
    .await;

    b[0].set_health(Mode::Status(404));
    let event = r
        .wait_for("a drains itself", |e| {
            eligibility_to(e, "a", "SELF_DRAINING").is_some()
        })
        .await;
    assert!(
        eligibility_to(&event, "a", "SELF_DRAINING")
            .unwrap_or_default()
            .contains("answered HTTP 404"),
        "{}",
        event.sentence()
    );
    assert_eq!(
        pool.backends[0].in_flight.load(Ordering::Relaxed),
        1,
        "the request in flight was not cut"
    );
    let status = r.backend("a").await;
    assert_eq!(status["state"], "SELF_DRAINING");
    assert_eq!(status["verdict"], "UP", "drained, not taken DOWN");
    assert_eq!(status["active"]["fail_streak"], 0, "a 404 is not a failure");
    assert!(
        status["explain"]
            .as_str()
            .unwrap_or_default()
            .starts_with("SELF_DRAINING: UP since "),
        "{status}"
    );
    // New requests all go to b; the one in flight on a still completes.
    b[1].set_traffic(Mode::Status(200));
    let hits = b[0].traffic_hits();
    assert_eq!(r.traffic(10).await.get("b"), Some(&10));
    assert_eq!(
        b[0].traffic_hits(),
        hits,
        "a drained backend got a new request"
    );
    let mut served_by = Vec::new();
    for task in slow {
        let answer = task.await.expect("the slow request's task");
        assert_eq!(answer.status, 200);
        served_by.push(answer.backend.unwrap_or_default());
    }
    served_by.sort();
    assert_eq!(served_by, ["a", "b"]);

    // One passing probe readmits it: no rise of two.
    b[0].set_traffic(Mode::Status(200));
    let probes = b[0].health_hits();
    b[0].set_health(Mode::Status(200));
    let event = r
        .wait_for("a back", |e| eligibility_to(e, "a", "UP").is_some())
        .await;
    assert!(event.sentence().contains("a passing probe ends the drain"));
    assert!(
        b[0].health_hits() <= probes + 2,
        "more than one passing probe was needed ({} probes)",
        b[0].health_hits() - probes
    );
    assert!(r.traffic(10).await.get("a").is_some_and(|&n| n > 0));
    r.balancer.shutdown(Duration::from_secs(1)).await;
}
