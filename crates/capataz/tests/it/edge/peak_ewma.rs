//! `algorithm = "peak_ewma"`: a slow backend gets a clearly smaller share than round robin's
//! third; a backend back from DOWN starts unsampled and gets traffic again.

use std::time::Duration;

use capataz::sim::Mode;
use capataz_health::State;

use crate::support::events::is_transition;

use super::*;

/// `clients` concurrent clients sending `each` requests to `addr`.
async fn load(addr: std::net::SocketAddr, clients: usize, each: usize) {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::strict(addr);
            for _ in 0..each {
                assert_eq!(client.get("/").await.status, 200);
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
}

#[tokio::test]
async fn peak_ewma_sends_a_slow_backend_a_small_share_and_samples_it_afresh_after_down() {
    let b = backends(&["slow", "fast1", "fast2"]).await;
    b[0].set_traffic(Mode::Delay(Duration::from_millis(200), 200));
    let pool = format!("algorithm = \"peak_ewma\"\n{FAST_CHECKS}");
    let text = ConfigText::sims(&b).extra(&pool).build();
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    load(addr, 8, 50).await;
    let hits = |i: usize| b[i].traffic_hits();
    let (slow, total) = (hits(0), hits(0) + hits(1) + hits(2));
    assert_eq!(total, 400);
    // Round robin would give it a third (133). Peak EWMA: a handful while it was unsampled,
    // and a few more when the fast ones' estimates peak (everything here shares one loaded
    // runtime: a fast answer delayed by the scheduler is a peak for as long as it decays).
    assert!(slow * 8 < total, "slow {slow} of {total}");
    // `/status` shows the estimates the picker compares: the slow one's about 200 ms.
    let pool = balancer.pool("web").unwrap();
    let estimate = |i: usize| {
        capataz::status::backend_json(&pool, &pool.view_of(i))["latency_estimate_ms"].as_f64()
    };
    let slow_ms = estimate(0).expect("the slow backend was sampled");
    assert!((150.0..5000.0).contains(&slow_ms), "{slow_ms} ms");
    assert!(estimate(1).unwrap() < slow_ms && estimate(2).unwrap() < slow_ms);

    // DOWN and back: it returns unsampled, so it gets requests again (compared by load alone
    // until its first answer), then its estimate is the slow one again.
    b[0].set_health(Mode::Status(503));
    wait_for(&mut rx, "slow DOWN", |e| {
        is_transition(e, "slow", State::Down)
    })
    .await;
    b[0].set_health(Mode::Status(200));
    wait_for(&mut rx, "slow UP", |e| is_transition(e, "slow", State::Up)).await;
    assert_eq!(estimate(0), None, "back in rotation unsampled");
    let before = hits(0);
    load(addr, 8, 25).await;
    let again = hits(0) - before;
    assert!(again >= 1, "an unsampled backend is tried");
    assert!(again * 5 < 200, "then avoided again: {again} of 200");
}
