//! Building pools of many backends.

use std::cell::Cell;
use std::fmt::Write as _;

use prometheus_client::registry::Registry;
use tokio::sync::broadcast;

use super::*;
use crate::instruments::HistogramScope;

thread_local! {
    /// Backend keys compared while matching a new pool's backends to the old pool's.
    pub(super) static KEY_COMPARISONS: Cell<u64> = const { Cell::new(0) };
    /// Backends built while rebuilding a pool from an old one, and how many of them while the
    /// old pool's lock was held.
    static BUILT_BESIDE_OLD: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Counts a backend built while rebuilding a pool from an old one (`locked`: while the old
/// pool's lock was held).
pub(super) fn note_build_beside_old_pool(locked: bool) {
    BUILT_BESIDE_OLD.with(|c| {
        let (built, held) = c.get();
        c.set((built + 1, held + u64::from(locked)));
    });
}

/// A config with one pool `web` of `n` weight-1 backends `b0`..`b{n-1}` and no active checks.
fn pool_of(n: usize) -> PoolConfig {
    let mut text =
        String::from("[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [\n");
    for i in 0..n {
        let _ = writeln!(
            text,
            "{{ name = \"b{i}\", address = \"127.0.0.1:{}\" }},",
            1 + i % 60_000
        );
    }
    text.push_str("]\n[pools.web.active]\nkind = \"none\"\n");
    let config = crate::config::parse_str(&text, "<test>").expect("valid test config");
    config.pools[0].clone()
}

/// Regression: rebuilding a pool on reload matched each new backend to the old pool
/// by a scan over every old backend, 5 x 10^7 name comparisons for 10,000 backends (38 % of a
/// 2-second `POST /reload` on a runtime thread). Now one hash lookup per backend: at most a
/// few key comparisons each, whatever the pool's size.
#[tokio::test(start_paused = true)]
async fn reload_matches_backends_in_linear_time() {
    let n = 20_000;
    let config = pool_of(n);
    let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
    let (events, _rx) = broadcast::channel(64);
    let clock = Clock::start();
    let first = PoolRt::new(
        config.clone(),
        events.clone(),
        clock,
        None,
        false,
        &families,
    );
    assert_eq!(first.snapshot().eligible.len(), n);
    // The last backend drained: the rebuilt pool must carry that over (found, not new).
    let last = format!("b{}", n - 1);
    first
        .set_override(&last, Some(OverrideKind::Drain), None)
        .expect("a backend of the pool");
    assert_eq!(first.snapshot().eligible.len(), n - 1);

    KEY_COMPARISONS.with(|c| c.set(0));
    let second = PoolRt::new(config, events, clock, Some(&first), false, &families);
    let comparisons = KEY_COMPARISONS.with(Cell::get);
    // Every backend kept (carried, not new), found with about one comparison each (the old
    // scan: 2 x 10^8).
    assert!(
        comparisons >= n as u64 && comparisons <= 2 * n as u64,
        "{comparisons}"
    );
    assert_eq!(second.snapshot().eligible.len(), n - 1);
    assert_eq!(
        second.lock().engine.carry(n - 1),
        first.lock().engine.carry(n - 1)
    );
}

/// Regression: rebuilding a pool on reload held the old pool's lock while building
/// every new backend (its connections and metric handles), ~50 ms at 10,000 backends; the
/// old pool's probes, traffic and the admin API's status pages wait on that lock on runtime
/// threads (a `GET /status/web/b1` waited up to 46 ms). The lock is now held only to copy what
/// kept backends carry over.
#[tokio::test(start_paused = true)]
async fn rebuilding_a_pool_builds_backends_without_the_old_pools_lock() {
    let n = 100;
    let config = pool_of(n);
    let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
    let (events, _rx) = broadcast::channel(64);
    let clock = Clock::start();
    let first = PoolRt::new(
        config.clone(),
        events.clone(),
        clock,
        None,
        false,
        &families,
    );
    first
        .set_override("b7", Some(OverrideKind::Drain), None)
        .expect("a backend of the pool");
    BUILT_BESIDE_OLD.with(|c| c.set((0, 0)));
    let second = PoolRt::new(config, events, clock, Some(&first), false, &families);
    assert_eq!(BUILT_BESIDE_OLD.with(Cell::get), (n as u64, 0));
    // What is carried over still is: the override, and the old pool is left unlocked.
    assert_eq!(second.snapshot().eligible.len(), n - 1);
    assert!(first.inner.try_lock().is_ok());
}

/// Regression (found in review): a pool rebuilt by a reload started every backend's
/// `watched` flag false, even a kept backend with an error streak, so its next good response
/// skipped the engine and did not clear the streak: two errors, a reload, a good response and
/// one more error ejected it, though the errors were not consecutive.
#[tokio::test(start_paused = true)]
async fn a_kept_backends_error_streak_is_cleared_by_a_good_response_after_a_reload() {
    let n = 4;
    let config = pool_of(n);
    let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
    let (events, _rx) = broadcast::channel(64);
    let clock = Clock::start();
    let first = PoolRt::new(
        config.clone(),
        events.clone(),
        clock,
        None,
        false,
        &families,
    );
    first.observe(0, Outcome::Status(502));
    first.observe(0, Outcome::Status(502));
    assert_eq!(first.health()[0].passive.error_streak, 2);
    let second = PoolRt::new(config, events, clock, Some(&first), false, &families);
    assert_eq!(second.health()[0].passive.error_streak, 2);
    second.observe(0, Outcome::Status(200));
    assert_eq!(second.health()[0].passive.error_streak, 0);
    second.observe(0, Outcome::Status(502));
    assert_eq!(second.snapshot().eligible.len(), n);
}

/// Regression: the event a backend's shedding answer raised said `weight at 10 % until then`
/// and then eighteen spaces before `(not counted as an error)`, a line break of the source
/// written into the sentence (the log line, the event's `reason` and the alert hooks' text).
#[tokio::test(start_paused = true)]
async fn the_shedding_event_reads_as_one_sentence() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [\n\
        { name = \"b0\", address = \"127.0.0.1:1\" },\n]\n[pools.web.active]\nkind = \"none\"\n\
        [pools.web.passive.load_shedding]\nenabled = true\n";
    let config = crate::config::parse_str(text, "<test>").expect("valid test config");
    let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
    let (events, mut rx) = broadcast::channel(64);
    let pool = PoolRt::new(
        config.pools[0].clone(),
        events,
        Clock::start(),
        None,
        false,
        &families,
    );
    let relief = pool.shed_request(503, &{
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::RETRY_AFTER,
            "30".parse().expect("a header value"),
        );
        headers
    });
    assert_eq!(relief, Some(std::time::Duration::from_secs(30)));
    TrafficSink::handle_shed(
        &*pool,
        pool.handle(),
        0,
        503,
        std::time::Duration::from_secs(30),
    );
    let sentence = loop {
        match rx.try_recv().expect("the shedding event") {
            event @ Notice::Shedding { .. } => break event.sentence(),
            _ => continue,
        }
    };
    assert_eq!(
        sentence,
        "pool=web backend=b0 sheds load: answered 503 asking for 30 s of relief; weight at 10 % \
         until then (not counted as an error)"
    );
}
