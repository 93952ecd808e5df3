//! Who serves and what is in flight, as `/status`, the metrics and the events say it, against
//! where the requests land: the backups in use and the all-down policy (said three ways, then
//! windows of traffic), and the in-flight counts of requests a backend holds.

use std::time::Duration;

use capataz::sim::Mode;
use capataz_health::State;
use tokio::task::JoinSet;

use super::*;
use crate::support::balancer::{backends, metrics_text};
use crate::support::events::is_transition;

/// The value of gauge `name` for the series whose labels contain `labels`, in the balancer's
/// metrics as a scrape sees them.
fn gauge(scene: &Scene, name: &str, labels: &str) -> f64 {
    let text = metrics_text(&scene.balancer);
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} with {labels} in:\n{text}"))
}

/// Pool `web`'s page of `/status`.
async fn pool_status(scene: &Scene) -> Value {
    let host = scene.admin.to_string();
    let answer = exchange(scene.admin, "GET", "/status", &host, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["pools"][0].clone()
}

/// The names `/status` reports `serving`.
fn serving_names(pool: &Value) -> Vec<String> {
    pool["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter(|b| b["serving"] == true)
        .map(|b| text(b, "name"))
        .collect()
}

/// The backups `on_backups` names, the serving backends, the `backups` event and the
/// `capataz_pool_on_backups` gauge say the same, and windows of traffic land there by the
/// weights; then the all-down policy, said by `/status`, the `all_down` event and the
/// `capataz_pool_all_down` gauge, spreads the traffic over exactly the serving backends; then
/// the pool recovers and says so three ways.
#[tokio::test]
async fn who_serves_is_said_the_same_three_ways_and_the_traffic_goes_there() {
    let b = backends(&["a", "b", "c", "d"]).await;
    let config = with_backups(&b);
    let mut scene = Scene::start(&config, b).await;
    scene.check_windows("primaries serve", 1).await;
    let pool = pool_status(&scene).await;
    assert_eq!(pool["on_backups"], Value::Null, "{pool:#}");
    assert_eq!(serving_names(&pool), ["a", "b"]);
    assert_eq!(
        gauge(&scene, "capataz_pool_on_backups", "pool=\"web\""),
        0.0
    );

    // The backups take over: the event, /status and the gauge name the same set.
    scene.backend("a").set_health(Mode::Status(503));
    scene.backend("b").set_health(Mode::Status(503));
    let event = scene
        .wait_for(
            "the backups take over",
            |e| matches!(e, Notice::Backups { serving, .. } if !serving.is_empty()),
        )
        .await;
    let Notice::Backups { serving, .. } = event else {
        unreachable!("matched above")
    };
    let said: Vec<String> = serving.iter().map(|s| s.to_string()).collect();
    assert_eq!(said, ["c", "d"], "the event");
    let pool = pool_status(&scene).await;
    assert_eq!(pool["on_backups"], serde_json::json!(said), "{pool:#}");
    assert_eq!(serving_names(&pool), said, "serving flags");
    assert_eq!(
        gauge(&scene, "capataz_pool_on_backups", "pool=\"web\""),
        1.0
    );
    let before: Vec<u64> = scene
        .backends
        .iter()
        .map(SimBackend::traffic_hits)
        .collect();
    scene.check_windows("the backups serve", 2).await;
    for (i, name) in ["a", "b"].iter().enumerate() {
        assert_eq!(
            scene.backend(name).traffic_hits(),
            before[i],
            "{name} is not serving and got a request"
        );
    }

    // Every backend fails its probes: the pool fails open over all four (each proven once).
    scene.backend("c").set_health(Mode::Status(503));
    scene.backend("d").set_health(Mode::Status(503));
    let event = scene
        .wait_for("the all-down policy", |e| {
            matches!(e, Notice::AllDown { .. })
        })
        .await;
    let Notice::AllDown { policy, .. } = event else {
        unreachable!("matched above")
    };
    assert_eq!(policy.policy(), "fail_open", "the event");
    let pool = pool_status(&scene).await;
    assert_eq!(pool["all_down"], true, "{pool:#}");
    assert_eq!(pool["all_down_policy"], "fail_open", "{pool:#}");
    assert_eq!(pool["on_backups"], Value::Null, "{pool:#}");
    assert_eq!(serving_names(&pool), ["a", "b", "c", "d"]);
    assert_eq!(gauge(&scene, "capataz_pool_all_down", "pool=\"web\""), 1.0);
    assert_eq!(
        gauge(&scene, "capataz_pool_on_backups", "pool=\"web\""),
        0.0
    );
    scene.check_windows("failing open over all four", 2).await;

    // a comes back: the pool recovers, said three ways, and only a serves.
    scene.backend("a").set_health(Mode::Status(200));
    scene
        .wait_for("a UP", |e| is_transition(e, "a", State::Up))
        .await;
    scene
        .wait_for("the pool recovers", |e| {
            matches!(e, Notice::Recovered { .. })
        })
        .await;
    let pool = pool_status(&scene).await;
    assert_eq!(pool["all_down"], false, "{pool:#}");
    assert_eq!(pool["all_down_policy"], Value::Null, "{pool:#}");
    assert_eq!(serving_names(&pool), ["a"]);
    // Regression: a backup DOWN itself was said to be "standing by".
    let c = &pool["backends"][2];
    assert!(
        text(c, "explain").ends_with("; backup: out of rotation itself"),
        "{c:#}"
    );
    assert_eq!(gauge(&scene, "capataz_pool_all_down", "pool=\"web\""), 0.0);
    let reported = scene.check_windows("a alone", 1).await;
    assert!(
        reported.serving("a") && !reported.serving("d"),
        "{reported:?}"
    );
    scene.stop().await;
}

/// How long each backend holds a request in the in-flight test: long enough for a loaded
/// machine to send six requests and read `/status` and the metrics while all are held.
const HOLD: Duration = Duration::from_secs(3);

/// The in-flight count `/status` and `capataz_backend_in_flight` report for each backend is
/// the number of requests the backend is holding, and least-request, which picks by that
/// count, spreads requests sent one after another (each held before the next) evenly.
#[tokio::test]
async fn in_flight_reported_is_what_each_backend_holds_and_least_request_evens_it() {
    let b = backends(&["a", "b"]).await;
    for backend in &b {
        backend.set_traffic(Mode::Delay(HOLD, 200));
    }
    let config = config(
        &[member(&b[0], 1, ""), member(&b[1], 1, "")],
        "algorithm = \"least_request\"",
        "",
    );
    let scene = Scene::start(&config, b).await;
    scene
        .wait_reported("both serve", |r| r.serving("a") && r.serving("b"))
        .await;
    let addr = scene.balancer.local_addrs()[0];
    let mut held = JoinSet::new();
    for n in 1..=6u64 {
        held.spawn(async move { Client::new(addr).get("/").await.status });
        crate::support::wait::wait_until(&format!("request {n} at a backend"), || {
            scene
                .backends
                .iter()
                .map(SimBackend::traffic_hits)
                .sum::<u64>()
                >= n
        })
        .await;
    }
    let holding: Vec<u64> = scene
        .backends
        .iter()
        .map(SimBackend::traffic_hits)
        .collect();
    let host = scene.admin.to_string();
    let status = exchange(scene.admin, "GET", "/status", &host, &[])
        .await
        .json();
    for (i, name) in ["a", "b"].iter().enumerate() {
        let backend = &status["pools"][0]["backends"][i];
        assert_eq!(text(backend, "name"), *name);
        assert_eq!(
            backend["in_flight"].as_u64(),
            Some(holding[i]),
            "/status: {name} holds {} requests: {backend:#}",
            holding[i]
        );
        let labels = format!("backend=\"{name}\"");
        assert_eq!(
            gauge(&scene, "capataz_backend_in_flight", &labels),
            holding[i] as f64,
            "the gauge of {name}"
        );
    }
    assert_eq!(holding, [3, 3], "least-request evens the held requests");
    while let Some(status) = held.join_next().await {
        assert_eq!(status.expect("a request task"), 200);
    }
    let status = exchange(scene.admin, "GET", "/status", &host, &[])
        .await
        .json();
    for i in 0..2 {
        assert_eq!(
            status["pools"][0]["backends"][i]["in_flight"], 0,
            "all answered"
        );
    }
    scene.stop().await;
}
