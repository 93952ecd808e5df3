//! The other modifiers of a weight: an agent's percent, load shedding, an outlier ejected and
//! readmitted, backups taking over and handing back. Each stage waits for what `/status`
//! reports (or an event), then compares windows of traffic with it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz::sim::Mode;
use capataz_health::State;
use tokio::task::JoinSet;

use super::*;
use crate::support::balancer::backends;
use crate::support::checks::AgentBackend;
use crate::support::events::is_transition;

#[tokio::test]
async fn agent_weights_split_the_traffic_as_reported() {
    let b = backends(&["a", "b"]).await;
    let agent_a = AgentBackend::start("up\n").await;
    let agent_b = AgentBackend::start("up\n").await;
    let text = config(
        &[
            member(&b[0], 1, &format!("agent_port = {}", agent_a.addr.port())),
            member(&b[1], 2, &format!("agent_port = {}", agent_b.addr.port())),
        ],
        "",
        &format!(
            "[pools.web.agent]\nport = {}\ninterval = \"20ms\"\ntimeout = \"500ms\"\n",
            agent_a.addr.port()
        ),
    );
    let mut scene = Scene::start(&text, b).await;
    scene.check_windows("configured weights", 2).await;

    agent_b.say(Some("up 50%\n"));
    scene
        .wait_reported("b at half its weight", |r| r.weight("b") == 1.0)
        .await;
    scene.check_windows("b's agent at 50 %", 2).await;

    agent_b.say(Some("up 25%\n"));
    agent_a.say(Some("up 10%\n"));
    scene
        .wait_reported("a at 10 % and b at 25 %", |r| {
            r.weight("a") == 0.1 && r.weight("b") == 0.5
        })
        .await;
    scene.check_windows("a at 10 %, b at 25 %", 2).await;
    scene.stop().await;
}

#[tokio::test]
async fn a_load_shed_splits_the_traffic_as_reported_then_hands_it_back() {
    let b = backends(&["a", "busy"]).await;
    let text = config(
        &[member(&b[0], 1, ""), member(&b[1], 1, "")],
        "",
        "[pools.web.passive.load_shedding]\nenabled = true\nweight_percent = 25\n\
         max_retry_after = \"3s\"\n",
    );
    let mut scene = Scene::start(&text, b).await;
    scene.check_windows("before the shed", 1).await;

    // busy asks for a minute of relief (the pool grants 3 s), then answers normally.
    scene.backend("busy").set_traffic(Mode::RetryAfter(503, 60));
    let end = tokio::time::Instant::now() + DEADLINE;
    while scene.client.get("/").await.status != 503 {
        assert!(tokio::time::Instant::now() < end, "busy never shed");
    }
    scene.backend("busy").set_traffic(Mode::Status(200));
    scene
        .wait_for("busy sheds load", |e| {
            matches!(e, Notice::Shedding { backend, shedding: true, .. } if &**backend == "busy")
        })
        .await;

    // Windows until the relief is over: those during it see busy at 25 % of its weight.
    let mut during = 0;
    loop {
        assert!(tokio::time::Instant::now() < end, "the relief never ended");
        let window = scene.window(WINDOW).await;
        if window.stable() {
            window.check("while busy sheds load");
            if window.before.weight("busy") == 1.0 {
                break;
            }
            assert_eq!(window.before.weight("busy"), 0.2, "{window:?}");
            during += 1;
        }
    }
    assert!(during >= 1, "no window within the 3 s relief");
    scene.check_windows("after the relief", 2).await;
    scene.stop().await;
}

#[tokio::test]
async fn a_latency_outlier_gets_no_traffic_while_ejected_and_its_share_when_back() {
    let b = backends(&["a", "b", "slow"]).await;
    b[0].set_traffic(Mode::Delay(Duration::from_millis(10), 200));
    b[1].set_traffic(Mode::Delay(Duration::from_millis(10), 200));
    b[2].set_traffic(Mode::Delay(Duration::from_millis(100), 200));
    let text = config(
        &[
            member(&b[0], 1, ""),
            member(&b[1], 3, ""),
            member(&b[2], 1, ""),
        ],
        "",
        "[pools.web.passive]\nejection_time = \"3s\"\nmax_ejection_time = \"10s\"\n\n\
         [pools.web.passive.latency_outliers]\nenabled = true\npercentile = \"p50\"\n\
         factor = 3\nwindows = 2\nwindow = \"300ms\"\nmin_requests = 3\nmin_latency = \"5ms\"\n",
    );
    let mut scene = Scene::start(&text, b).await;

    // Concurrent traffic until the detector ejects slow; then it stops, and everyone answers
    // at once (slow is not judged again when it is back).
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = JoinSet::new();
    for _ in 0..6 {
        let (addr, stop) = (scene.balancer.local_addrs()[0], stop.clone());
        loops.spawn(async move {
            let mut client = Client::new(addr);
            while !stop.load(Ordering::Relaxed) {
                client.get("/").await;
            }
        });
    }
    scene
        .wait_for("slow ejected", |e| is_transition(e, "slow", State::Down))
        .await;
    stop.store(true, Ordering::Relaxed);
    while loops.join_next().await.is_some() {}
    for backend in &scene.backends {
        backend.set_traffic(Mode::Status(200));
    }

    let reported = scene.check_windows("slow ejected", 1).await;
    assert!(!reported.serving("slow"), "{reported:?}");
    scene
        .wait_reported("slow back on probation", |r| r.serving("slow"))
        .await;
    scene.check_windows("slow back", 2).await;
    scene.stop().await;
}

fn backups_serving(event: &Notice) -> Option<(usize, bool)> {
    match event {
        Notice::Backups {
            serving,
            to_primaries,
            ..
        } => Some((serving.len(), *to_primaries)),
        _ => None,
    }
}

#[tokio::test]
async fn backups_take_the_traffic_by_their_weights_and_hand_it_back() {
    let b = backends(&["a", "b", "c", "d"]).await;
    let text = with_backups(&b);
    let mut scene = Scene::start(&text, b).await;
    let reported = scene.check_windows("primaries serve", 2).await;
    assert!(!reported.serving("c") && !reported.serving("d"));

    scene.backend("a").set_health(Mode::Status(503));
    scene.backend("b").set_health(Mode::Status(503));
    scene
        .wait_for("the backups take over", |e| {
            backups_serving(e) == Some((2, false))
        })
        .await;
    scene.check_windows("backups serve", 2).await;

    scene.backend("a").set_health(Mode::Status(200));
    scene
        .wait_for("the backups hand back", |e| {
            backups_serving(e) == Some((0, true))
        })
        .await;
    let reported = scene.check_windows("handed back to a", 2).await;
    assert!(reported.serving("a") && !reported.serving("d"));

    scene.backend("b").set_health(Mode::Status(200));
    scene
        .wait_for("b UP", |e| is_transition(e, "b", State::Up))
        .await;
    scene.check_windows("both primaries back", 2).await;
    scene.stop().await;
}
