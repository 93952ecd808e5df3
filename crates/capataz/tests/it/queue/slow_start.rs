//! A slow-starting backend's limit ramps with its weight: the limit `/status` and the metrics
//! report is the configured one scaled by the effective weight they report, and it is what the
//! backend gets.

use tokio::task::JoinSet;

use super::*;
use crate::support::balancer::parse;

/// A backend added by a reload ramps from 10 % of weight 4 (0.4): its limit of 20 is 2 then.
/// Five requests at once: it holds 2, 3 wait; `/status`, the gauges and the explain sentence
/// say so; released, all are answered and it never held more than 2.
#[tokio::test]
async fn a_slow_starting_backend_s_limit_ramps_with_its_reported_weight() {
    let seed = SlowBackend::start(Hold::For(Duration::ZERO)).await;
    let a = SlowBackend::start(Hold::Gate).await;
    // 300 s of ramp: the weight stays at 0.4 (then 0.5, still a limit of 2) for 30 s.
    let pool = "max_connections = 20\nslow_start = \"300s\"\ngate_new_backends = false";
    let (balancer, _events) = start(&config(&[("seed", seed.addr(), "")], pool, "")).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    // The same listeners (as written): the reload keeps them and changes the pool.
    let added = config(&[("a", a.addr(), ", weight = 4")], pool, "");
    balancer.reload(&parse(&added)).await.expect("reload");
    let mut clients = JoinSet::new();
    for n in 0..5 {
        clients.spawn(async move { get(addr, &format!("/r{n}")).await.status });
    }
    let pool = wait_queued(admin, 3).await;
    let backend = &pool["backends"][0];
    assert_eq!(backend["name"], "a", "{pool:#}");
    let weight = backend["effective_weight"].as_f64().unwrap();
    let limit = backend["limit"].as_u64().unwrap();
    assert_eq!(weight, 0.4, "{backend:#}");
    assert_eq!(
        limit,
        ((20.0 * weight / 4.0).floor() as u64).max(1),
        "limit x weight now / configured weight"
    );
    assert_eq!(limit, 2);
    assert_eq!(a.holding(), 2, "the backend holds what the limit allows");
    assert_eq!(backend["in_flight"], 2);
    let explain = backend["explain"].as_str().unwrap();
    assert!(
        explain.contains("at its limit: 2 of 2 requests in use (ramping with its weight)"),
        "{explain}"
    );
    let labels = "{pool=\"web\",backend=\"a\"}";
    assert_eq!(
        metric(&balancer, &format!("capataz_backend_limit{labels}")),
        2.0
    );
    assert_eq!(
        metric(
            &balancer,
            &format!("capataz_backend_effective_weight{labels}")
        ),
        0.4
    );
    a.release(5);
    while let Some(status) = clients.join_next().await {
        assert_eq!(status.expect("a client"), 200);
    }
    assert_eq!(a.max(), 2, "never above the ramped limit");
    balancer.shutdown(Duration::from_secs(1)).await;
}
