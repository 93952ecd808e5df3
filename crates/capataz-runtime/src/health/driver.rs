//! A pool's background work: one driver that sleeps until the earliest of the engine's
//! deadlines (the rotation's `poll_timeout`: ejections ending, overrides lapsing, slow-start
//! steps; and its schedule's: the next probe, tracked reading or agent exchange), starts the
//! checks due (`checks.rs`) and hands the engine the time; the detectors' windows; and the
//! idle-connection reaper. One timer per pool, whatever its number of backends: nothing waits
//! per backend between checks. Nothing here decides anything: the schedule says what is due,
//! outcomes and timeouts go in, and [`PoolRt::publish`](super::PoolRt) sends out what the
//! engine says.

use std::sync::Arc;
use std::time::Duration;

use capataz_health::schedule::{Active, Check, Due};
use tokio::task::JoinHandle;

use super::checks::{self, Lineage, ProbePlan, Tracks};
use super::PoolRt;

/// A pool's running tasks (its driver, the detectors' windows, the idle-connection reaper) and
/// the lineage its checks under way report to, so that a membership update
/// ([`PoolTasks::carry`]) carries the schedule to the new build: its kept backends go on in the
/// same phase. Dropping it leaves the tasks running: [`PoolTasks::abort`] stops them.
#[derive(Debug, Default)]
pub(crate) struct PoolTasks {
    pool: Vec<JoinHandle<()>>,
    lineage: Option<Arc<Lineage>>,
}

impl PoolTasks {
    /// Stops every task (and with them the checks under way).
    pub(crate) fn abort(self) {
        for task in self.into_handles() {
            task.abort();
        }
    }

    /// The handles of every task. Aborting them all stops the checks under way too.
    pub(crate) fn into_handles(self) -> Vec<JoinHandle<()>> {
        self.pool
    }

    /// The tasks of `pool`, a membership update of the pool these tasks run for
    /// ([`PoolRt::with_members`]): a backend that stays (the same [`BackendRt`]) keeps its
    /// schedule (its next probe due when it was; a probe under way ends into `pool`); an added
    /// one starts as at a pool's start, a removed one is checked no more; the pool's own few
    /// tasks start again on `pool`. `pools` are the pools in force (for `track`).
    ///
    /// [`BackendRt`]: crate::balance::BackendRt
    pub(crate) fn carry(self, pool: &Arc<PoolRt>, pools: &[Arc<PoolRt>]) -> PoolTasks {
        for task in self.pool {
            task.abort();
        }
        let Some(lineage) = self.lineage else {
            return pool.start_tasks(pools);
        };
        let (actives, tracks) = checks::actives(pool, pools);
        lineage.carry_to(pool, &actives);
        PoolTasks {
            pool: pool.start_pool_tasks(&lineage, tracks),
            lineage: Some(lineage),
        }
    }
}

impl PoolRt {
    /// Starts the pool's background work: its driver (the checks of every backend, unless
    /// checks are off, and the engine's timer), the detectors' windows and the idle-connection
    /// reaper. Abort the handles to stop them.
    ///
    /// The schedule's random source is seeded here, on the calling thread, from `fastrand`'s
    /// generator: a test that seeds it (`fastrand::seed`) gets the same phases and jitter.
    pub fn spawn_tasks(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        self.spawn_tasks_among(std::slice::from_ref(self))
    }

    /// [`PoolRt::spawn_tasks`], with `pools` (this one among them) to find the backends its
    /// backends `track`: a tracking backend is never probed; it reads its target's active
    /// side instead.
    pub(crate) fn spawn_tasks_among(
        self: &Arc<Self>,
        pools: &[Arc<PoolRt>],
    ) -> Vec<JoinHandle<()>> {
        self.start_tasks(pools).into_handles()
    }

    /// [`PoolRt::spawn_tasks_among`], as [`PoolTasks`] (which a membership update carries).
    pub(crate) fn start_tasks(self: &Arc<Self>, pools: &[Arc<PoolRt>]) -> PoolTasks {
        let (actives, tracks) = checks::actives(self, pools);
        self.start_schedule(fastrand::u64(..), &actives);
        let lineage = Lineage::new(self);
        PoolTasks {
            pool: self.start_pool_tasks(&lineage, tracks),
            lineage: Some(lineage),
        }
    }

    /// Starts the schedule of every backend, each checked by `actives[i]`, drawing from `seed`.
    pub(super) fn start_schedule(&self, seed: u64, actives: &[Active]) {
        let now = self.clock.now();
        let mut inner = self.lock();
        let mut schedule = capataz_health::Schedule::new(super::check_timing(&self.config), seed);
        for (i, &active) in actives.iter().enumerate() {
            schedule.push(active, inner.engine.cadence(i), now);
        }
        inner.schedule = schedule;
    }

    /// The pool's own tasks: the driver, the detectors' windows, the reaper.
    fn start_pool_tasks(
        self: &Arc<Self>,
        lineage: &Arc<Lineage>,
        tracks: Tracks,
    ) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        let driver = Driver {
            plan: ProbePlan::of(self),
            pool: self.clone(),
            lineage: lineage.clone(),
            tracks,
        };
        tasks.push(tokio::spawn(driver.run()));
        let passive = &self.config.passive;
        if let Some(outliers) = passive.latency_outliers.filter(|_| passive.enabled) {
            let pool = self.clone();
            tasks.push(tokio::spawn(async move {
                every(pool.clock(), outliers.window, || {
                    pool.close_latency_window()
                })
                .await
            }));
        }
        if let Some(rate) = passive.success_rate.filter(|_| passive.enabled) {
            let pool = self.clone();
            tasks.push(tokio::spawn(async move {
                every(pool.clock(), rate.window, || pool.close_success_window()).await
            }));
        }
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
}

/// A pool's driver: its one timer.
struct Driver {
    pool: Arc<PoolRt>,
    /// Held while the driver runs: the checks under way stop once no driver holds it.
    lineage: Arc<Lineage>,
    plan: Arc<ProbePlan>,
    tracks: Tracks,
}

impl Driver {
    /// Sleeps until the engine's next deadline (or until an input may have moved it
    /// earlier), hands the rotation the time when its timeout is due, and starts the checks
    /// due.
    async fn run(self) {
        let pool = &self.pool;
        let mut due = Vec::new();
        // Whether to read the rotation's timeout again (it costs a pass over the backends):
        // at the start, after a timeout, and after a wake-up (an input may have moved it).
        let mut reread = true;
        loop {
            // Register for a wake-up before reading the deadlines, so an input that lands in
            // between is not missed.
            let notified = pool.timer.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = {
                let mut inner = pool.lock();
                if reread {
                    inner.armed = inner.engine.poll_timeout();
                }
                inner.wake = inner.schedule.poll_timeout();
                checks::earliest(inner.armed, inner.wake)
            };
            let woken = match deadline {
                Some(deadline) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(pool.clock.instant(deadline)) => false,
                        _ = notified => true,
                    }
                }
                None => {
                    notified.await;
                    true
                }
            };
            let now = pool.clock.now();
            let timeout = pool.lock().armed.is_some_and(|armed| armed <= now);
            if timeout {
                pool.tick();
            }
            reread = timeout || woken;
            self.start_due(now, &mut due);
        }
    }

    /// Starts every check due by `now`: takes them from the schedule under the lock, then runs
    /// each without it (a reading locks the tracked backend's pool, which may be this one).
    fn start_due(&self, now: Duration, due: &mut Vec<Due>) {
        let pool = &self.pool;
        {
            let mut inner = pool.lock();
            let inner = &mut *inner;
            while let Some(next) = inner
                .schedule
                .poll_due(now, &inner.engine, |backend| pool.owns_probes(backend))
            {
                due.push(next);
            }
        }
        for Due { backend, check } in due.drain(..) {
            match check {
                Check::Probe => checks::start_probe(pool, &self.lineage, &self.plan, backend),
                Check::Agent => checks::start_agent(pool, &self.lineage, &self.plan, backend),
                Check::Track => {
                    if let Some((target, index)) = self.tracks.get(&backend) {
                        let state = target.active_state(*index);
                        pool.record_tracked(backend, state);
                    }
                }
            }
        }
    }
}

/// Runs `close` every `window` forever, at each multiple of `window` on the engine clock (so
/// a recorded log replays with the same windows: `capataz replay` ends them there too); a
/// close that runs late does not move the next ones off that grid.
async fn every(clock: super::Clock, window: Duration, close: impl Fn()) {
    let window = window.max(Duration::from_millis(1));
    let now = clock.now().as_nanos();
    let step = window.as_nanos();
    let first = (now / step + 1).saturating_mul(step);
    let first = Duration::from_nanos(u64::try_from(first).unwrap_or(u64::MAX));
    let mut ticks = tokio::time::interval_at(clock.instant(first), window);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        close();
    }
}

#[cfg(test)]
mod tests {
    use capataz_health::Outcome;
    use prometheus_client::registry::Registry;
    use tokio::sync::broadcast;

    use super::*;
    use crate::health::Clock;
    use crate::instruments::{Families, HistogramScope};

    /// The health runtime of the first pool of config `text`, its tasks not started.
    fn pool_of(text: &str) -> Arc<PoolRt> {
        let config = crate::config::parse_str(text, "<test>").expect("valid test config");
        let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
        let (events, _rx) = broadcast::channel(64);
        PoolRt::new(
            config.pools[0].clone(),
            events,
            Clock::start(),
            None,
            false,
            &families,
        )
    }

    /// The pool's driver with no check scheduled: only the rotation's timeouts wake it.
    fn timer_only(pool: &Arc<PoolRt>) -> JoinHandle<()> {
        let driver = Driver {
            plan: ProbePlan::of(pool),
            pool: pool.clone(),
            lineage: Lineage::new(pool),
            tracks: Tracks::new(),
        };
        tokio::spawn(driver.run())
    }

    /// When each of four backends is first probed, with `fastrand` seeded with `seed`.
    async fn first_probes(seed: u64) -> Vec<Option<Duration>> {
        let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [\
            { name = \"a\", address = \"127.0.0.1:9\" }, { name = \"b\", address = \"127.0.0.1:9\" },\
            { name = \"c\", address = \"127.0.0.1:9\" }, { name = \"d\", address = \"127.0.0.1:9\" }]\n\
            [pools.web.active]\ninterval = \"10s\"\n";
        let pool = pool_of(text);
        fastrand::seed(seed);
        let tasks = pool.spawn_tasks();
        let probed = |pool: &PoolRt| (0..4).map(|i| pool.next_probe(i)).collect::<Vec<_>>();
        for _ in 0..1000 {
            if probed(&pool).iter().all(Option::is_some) {
                break;
            }
            tokio::task::yield_now().await;
        }
        for task in tasks {
            task.abort();
        }
        probed(&pool)
    }

    /// Regression: each probe loop seeded its own generator from the clock and a
    /// stack address, so no test could replay probe timing; every random draw now comes from
    /// the engine schedule's generator, seeded from `fastrand`, seedable.
    #[tokio::test(start_paused = true)]
    async fn probe_phases_repeat_from_a_seed() {
        let first = first_probes(42).await;
        assert!(first.iter().all(Option::is_some), "{first:?}");
        assert_eq!(first, first_probes(42).await);
        assert_ne!(first, first_probes(43).await);
    }

    /// Regression: a probe that brought a backend UP began its slow start but did
    /// not wake the timer, which slept with nothing due; so the snapshot kept the ramp's first
    /// weight (10 %) for good while `/status` computed the weight afresh. Now the snapshot,
    /// which `/status` reads too, takes every step of the ramp on time.
    #[tokio::test(start_paused = true)]
    async fn a_ramp_begun_by_a_probe_steps_the_snapshot_weight_on_time() {
        let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [\
            { name = \"a\", address = \"127.0.0.1:9\" }, { name = \"b\", address = \"127.0.0.1:9\" }]\n\
            slow_start = \"2s\"\n[pools.web.active]\ninterval = \"1h\"\nrise = 1\nfall = 1\n";
        let pool = pool_of(text);
        // Only the timer runs (asleep with nothing due): the probes are fed by hand.
        let timer = timer_only(&pool);
        let settle = || async {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
        };
        settle().await;
        let probe = |outcome: Outcome| pool.record_probe(1, outcome, Duration::ZERO);
        probe(Outcome::Refused);
        settle().await;
        assert_eq!(pool.snapshot().eligible, [0]);
        probe(Outcome::Status(200));
        assert_eq!(pool.snapshot().eligible, [0, 1]);
        // Steps of 100 ms (a twentieth of 2 s); looked at in the middle of each.
        let steps = [
            1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10,
        ];
        tokio::time::sleep(Duration::from_millis(50)).await;
        for (k, &tenths) in steps.iter().enumerate() {
            settle().await;
            let weight = pool.snapshot().weight(1);
            assert_eq!(weight, Some(tenths), "step {k}");
            assert_eq!(pool.view_of(1).effective_weight_tenths, tenths, "step {k}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        timer.abort();
    }

    /// A pool `web` of backends `names` (each at a refused port) probed every 10 s.
    fn probed(names: &[&str]) -> crate::config::PoolConfig {
        let refused: Vec<(&str, &str)> = names.iter().map(|&n| (n, "127.0.0.1:9")).collect();
        probed_at(&refused)
    }

    /// A pool `web` of backends (name, address) probed every 10 s, each probe within 100 ms.
    fn probed_at(backends: &[(&str, &str)]) -> crate::config::PoolConfig {
        let backends: Vec<String> = backends
            .iter()
            .map(|(n, a)| format!("{{ name = \"{n}\", address = \"{a}\" }}"))
            .collect();
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [{}]\n\
             [pools.web.active]\ninterval = \"10s\"\ntimeout = \"100ms\"\n",
            backends.join(", ")
        );
        let config = crate::config::parse_str(&text, "<test>").expect("valid test config");
        config.pools[0].clone()
    }

    /// Yields until `done` holds (at most 1,000 times), and says whether it does.
    async fn settled(mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..1000 {
            if done() {
                return true;
            }
            tokio::task::yield_now().await;
        }
        done()
    }

    /// Issue 12 (churn): every membership update rebuilt the pool and restarted every probe
    /// task (a new random phase for each), 4.3 s per update at 5,000 backends. Now a backend
    /// that stays keeps its runtime and its schedule (same due time), its probes feed the new
    /// build, a removed backend is probed no more, an added one gets a first probe of its own,
    /// and the old build is freed. (This test checked the task ids of per-backend probe loops;
    /// one driver per pool now runs every backend's probes, so the schedule's due times are
    /// what stays.)
    #[tokio::test(start_paused = true)]
    async fn a_membership_update_keeps_the_schedule_of_the_backends_that_stay() {
        let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
        let (events, _rx) = broadcast::channel(64);
        let first = PoolRt::new(
            probed(&["a", "b", "c"]),
            events,
            Clock::start(),
            None,
            false,
            &families,
        );
        let tasks = first.start_tasks(std::slice::from_ref(&first));
        let due: Vec<_> = (0..3).map(|i| first.next_probe(i)).collect();
        assert!(due.iter().all(Option::is_some), "{due:?}");
        let removed = first.backends[1].clone();

        // b leaves, d comes.
        let mut members = first.config.backends.clone();
        let mut d = members[1].clone();
        d.name = "d".into();
        members[1] = d;
        let second = first.with_members(members, true, &families);
        let tasks = tasks.carry(&second, std::slice::from_ref(&second));
        assert!(
            Arc::ptr_eq(&second.backends[0], &first.backends[0]),
            "a rebuilt"
        );
        assert!(
            Arc::ptr_eq(&second.backends[2], &first.backends[2]),
            "c rebuilt"
        );
        assert!(!Arc::ptr_eq(&second.backends[1], &first.backends[1]));
        assert!(second.next_probe(1).is_some(), "d is not scheduled");
        assert_eq!(second.next_probe(0), due[0], "a's phase reset");
        assert_eq!(second.next_probe(2), due[2], "c's phase reset");
        // Added: gated until it passes `rise` probes.
        assert_eq!(second.verdict(1), capataz_health::State::Down);

        // The old build is freed once its own tasks (aborted) are dropped, and so is b.
        let old = Arc::downgrade(&first);
        drop(first);
        let freed = settled(|| old.strong_count() == 0 && Arc::strong_count(&removed) == 1);
        assert!(freed.await, "the old build or b is still alive");

        // a's next probe (refused) lands in the new build's engine.
        tokio::time::sleep(Duration::from_secs(11)).await;
        let failed = settled(|| second.health()[0].active.fail_streak > 0);
        assert!(failed.await, "{:?}", second.health()[0]);
        tasks.abort();
    }

    /// A probe under way while a membership update carries the pool to a new build ends into
    /// the new build: its outcome reaches the new engine and its backend's next probe is
    /// scheduled there (it was never lost in the old build, which would leave the backend
    /// unprobed for good).
    #[tokio::test(start_paused = true)]
    async fn a_probe_under_way_across_a_membership_update_ends_into_the_new_build() {
        // Accepts and never answers: each probe of `a` runs until its 100 ms timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let silent_addr = silent.local_addr().expect("address").to_string();
        let families = Families::register(&mut Registry::default(), HistogramScope::Pool);
        let (events, _rx) = broadcast::channel(64);
        let first = PoolRt::new(
            probed_at(&[("a", &silent_addr), ("b", "127.0.0.1:9")]),
            events,
            Clock::start(),
            None,
            false,
            &families,
        );
        let tasks = first.start_tasks(std::slice::from_ref(&first));
        let due = first.next_probe(0).expect("a is scheduled");
        tokio::time::sleep_until(first.clock().instant(due)).await;
        let started = settled(|| {
            first.health()[0].active.fail_streak == 0 && {
                let inner = first.lock();
                inner.schedule.poll_timeout() != Some(due)
            }
        });
        assert!(started.await, "a's probe did not start");

        // b leaves while a's probe waits for its answer.
        let members = vec![first.config.backends[0].clone()];
        let second = first.with_members(members, true, &families);
        let tasks = tasks.carry(&second, std::slice::from_ref(&second));
        assert_eq!(
            second.next_probe(0),
            Some(due),
            "a's probe is not under way"
        );
        drop(first);

        tokio::time::sleep(Duration::from_millis(200)).await;
        let ended = settled(|| second.health()[0].active.fail_streak == 1);
        assert!(ended.await, "{:?}", second.health()[0]);
        let next = second.next_probe(0).expect("a's next probe");
        assert!(
            next > due + Duration::from_secs(5),
            "{next:?} after {due:?}"
        );
        tasks.abort();
        drop(silent);
    }
}
