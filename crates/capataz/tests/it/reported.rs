//! What a pool reports is what it acts on, at every instant: on paused time, with the real
//! timer, the shed and the times "until" that `/status` shows are compared with the snapshot
//! the picker reads and with the events at the moment the engine acts.

use std::sync::Arc;
use std::time::Duration;

use capataz::balance::TrafficSink;
use capataz::health::{Notice, OverrideKind, PoolRt};
use capataz_health::rotation::Cause;
use capataz_health::{Ejection, Outcome};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::support::balancer::lone_pool;

/// Pool `web` of backends `a` and `b` (never probed), with `extra` in the pool's tables, and
/// its running tasks (the timer among them); the receiver of its events.
fn pool_with_timer(
    extra: &str,
) -> (
    Arc<PoolRt>,
    broadcast::Receiver<Notice>,
    Vec<JoinHandle<()>>,
) {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [\
         {{ name = \"a\", address = \"127.0.0.1:9\" }}, {{ name = \"b\", address = \"127.0.0.1:9\" }}]\n\
         [pools.web.active]\nkind = \"none\"\n{extra}"
    );
    let (pool, events) = lone_pool(&text);
    let tasks = pool.spawn_tasks();
    (pool, events, tasks)
}

/// Lets every ready task run (the timer included), without moving the paused clock.
async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

/// Asserts that what `/status` says of backend `b` (index 1) agrees with the snapshot: it
/// sheds exactly while the snapshot's weight is below its full weight, and nothing says it
/// ramps (no slow start here).
fn assert_shed_reported_as_acted(pool: &PoolRt, moment: &str) {
    let view = pool.view_of(1);
    let weight = pool.snapshot().weight(1).expect("b has a weight");
    let json = capataz::status::backend_json(pool, &view);
    let explain = json["explain"].as_str().unwrap_or_default().to_owned();
    assert_eq!(view.effective_weight_tenths, weight, "{moment}");
    assert_eq!(
        json["passive"]["shedding"].is_object(),
        weight < 10,
        "{moment}: /status says shedding {} while the picker weighs b {weight} tenths: {json:#}",
        json["passive"]["shedding"]
    );
    assert_eq!(
        explain.contains("shedding load"),
        weight < 10,
        "{moment}: {explain}"
    );
    assert!(
        !explain.contains("slow start"),
        "{moment}: no slow start here: {explain}"
    );
}

/// Regression: `/status` decided whether a backend still shed load by comparing the
/// shed's end with its own clock reading, and the engine's weight did the same at each
/// rebuild, while the snapshot the picker reads kept the reduced weight until the timer ran.
/// So from the end of a shed until the timer's tick (late on a busy runtime) `/status` said
/// `shedding: null` and explained the reduced weight as "slow start: weight 0.2 of 1". Now a
/// shed lasts until the engine's timeout ends it, and `/status` shows the engine's shed and
/// ramp: the report and the snapshot change together.
#[tokio::test(start_paused = true)]
async fn a_shed_is_reported_exactly_while_the_picker_weighs_it() {
    let (pool, mut events, tasks) = pool_with_timer(
        "[pools.web.passive.load_shedding]\nenabled = true\nweight_percent = 25\n\
         max_retry_after = \"2s\"\n",
    );
    settle().await;
    assert_eq!(pool.snapshot().eligible, [0, 1]);
    assert_shed_reported_as_acted(&pool, "before the shed");

    TrafficSink::handle_shed(&*pool, pool.handle(), 1, 503, Duration::from_secs(60));
    settle().await;
    let until = pool.view_of(1).standing.shed.expect("b sheds").until;
    assert!(pool.snapshot().weight(1) < Some(10));
    assert_shed_reported_as_acted(&pool, "during the shed");

    // The shed's end has come, and the timer has not run yet.
    tokio::time::advance(until.saturating_sub(pool.clock().now())).await;
    assert_shed_reported_as_acted(&pool, "at the shed's end, before the timer's tick");

    settle().await;
    assert_eq!(pool.snapshot().weight(1), Some(10), "the tick restored b");
    assert_shed_reported_as_acted(&pool, "after the timer's tick");
    let ended = std::iter::from_fn(|| events.try_recv().ok()).find_map(|e| match e {
        Notice::Shedding {
            shedding: false,
            time,
            ..
        } => Some(time),
        _ => None,
    });
    assert_eq!(
        ended,
        Some(pool.clock().wall(until)),
        "the event at the end"
    );
    for task in tasks {
        task.abort();
    }
}

/// Waits, on paused time, until engine time `at`, then lets the timer run.
async fn until_engine_time(pool: &PoolRt, at: Duration) {
    tokio::time::sleep_until(pool.clock().instant(at)).await;
    settle().await;
}

/// The times "until" that `/status` shows (an ejection's end, a manual override's lapse) are
/// when the engine readmits the backend: 1 ms before, the picker still leaves it out; at that
/// time, it is back, and the event says so at that very time.
#[tokio::test(start_paused = true)]
async fn every_reported_until_is_when_the_picker_readmits() {
    let (pool, mut events, tasks) =
        pool_with_timer("[pools.web.passive]\nconsecutive_errors = 1\nejection_time = \"3s\"\n");
    settle().await;
    let wall = |t: Duration| capataz::timefmt::rfc3339(pool.clock().wall(t));

    // b ejected by one traffic error: /status says until when.
    pool.observe(1, Outcome::Refused);
    let Ejection::Ejected {
        until: Some(until), ..
    } = pool.view_of(1).standing.health.passive.ejection
    else {
        panic!(
            "b ejected with a timer: {:?}",
            pool.view_of(1).standing.health
        );
    };
    let json = capataz::status::backend_json(&pool, &pool.view_of(1));
    assert_eq!(
        json["passive"]["ejection"]["until"],
        wall(until),
        "{json:#}"
    );
    until_engine_time(&pool, until - Duration::from_millis(1)).await;
    assert_eq!(pool.snapshot().eligible, [0], "still ejected just before");
    until_engine_time(&pool, until).await;
    assert_eq!(pool.snapshot().eligible, [0, 1], "readmitted at its until");
    let back = std::iter::from_fn(|| events.try_recv().ok()).find_map(|e| match e {
        Notice::Transition {
            transition, time, ..
        } if transition.to == capataz_health::State::Up => Some(time),
        _ => None,
    });
    assert_eq!(
        back,
        Some(pool.clock().wall(until)),
        "the transition's time"
    );

    // a drained for 2 s: /status says until when.
    pool.set_override("a", Some(OverrideKind::Drain), Some(Duration::from_secs(2)))
        .expect("a exists");
    let lapse = match pool.view_of(0).standing.cause {
        Cause::Override(o) => o.until,
        _ => None,
    }
    .expect("a drained with a TTL");
    let json = capataz::status::backend_json(&pool, &pool.view_of(0));
    assert_eq!(json["override"]["until"], wall(lapse), "{json:#}");
    until_engine_time(&pool, lapse - Duration::from_millis(1)).await;
    assert_eq!(pool.snapshot().eligible, [1], "still drained just before");
    until_engine_time(&pool, lapse).await;
    assert_eq!(pool.snapshot().eligible, [0, 1], "back at its until");
    let lapsed = std::iter::from_fn(|| events.try_recv().ok()).find_map(|e| match e {
        Notice::Override {
            kind: None, time, ..
        } => Some(time),
        _ => None,
    });
    assert_eq!(lapsed, Some(pool.clock().wall(lapse)), "the lapse's time");
    for task in tasks {
        task.abort();
    }
}
