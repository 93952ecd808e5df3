//! The limiter and queue on a pool handle of its own: slots never past a limit, the queue in
//! order, bounded, timed out on paused time, left by a client that goes away, emptied by a
//! pool that loses its last backend, and limits that ramp with the snapshot's weight.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use capataz_health::{Eligible, LoadShedding, Outcome, TrafficRule};
use prometheus_client::registry::Registry;

use super::super::{BackendRt, PoolHandle, TrafficSink};
use super::{Admission, Admit};
use crate::instruments::{Families, HistogramScope};
use crate::upstream::Upstream;

struct NoSink;

impl TrafficSink for NoSink {
    fn handle_traffic(&self, _: &PoolHandle, _: usize, _: Outcome) {}
    fn handle_shed(&self, _: &PoolHandle, _: usize, _: u16, _: Duration) {}
}

/// A pool of backends with these `limits` (`None`: none) and weights, every backend eligible
/// at full weight, with the pool's `extra` keys (queue_size, queue_timeout ...).
fn pool_with(limits: &[(Option<u32>, u32)], extra: &str) -> Arc<PoolHandle> {
    let mut text = String::from("[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n");
    text.push_str(extra);
    text.push_str("\nbackends = [\n");
    for (i, (limit, weight)) in limits.iter().enumerate() {
        let limit = limit.map_or(String::new(), |n| format!(", max_connections = {n}"));
        text.push_str(&format!(
            "{{ name = \"b{i}\", address = \"127.0.0.1:{}\", weight = {weight}{limit} }},\n",
            9000 + i
        ));
    }
    text.push_str("]\n[pools.web.active]\nkind = \"none\"\n");
    let config = capataz_config::parse_str(&text, "<test>").expect("valid test config");
    let config = config.pools[0].clone();
    let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
    let metrics = families.pool("web");
    let backends = config
        .backends
        .iter()
        .map(|b| {
            Arc::new(BackendRt {
                metrics: metrics.backend(&b.name.as_str().into()),
                name: b.name.as_str().into(),
                address: b.address.clone(),
                weight: b.weight,
                upstream: Upstream::new(
                    b.socket_addr,
                    Duration::from_secs(1),
                    Duration::from_secs(1),
                ),
                in_flight: AtomicUsize::new(0),
                traffic: Default::default(),
                watched: AtomicBool::new(false),
                latency: None,
                outcomes: None,
                latency_totals: Default::default(),
                tunnels: None,
                ewma: None,
            })
        })
        .collect();
    let pool = handle_over(config, backends, metrics);
    let n = limits.len();
    publish(
        &pool,
        (0..n).collect(),
        limits.iter().map(|&(_, w)| w * 10).collect(),
    );
    pool
}

/// A handle of `config` over `backends`, eligible as the caller publishes.
fn handle_over(
    config: capataz_config::PoolConfig,
    backends: Vec<Arc<BackendRt>>,
    metrics: crate::instruments::PoolMetrics,
) -> Arc<PoolHandle> {
    let sink: Weak<dyn TrafficSink> = Weak::<NoSink>::new();
    let rules: (TrafficRule, Option<LoadShedding>) = (TrafficRule::default(), None);
    Arc::new(PoolHandle::new(config, backends, metrics, rules, sink))
}

fn publish(pool: &PoolHandle, eligible: Vec<usize>, member_weights: Vec<u32>) {
    pool.publish(Eligible {
        weights: eligible.iter().map(|&i| member_weights[i]).collect(),
        backends: eligible,
        member_weights,
        ..Eligible::default()
    });
}

fn in_flight(pool: &PoolHandle) -> Vec<usize> {
    pool.backends
        .iter()
        .map(|b| b.in_flight.load(Ordering::Relaxed))
        .collect()
}

/// Admits a first attempt that must get a slot at once.
async fn granted(pool: &PoolHandle) -> Admission<'_> {
    let limits = pool.limits.as_ref().unwrap();
    match limits.admit(pool, &[]).await {
        Admit::Granted(admission, None) => admission,
        other => panic!("expected a slot at once, got {other:?}"),
    }
}

/// Lets spawned tasks run until they wait.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_picker_skips_backends_at_their_limit_and_never_passes_one() {
    let pool = pool_with(&[(Some(1), 1), (Some(2), 1)], "");
    let held: Vec<_> = [
        granted(&pool).await,
        granted(&pool).await,
        granted(&pool).await,
    ]
    .into_iter()
    .map(Admission::keep)
    .collect();
    assert_eq!(in_flight(&pool), [1, 2], "{held:?}");
    let limits = pool.limits.as_ref().unwrap();
    assert!(limits.at_limit(&pool, &pool.snapshot(), 0));
    // A retry that tried backend 1 finds backend 0 full: refused, not queued.
    assert!(matches!(limits.admit(&pool, &[1]).await, Admit::Busy));
    assert_eq!(limits.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn waiters_get_freed_slots_in_arrival_order() {
    let pool = pool_with(&[(Some(1), 1)], "queue_size = 10");
    let first = granted(&pool).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..4 {
        let (waiting, order) = (pool.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let pool = waiting;
            let limits = pool.limits.as_ref().unwrap();
            let Admit::Granted(admission, Some(_)) = limits.admit(&pool, &[]).await else {
                panic!("waiter {n} got no slot");
            };
            order.lock().unwrap().push(n);
            // Holds the slot a while, then gives it back to the next.
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(admission);
        }));
        settle().await;
        assert_eq!(pool.limits.as_ref().unwrap().queued(), n + 1);
    }
    drop(first);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
    assert_eq!(in_flight(&pool), [0]);
    assert_eq!(pool.limits.as_ref().unwrap().queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once() {
    let pool = pool_with(&[(Some(1), 1)], "queue_size = 1");
    let _held = granted(&pool).await;
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let limits = pool.limits.as_ref().unwrap();
            matches!(limits.admit(&pool, &[]).await, Admit::TimedOut(_))
        })
    };
    settle().await;
    let limits = pool.limits.as_ref().unwrap();
    let start = tokio::time::Instant::now();
    assert!(matches!(limits.admit(&pool, &[]).await, Admit::QueueFull));
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(waiter.await.unwrap(), "the queued one times out");
}

#[tokio::test(start_paused = true)]
async fn a_wait_ends_after_the_queue_timeout() {
    let pool = pool_with(&[(Some(2), 1)], "queue_timeout = \"750ms\"");
    let _held = (granted(&pool).await, granted(&pool).await);
    let limits = pool.limits.as_ref().unwrap();
    let start = tokio::time::Instant::now();
    let Admit::TimedOut(waited) = limits.admit(&pool, &[]).await else {
        panic!("expected a timeout");
    };
    assert_eq!(waited, Duration::from_millis(750));
    assert_eq!(start.elapsed(), Duration::from_millis(750));
    assert_eq!(limits.queued(), 0);
    assert_eq!(in_flight(&pool), [2]);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_goes_away_leaves_the_queue_and_any_slot_granted_to_it() {
    let pool = pool_with(&[(Some(1), 1)], "queue_size = 2");
    let held = granted(&pool).await;
    let spawn_waiter = || {
        let pool = pool.clone();
        tokio::spawn(async move {
            let limits = pool.limits.as_ref().unwrap();
            let _ = limits.admit(&pool, &[]).await;
        })
    };
    let gone = spawn_waiter();
    settle().await;
    let limits = pool.limits.as_ref().unwrap();
    assert_eq!(limits.queued(), 1);
    gone.abort();
    settle().await;
    assert_eq!(limits.queued(), 0, "its place is free");
    // Granted a slot, then gone before it used it: the slot is given back.
    let granted_then_gone = spawn_waiter();
    settle().await;
    drop(held);
    granted_then_gone.abort();
    settle().await;
    assert_eq!(in_flight(&pool), [0]);
    assert!(matches!(
        limits.admit(&pool, &[]).await,
        Admit::Granted(_, None)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_pool_that_loses_every_backend_sends_its_waiters_to_the_all_down_answer() {
    let pool = pool_with(&[(Some(1), 1), (Some(1), 1)], "");
    let _held = (granted(&pool).await, granted(&pool).await);
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let limits = pool.limits.as_ref().unwrap();
            matches!(limits.admit(&pool, &[]).await, Admit::NoBackend(Some(_)))
        })
    };
    settle().await;
    publish(&pool, vec![], vec![10, 10]);
    assert!(waiter.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_drained_backend_s_slot_goes_to_the_remaining_one() {
    let pool = pool_with(&[(Some(1), 1), (Some(1), 1)], "");
    let (a, b) = (granted(&pool).await, granted(&pool).await);
    let (drained, other) = if a.index() == 0 { (a, b) } else { (b, a) };
    publish(&pool, vec![1], vec![10, 10]);
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let limits = pool.limits.as_ref().unwrap();
            match limits.admit(&pool, &[]).await {
                Admit::Granted(admission, Some(_)) => admission.keep(),
                other => panic!("{other:?}"),
            }
        })
    };
    settle().await;
    // The drained backend's request ends: its slot is not usable, the waiter still waits.
    drop(drained);
    settle().await;
    assert_eq!(pool.limits.as_ref().unwrap().queued(), 1);
    drop(other);
    assert_eq!(waiter.await.unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_limit_ramps_with_the_snapshot_weight_and_a_step_up_wakes_waiters() {
    let pool = pool_with(&[(Some(10), 2)], "");
    let limits = pool.limits.as_ref().unwrap();
    // Weight 2 configured: 20 tenths. At 4 tenths (20 %), the limit is 2; at 1 tenth, 1.
    publish(&pool, vec![0], vec![4]);
    assert_eq!(limits.limit(&pool, &pool.snapshot(), 0), Some(2));
    publish(&pool, vec![0], vec![1]);
    assert_eq!(limits.limit(&pool, &pool.snapshot(), 0), Some(1));
    let _held = granted(&pool).await;
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let limits = pool.limits.as_ref().unwrap();
            matches!(limits.admit(&pool, &[]).await, Admit::Granted(_, Some(_)))
        })
    };
    settle().await;
    assert_eq!(limits.queued(), 1);
    // The ramp steps up: a slot appears without any release.
    publish(&pool, vec![0], vec![10]);
    assert!(waiter.await.unwrap());
    publish(&pool, vec![0], vec![20]);
    assert_eq!(limits.limit(&pool, &pool.snapshot(), 0), Some(10));
    assert_eq!(
        super::scaled(10, 100, 20),
        10,
        "never above the configured limit"
    );
}

#[tokio::test(start_paused = true)]
async fn a_backend_without_a_limit_takes_what_the_limited_ones_cannot() {
    let pool = pool_with(&[(Some(1), 1), (None, 1)], "");
    let mut slots = Vec::new();
    for _ in 0..5 {
        slots.push(granted(&pool).await.keep());
    }
    assert_eq!(in_flight(&pool), [1, 4]);
}

/// Regression: after a membership update the pool's new build shares its kept backends (and
/// their in-flight counts) with the old one, whose requests' releases only the old queue
/// heard: a request waiting in the new queue saw a slot free up and waited on until its
/// timeout. The queue's head now looks for a free slot itself every `RECHECK`.
#[tokio::test(start_paused = true)]
async fn a_slot_freed_by_the_pools_previous_build_reaches_this_queue() {
    let old = pool_with(&[(Some(1), 1)], "queue_timeout = \"5s\"");
    let held = granted(&old).await.keep();
    let new = handle_over(
        old.config.clone(),
        old.backends.clone(),
        Families::register(&mut Registry::default(), HistogramScope::Pool).pool("web"),
    );
    publish(&new, vec![0], vec![10]);
    let waiter = {
        let new = new.clone();
        tokio::spawn(async move {
            let limits = new.limits.as_ref().unwrap();
            match limits.admit(&new, &[]).await {
                Admit::Granted(admission, Some(waited)) => (admission.keep(), waited),
                other => panic!("{other:?}"),
            }
        })
    };
    settle().await;
    assert_eq!(new.limits.as_ref().unwrap().queued(), 1);
    // The old build's request ends: only the old queue hears of it.
    super::release(&old, held);
    let (index, waited) = waiter.await.unwrap();
    assert_eq!(index, 0);
    assert_eq!(
        waited,
        super::RECHECK,
        "within one recheck, not at the timeout"
    );
}

/// Many requests on random holds against mixed limits (paused time, seeded): no backend ever
/// holds more than its limit, the queue never holds more than its size, every request ends
/// (a slot, full, or timed out), and nothing is left held or queued.
#[tokio::test(start_paused = true)]
async fn limits_and_queue_size_hold_under_random_load() {
    for seed in 0..8 {
        fastrand::seed(seed);
        let pool = pool_with(
            &[(Some(1), 1), (Some(2), 1), (Some(3), 2)],
            "queue_size = 20\nqueue_timeout = \"40ms\"",
        );
        let caps = [1usize, 2, 3];
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let pool = pool.clone();
            let (start, hold) = (fastrand::u64(0..200), fastrand::u64(0..30));
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(start)).await;
                let limits = pool.limits.as_ref().unwrap();
                let exclude: &[usize] = if fastrand::u8(0..10) == 0 { &[0] } else { &[] };
                match limits.admit(&pool, exclude).await {
                    Admit::Granted(admission, _) => {
                        let b = admission.index();
                        let held = pool.backends[b].in_flight.load(Ordering::SeqCst);
                        assert!(held <= caps[b], "backend {b} holds {held}");
                        assert!(limits.queued() <= 20);
                        tokio::time::sleep(Duration::from_millis(hold)).await;
                        drop(admission);
                        0
                    }
                    Admit::QueueFull | Admit::TimedOut(_) => 1,
                    Admit::Busy => 2,
                    Admit::NoBackend(_) => panic!("every backend is eligible"),
                }
            }));
        }
        let mut ended = [0usize; 3];
        for task in tasks {
            ended[task.await.unwrap()] += 1;
        }
        assert_eq!(ended.iter().sum::<usize>(), 200, "seed {seed}");
        assert!(ended[0] > 0 && ended[1] > 0, "seed {seed}: {ended:?}");
        assert_eq!(in_flight(&pool), [0, 0, 0], "seed {seed}");
        assert_eq!(pool.limits.as_ref().unwrap().queued(), 0, "seed {seed}");
    }
}

/// The slot affinity names, refused at its limit, leaves the count as it was (a refused
/// `admit_on` once gave back a slot it never took, wrapping the count below zero).
#[tokio::test]
async fn a_refused_admit_on_leaves_the_count_alone() {
    let pool = pool_with(&[(Some(1), 1), (Some(1), 1)], "");
    let limits = pool.limits.as_ref().unwrap();
    let held = limits.admit_on(&pool, 0).expect("a free slot");
    assert_eq!(in_flight(&pool), [1, 0]);
    assert!(limits.admit_on(&pool, 0).is_none(), "at its limit");
    assert_eq!(in_flight(&pool), [1, 0], "the refusal took nothing back");
    drop(held);
    assert_eq!(in_flight(&pool), [0, 0]);
}

/// A long queue waits quietly: only its head looks for a free slot every `RECHECK` (each
/// waiter once did, 10 looks a second per waiter: a queue of 100,000 kept a core busy); the
/// others look once, then sleep until granted, made the head, or timed out. A head that
/// leaves wakes the next, which takes over the looking.
#[tokio::test(start_paused = true)]
async fn only_the_queues_head_keeps_looking_for_a_slot() {
    let pool = pool_with(
        &[(Some(1), 1)],
        "queue_size = 1000\nqueue_timeout = \"60s\"",
    );
    let held = granted(&pool).await;
    let limits = pool.limits.as_ref().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (pool, served) = (pool.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let limits = pool.limits.as_ref().unwrap();
            if let Admit::Granted(_admission, _) = limits.admit(&pool, &[]).await {
                served.fetch_add(1, Ordering::Relaxed);
                // Holds its slot.
                std::future::pending::<()>().await;
            }
        }));
    }
    settle().await;
    assert_eq!(limits.queued(), 200);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let looks = limits.rechecks.load(Ordering::Relaxed);
    // Each looked once; the head about 100 times in 10 s.
    assert!(looks < 200 + 150, "{looks} looks at the head in 10 s");
    // The head leaves: the next takes over (it gets the slot when freed, in order).
    tasks.remove(0).abort();
    settle().await;
    assert_eq!(limits.queued(), 199);
    // A slot freed behind the queue's back (as a request of a previous build does) reaches
    // the new head by its own looking.
    let index = held.keep();
    pool.backends[index]
        .in_flight
        .fetch_sub(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(limits.queued(), 198, "the new head found the slot");
    assert_eq!(served.load(Ordering::Relaxed), 1);
    assert_eq!(in_flight(&pool), [1]);
    for task in tasks {
        task.abort();
    }
}
