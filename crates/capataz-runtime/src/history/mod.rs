//! What the dashboard (and `capataz top`) shows of the recent past, kept by the balancer so a
//! page opened now sees it: the last health events ([`EVENTS`] at most), per pool and backend a
//! series of request rate, error rate and latency p50/p99 ([`SAMPLES`] samples of [`SAMPLE`]
//! each), and per backend a timeline of its state changes over the last hour, each with the
//! explain sentence of the moment.
//!
//! Everything is bounded: fixed rings, pruned of pools and backends that left. Nothing here is on
//! the request path: the sampler reads, every [`SAMPLE`], the counters the request path already
//! bumps (the backends' request counters and [`LatencyTotals`](crate::balance::LatencyTotals))
//! and keeps differences. Events reach it through the event broadcast, like the alert hooks.
//!
//! [`History`] holds the data behind one mutex, taken by the sampler (every [`SAMPLE`]), by each
//! event, and by the admin API's two pages (`GET /history/events`, `GET /history/series`).

mod series;
mod sparse;
mod timeline;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::events::Notice;
use crate::health::PoolRt;
use crate::timefmt::rfc3339;

pub(crate) use series::{SAMPLE, SAMPLES};
pub(crate) use timeline::TIMELINE;

/// The most events kept; older ones are dropped first.
pub(crate) const EVENTS: usize = 500;

/// The recent past of one balancer.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    events: VecDeque<Notice>,
    /// Events the recorder missed (the broadcast outran it) or dropped (the ring was full).
    missed: u64,
    dropped: u64,
    series: series::Series,
    timelines: timeline::Timelines,
}

impl History {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every holder leaves the data whole (pushes, pops, inserts), so poison is harmless.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `event` (dropping the oldest past [`EVENTS`]) and notes in their timelines the
    /// state of the backend it is about, or of every backend of its pool for a pool's event
    /// (backups taking over change who serves).
    pub(crate) fn record(&self, event: &Notice, pools: &[Arc<PoolRt>]) {
        let marks: Vec<(Arc<str>, timeline::Mark)> =
            match pools.iter().find(|p| &*p.name == event.pool()) {
                None => Vec::new(),
                Some(pool) => match event.backend() {
                    Some(backend) => pool
                        .index_of(backend)
                        .map(|index| {
                            (
                                pool.name.clone(),
                                timeline::Mark::of(pool, &pool.view_of(index)),
                            )
                        })
                        .into_iter()
                        .collect(),
                    None => pool
                        .views_with_last_probe()
                        .iter()
                        .map(|view| (pool.name.clone(), timeline::Mark::of(pool, view)))
                        .collect(),
                },
            };
        let now = SystemTime::now();
        let mut inner = self.lock();
        if inner.events.len() == EVENTS {
            inner.events.pop_front();
            inner.dropped += 1;
        }
        inner.events.push_back(event.clone());
        for (pool, mark) in marks {
            inner.timelines.note(&pool, mark, now);
        }
    }

    /// Notes that `missed` events went by unrecorded.
    pub(crate) fn missed(&self, missed: u64) {
        self.lock().missed += missed;
    }

    /// Takes one sample of every backend of `pools` (rates and latencies since the last one, and
    /// its state for the timeline), and forgets pools and backends no longer there.
    pub(crate) fn sample(&self, pools: &[Arc<PoolRt>], now: SystemTime) {
        // The views are read before the lock is taken: each takes its pool's lock.
        let views: Vec<(Arc<PoolRt>, Vec<crate::health::BackendView>)> = pools
            .iter()
            .map(|p| (p.clone(), p.views_with_last_probe()))
            .collect();
        let mut inner = self.lock();
        inner.series.sample(pools, now);
        for (pool, views) in &views {
            for view in views {
                inner
                    .timelines
                    .note(&pool.name, timeline::Mark::of(pool, view), now);
            }
        }
        inner.timelines.retain(pools, now);
    }

    /// `GET /history/events`: the kept events, oldest first.
    pub fn events_json(&self) -> Value {
        let inner = self.lock();
        let events: Vec<Value> = inner.events.iter().map(Notice::to_json).collect();
        json!({
            "capacity": EVENTS,
            "dropped": inner.dropped,
            "missed": inner.missed,
            "events": events,
        })
    }

    /// `GET /history/series`: per pool and backend (in `pools`' order) the samples kept, and per
    /// backend its timeline.
    pub fn series_json(&self, pools: &[Arc<PoolRt>], now: SystemTime) -> Value {
        let inner = self.lock();
        let pools: Vec<Value> = pools
            .iter()
            .map(|pool| {
                let backends: Vec<Value> = pool
                    .backends
                    .iter()
                    .map(|b| {
                        json!({
                            "name": &*b.name,
                            "series": inner.series.backend_json(&pool.name, &b.name),
                            "timeline": inner.timelines.json(&pool.name, &b.name, now),
                        })
                    })
                    .collect();
                json!({
                    "name": &*pool.name,
                    "series": inner.series.pool_json(&pool.name),
                    "backends": backends,
                })
            })
            .collect();
        json!({
            "time": rfc3339(now),
            "sample_seconds": SAMPLE.as_secs(),
            "samples": SAMPLES,
            "timeline_seconds": TIMELINE.as_secs(),
            "pools": pools,
        })
    }
}

/// Records into `history` until `shutdown` turns true: every event of `events`, and a sample of
/// `pools()` (the pools in force) every [`SAMPLE`].
pub(crate) async fn run(
    history: Arc<History>,
    mut events: broadcast::Receiver<Notice>,
    pools: impl Fn() -> Option<Arc<Vec<Arc<PoolRt>>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    if *shutdown.borrow() {
        return;
    }
    let mut tick = tokio::time::interval(SAMPLE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = events.recv() => match received {
                Ok(event) => {
                    let Some(pools) = pools() else { return };
                    history.record(&event, &pools);
                }
                Err(broadcast::error::RecvError::Lagged(n)) => history.missed(n),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                let Some(pools) = pools() else { return };
                history.sample(&pools, SystemTime::now());
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Milliseconds since the Unix epoch.
fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_record_keeps_the_last_500_and_counts_the_rest() {
        let history = History::default();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        for n in 0..(EVENTS as u64 + 100) {
            let event = Notice::Recovered {
                pool: "web".into(),
                time: start + Duration::from_secs(n),
            };
            history.record(&event, &[]);
        }
        history.missed(3);
        let json = history.events_json();
        let events = json["events"].as_array().expect("events");
        assert_eq!(events.len(), EVENTS);
        assert_eq!(json["dropped"], 100);
        assert_eq!(json["missed"], 3);
        assert_eq!(
            events[0]["time"],
            rfc3339(start + Duration::from_secs(100)),
            "the oldest kept is the 101st"
        );
        assert_eq!(
            events[EVENTS - 1]["time"],
            rfc3339(start + Duration::from_secs(EVENTS as u64 + 99))
        );
    }
}
