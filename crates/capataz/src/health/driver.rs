//! A pool's background work: one probe loop per backend, the one timer that sleeps until the
//! engine's `poll_timeout` (ejections ending, overrides lapsing, slow-start steps), and the
//! idle-connection reaper. Nothing here decides anything: outcomes and timeouts go in, and
//! [`PoolRt::publish`](super::PoolRt) sends out what the engine says.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::PoolRt;
use crate::config::CheckKind;
use crate::prober;

impl PoolRt {
    /// Starts the pool's background work: one probe loop per backend (unless checks are off),
    /// the engine's timer, and the idle-connection reaper. Abort the handles to stop them.
    pub fn spawn_tasks(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if self.config.active.kind != CheckKind::None {
            for backend in 0..self.backends.len() {
                tasks.push(tokio::spawn(probe_loop(self.clone(), backend)));
            }
        }
        let pool = self.clone();
        tasks.push(tokio::spawn(async move { pool.timer_loop().await }));
        let pool = self.clone();
        tasks.push(tokio::spawn(async move {
            let period = (pool.config.timeouts.idle / 2).max(Duration::from_millis(100));
            loop {
                tokio::time::sleep(period).await;
                for backend in &pool.backends {
                    backend.upstream.reap();
                }
            }
        }));
        tasks
    }

    /// Sleeps until the engine's next timeout (or until an input may have moved it earlier),
    /// then hands the engine the time.
    async fn timer_loop(&self) {
        loop {
            // Register for a wake-up before reading the timeout, so an input that lands in
            // between is not missed.
            let notified = self.timer.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let due = self.lock().engine.poll_timeout();
            match due {
                Some(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(self.clock.instant(due)) => {}
                        _ = notified => {}
                    }
                }
                None => notified.await,
            }
            self.tick();
        }
    }
}

/// Probes one backend forever: a first probe at a random phase within the interval, then one
/// jittered interval after each probe finishes, so probes never pile up or run in lockstep.
/// Each due time is rounded to the probe slot grid ([`prober::align_to_slot`]), so that probes
/// of different backends due within a few milliseconds of each other start together.
async fn probe_loop(pool: Arc<PoolRt>, backend: usize) {
    let active = &pool.config.active;
    let rt = pool.backends[backend].clone();
    let host = active.host.clone().unwrap_or_else(|| rt.address.clone());
    let mut rng = prober::Rng::from_entropy();
    let mut wait = prober::first_delay(active.interval, &mut rng);
    loop {
        let now = pool.clock.now();
        let due = prober::align_to_slot(now.saturating_add(wait), now, active.interval);
        rt.next_probe_ms.store(
            u64::try_from(due.as_millis()).unwrap_or(u64::MAX - 1),
            Ordering::Relaxed,
        );
        tokio::time::sleep_until(pool.clock.instant(due)).await;
        let started = Instant::now();
        let outcome = prober::probe_once(
            active.kind,
            rt.upstream.addr(),
            &active.path,
            &host,
            active.timeout,
        )
        .await;
        pool.record_probe(backend, outcome, started.elapsed());
        wait = prober::jittered(active.interval, active.jitter, &mut rng);
    }
}
