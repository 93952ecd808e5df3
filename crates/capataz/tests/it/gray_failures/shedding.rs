//! A backend that answers `503` with `Retry-After` (or `429`) gets its weight reduced for that
//! long instead of an error on its record, shown in `/status` and as events, then restored.

use std::collections::HashMap;
use std::time::Duration;

use capataz::health::Notice;
use capataz::sim::Mode;

use super::*;
use crate::support::balancer::backends;

const SHEDDING: &str = r#"
[pools.web.passive]
consecutive_errors = 1

[pools.web.passive.load_shedding]
enabled = true
weight_percent = 10
max_retry_after = "2s"
"#;

fn shedding_of(event: &Notice) -> Option<(bool, Option<u16>, Option<Duration>)> {
    match event {
        Notice::Shedding {
            backend,
            shedding,
            status,
            duration,
            ..
        } if &**backend == "busy" => Some((*shedding, *status, *duration)),
        _ => None,
    }
}

async fn spread(client: &mut Client, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let answer = client.get("/").await;
        assert_eq!(answer.status, 200);
        *seen.entry(answer.backend.unwrap_or_default()).or_default() += 1;
    }
    seen
}

#[tokio::test]
async fn a_503_with_retry_after_reduces_the_weight_for_that_long_and_is_no_error() {
    let b = backends(&["a", "busy"]).await;
    // Asks for a minute; the pool grants at most 2 s.
    b[1].set_traffic(Mode::RetryAfter(503, 60));
    let mut r = Running::start(&config(&b, SHEDDING), 0).await;
    let mut client = Client::new(r.balancer.local_addrs()[0]);
    let mut shed = false;
    for _ in 0..4 {
        let answer = client.get("/").await;
        shed |= answer.status == 503;
    }
    assert!(shed, "busy answered 503 to one of its requests");
    b[1].set_traffic(Mode::Status(200));
    let event = r
        .wait_for("busy sheds load", |e| shedding_of(e).is_some())
        .await;
    assert_eq!(
        shedding_of(&event),
        Some((true, Some(503), Some(Duration::from_secs(2))))
    );
    assert!(
        event.sentence().starts_with(
            "pool=web backend=busy sheds load: answered 503 asking for 2 s of relief; weight at 10 %"
        ),
        "{}",
        event.sentence()
    );
    let status = r.backend("busy").await;
    assert_eq!(status["verdict"], "UP", "{status}");
    assert_eq!(
        status["passive"]["error_streak"], 0,
        "not an error, with consecutive_errors = 1"
    );
    assert_eq!(status["passive"]["shedding"]["status"], 503);
    let explain = status["explain"].as_str().unwrap_or_default();
    assert!(
        explain.contains("shedding load: answered 503, weight at 10 % until"),
        "{explain}"
    );
    // Weights 10 against 1 (tenths): busy gets one request in eleven.
    let seen = spread(&mut client, 22).await;
    assert!(seen.get("busy").copied().unwrap_or(0) <= 2, "{seen:?}");

    let event = r
        .wait_for("busy's weight restored", |e| {
            shedding_of(e).is_some_and(|(shedding, ..)| !shedding)
        })
        .await;
    assert_eq!(
        event.sentence(),
        "pool=web backend=busy no longer sheds load: weight restored"
    );
    let seen = spread(&mut client, 20).await;
    assert_eq!(seen.get("busy"), Some(&10), "{seen:?}");
    assert!(r.backend("busy").await["passive"]["shedding"].is_null());
    r.stop().await;
}
