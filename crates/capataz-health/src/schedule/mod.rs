//! When each backend of a pool is checked, and what each probe came to. Pure like the rest of
//! the engine: the caller passes `now`, sleeps until [`Schedule::poll_timeout`], takes the checks
//! due from [`Schedule::poll_due`], runs them, and hands back how each ended
//! ([`Schedule::handle_probe`], [`Schedule::handle_agent`]); what a probe came to leaves as a
//! [`Probed`] ([`Schedule::poll_probed`]) for the caller's records and metrics.
//!
//! The rules:
//! - A backend's first probe comes at a random phase within the interval of its [`Cadence`], so
//!   that backends configured together are not probed in lockstep; each next one starts one
//!   jittered interval (the one its cadence picks after the probe) after the last one ended, so
//!   probes of one backend never overlap.
//! - Every due time is rounded to the probe slot grid ([`PROBE_SLOT`], [`align_to_slot`]), so
//!   that probes of backends due within a few milliseconds of each other start together.
//! - A due probe of a backend the rotation wants no probes for (maintenance:
//!   [`Rotation::wants_probes`]) or that this instance does not own (shared probing: the
//!   caller's `owned`, from the fleet's [`Group`](crate::Group)) does not run; it is asked for
//!   again one jittered `interval` later.
//! - A backend that tracks another is never probed: it reads its target at once, then every
//!   jittered `interval` ([`Check::Track`]).
//! - An agent is asked at a random phase within the agent's interval, then one jittered agent
//!   interval after each exchange ends, whatever the backend's maintenance or ownership.
//!
//! The random draws come from a seeded [`Rng`] the schedule owns: the same seed and inputs give
//! the same times. Invariants: a check under way has no due time in the queue, and each check
//! of a backend has at most one; the queue holds one entry per scheduled check, so the earliest
//! due time of a pool of thousands is read in constant time.

mod timing;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

pub use timing::{align_to_slot, first_delay, jittered, Rng, PROBE_SLOT};

use crate::cadence::{Cadence, ProbeIntervals};
use crate::probe::ProbeOutcome;
use crate::rotation::{AgentReport, AgentState, Rotation};
use crate::rules::ProbeResult;

/// What checks a backend's active side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Active {
    /// Probes.
    Probe,
    /// Readings of the backend it tracks.
    Track,
    /// Nothing (the pool does not probe, or the tracked backend is not running).
    None,
}

/// A kind of check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// A probe: the caller runs it and hands the outcome to [`Schedule::handle_probe`].
    Probe,
    /// A reading of the tracked backend's active state, which the caller feeds to
    /// [`Rotation::handle_tracked`]; the next reading is already scheduled.
    Track,
    /// An agent exchange: the caller runs it and hands the answer to
    /// [`Schedule::handle_agent`].
    Agent,
}

/// A check due now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    /// The backend's index.
    pub backend: usize,
    /// What to run.
    pub check: Check,
}

/// How often a pool checks its backends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// The probe intervals by cadence; `steady` also spaces tracked readings and skipped
    /// probes.
    pub intervals: ProbeIntervals,
    /// Each interval is drawn uniformly within +-`jitter` of itself (a fraction, clamped to
    /// [0, 1]).
    pub jitter: f64,
    /// The agent's interval, when the pool asks agents.
    pub agent: Option<Duration>,
}

/// One check's timer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Timer {
    /// When it is (or, while it runs, was) due.
    due: Option<Duration>,
    running: bool,
}

/// One backend's timers, as a membership update carries them to the pool's next build
/// ([`Schedule::push_kept`]): a kept backend goes on in the same phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    active: Active,
    check: Timer,
    agent: Option<Timer>,
}

/// What one probe came to, for the caller's records, metrics and traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probed {
    /// The backend's index.
    pub backend: usize,
    /// What the exchange came to.
    pub outcome: ProbeOutcome,
    /// How the probe rule judged it.
    pub result: ProbeResult,
    /// How long it took, as the caller measured it.
    pub latency: Duration,
    /// When it ended.
    pub at: Duration,
}

/// An entry of the queue: due time in nanoseconds, backend, check; the earliest on top.
type Entry = Reverse<(u64, u32, Check)>;

/// When each backend of one pool is checked. See the module documentation.
#[derive(Clone, Debug)]
pub struct Schedule {
    timing: Timing,
    rng: Rng,
    backends: Vec<Timers>,
    queue: BinaryHeap<Entry>,
    probed: VecDeque<Probed>,
}

impl Schedule {
    /// An empty schedule for checks timed by `timing`, drawing from a generator seeded with
    /// `seed`.
    pub fn new(timing: Timing, seed: u64) -> Schedule {
        Schedule {
            timing,
            rng: Rng::with_seed(seed),
            backends: Vec::new(),
            queue: BinaryHeap::new(),
            probed: VecDeque::new(),
        }
    }

    /// An empty schedule with the same timing whose draws continue this one's, for the pool's
    /// next build (a membership update): kept backends are pushed with [`Schedule::push_kept`].
    pub fn successor(&self) -> Schedule {
        Schedule::new(self.timing, 0).with_rng(self.rng.clone())
    }

    fn with_rng(mut self, rng: Rng) -> Schedule {
        self.rng = rng;
        self
    }

    /// The number of backends.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    /// Whether the schedule has no backend.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Adds the next backend, checked by `active` (and by its agent when the pool asks agents),
    /// its active side at `cadence`, at `now`: its first probe at a random phase within the
    /// cadence's interval, its first reading at once, its first agent exchange at a random
    /// phase within the agent's interval.
    pub fn push(&mut self, active: Active, cadence: Cadence, now: Duration) {
        let backend = self.backends.len();
        let check = match active {
            Active::Probe => {
                let interval = self.timing.intervals.of(cadence);
                let wait = first_delay(interval, &mut self.rng);
                Some(align_to_slot(now.saturating_add(wait), now, interval))
            }
            Active::Track => Some(now),
            Active::None => None,
        };
        let agent = self.timing.agent.map(|interval| {
            let wait = first_delay(interval, &mut self.rng);
            Some(align_to_slot(now.saturating_add(wait), now, interval))
        });
        self.backends.push(Timers {
            active,
            check: Timer::default(),
            agent: agent.map(|_| Timer::default()),
        });
        if let Some(due) = check {
            self.arm(backend, Check::of(active), due);
        }
        if let Some(Some(due)) = agent {
            self.arm(backend, Check::Agent, due);
        }
    }

    /// Adds the next backend with the timers it had in the pool's previous build: the same due
    /// times, and a check under way there stays under way (its end is handed to this schedule).
    pub fn push_kept(&mut self, timers: Timers) {
        let backend = self.backends.len();
        self.backends.push(Timers {
            check: Timer::default(),
            agent: timers.agent.map(|_| Timer::default()),
            ..timers
        });
        let check = Check::of(timers.active);
        self.restore(backend, check, timers.check);
        if let Some(agent) = timers.agent {
            self.restore(backend, Check::Agent, agent);
        }
    }

    fn restore(&mut self, backend: usize, check: Check, timer: Timer) {
        match (timer.running, timer.due) {
            (true, due) => {
                let slot = self.timer_mut(backend, check);
                slot.due = due;
                slot.running = true;
            }
            (false, Some(due)) => self.arm(backend, check, due),
            (false, None) => {}
        }
    }

    /// `backend`'s timers, to carry to the pool's next build.
    pub fn timers(&self, backend: usize) -> Option<Timers> {
        self.backends.get(backend).copied()
    }

    /// When the next check is due (`None`: none is scheduled).
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.queue
            .peek()
            .map(|Reverse((due, ..))| Duration::from_nanos(*due))
    }

    /// The next check due by `now`, if any; call until `None`. A due probe of a backend that
    /// `rotation` wants no probes for, or that this instance does not own (`owned(backend)`
    /// false: another instance of the fleet probes it), is skipped and asked for again one
    /// jittered `interval` later. A reading's next one is scheduled at once; a probe or an
    /// agent exchange is under way until its end is handed back.
    pub fn poll_due(
        &mut self,
        now: Duration,
        rotation: &Rotation,
        mut owned: impl FnMut(usize) -> bool,
    ) -> Option<Due> {
        while let Some(&Reverse((due, backend, check))) = self.queue.peek() {
            if Duration::from_nanos(due) > now {
                return None;
            }
            self.queue.pop();
            let backend = backend as usize;
            let timer = self.timer_mut(backend, check);
            if timer.running || timer.due != Some(Duration::from_nanos(due)) {
                continue;
            }
            let steady = self.timing.intervals.steady;
            match check {
                Check::Probe if !rotation.wants_probes(backend) || !owned(backend) => {
                    self.after(backend, check, steady, now);
                    continue;
                }
                Check::Track => self.after(backend, check, steady, now),
                Check::Probe | Check::Agent => self.timer_mut(backend, check).running = true,
            }
            return Some(Due { backend, check });
        }
        None
    }

    /// Records how `backend`'s probe ended at `now` (it took `latency`): the rotation judges
    /// it, the backend's next probe is scheduled one jittered interval of its new cadence
    /// later (if this probe was the one [`Schedule::poll_due`] started), and a [`Probed`]
    /// waits for [`Schedule::poll_probed`]. Returns the probe rule's judgement. Panics if
    /// `backend` is not an index of `rotation`.
    pub fn handle_probe(
        &mut self,
        rotation: &mut Rotation,
        backend: usize,
        probe: impl Into<ProbeOutcome>,
        latency: Duration,
        now: Duration,
    ) -> ProbeResult {
        let outcome = probe.into();
        let result = rotation.handle_probe(backend, outcome, now);
        if self.ended(backend, Check::Probe) {
            let interval = self.timing.intervals.of(rotation.cadence(backend));
            self.after(backend, Check::Probe, interval, now);
        }
        self.probed.push_back(Probed {
            backend,
            outcome,
            result,
            latency,
            at: now,
        });
        result
    }

    /// Records how `backend`'s agent exchange ended at `now`: its answer, if it gave one, goes
    /// to the rotation (a failed exchange is no input at all), and the next exchange is
    /// scheduled one jittered agent interval later. Returns the agent state in force. Panics if
    /// `backend` is not an index of `rotation`.
    pub fn handle_agent(
        &mut self,
        rotation: &mut Rotation,
        backend: usize,
        report: Option<AgentReport>,
        now: Duration,
    ) -> AgentState {
        if let (true, Some(interval)) = (self.ended(backend, Check::Agent), self.timing.agent) {
            self.after(backend, Check::Agent, interval, now);
        }
        match report {
            Some(report) => rotation.handle_agent(backend, report, now),
            None => rotation.agent(backend),
        }
    }

    /// What the next probe handed back came to, oldest first. The caller drains them after
    /// each input, as it drains the rotation's events.
    pub fn poll_probed(&mut self) -> Option<Probed> {
        self.probed.pop_front()
    }

    /// When `backend` is next probed (while a probe is under way: when it was due); `None` for
    /// a backend that is not probed.
    pub fn next_probe(&self, backend: usize) -> Option<Duration> {
        let timers = self.backends.get(backend)?;
        match timers.active {
            Active::Probe => timers.check.due,
            Active::Track | Active::None => None,
        }
    }

    /// Whether `backend`'s `check` was under way, and marks it ended.
    fn ended(&mut self, backend: usize, check: Check) -> bool {
        match (self.backends.get(backend), check) {
            (None, _) => return false,
            (Some(timers), Check::Probe) if timers.active != Active::Probe => return false,
            (Some(timers), Check::Agent) if timers.agent.is_none() => return false,
            _ => {}
        }
        let timer = self.timer_mut(backend, check);
        std::mem::replace(&mut timer.running, false)
    }

    /// Schedules `backend`'s `check` one jittered `interval` after `now`, on the slot grid, and
    /// strictly after `now` (the same for any interval above zero: a jittered interval is at
    /// least half of it, the slot at most a hundredth), so that [`Schedule::poll_due`] ends.
    fn after(&mut self, backend: usize, check: Check, interval: Duration, now: Duration) {
        let wait = jittered(interval, self.timing.jitter, &mut self.rng);
        let due = align_to_slot(now.saturating_add(wait), now, interval);
        let due = due.max(now.saturating_add(Duration::from_nanos(1)));
        self.arm(backend, check, due);
    }

    fn arm(&mut self, backend: usize, check: Check, due: Duration) {
        // A pool of more than four billion backends cannot be built; such an index is never
        // scheduled rather than scheduled under another's.
        let Ok(index) = u32::try_from(backend) else {
            return;
        };
        // The queue keeps nanoseconds (584 years): the timer keeps the same value.
        let due = timing::nanos(due);
        let timer = self.timer_mut(backend, check);
        timer.due = Some(Duration::from_nanos(due));
        timer.running = false;
        self.queue.push(Reverse((due, index, check)));
    }

    /// The timer of `backend`'s `check`. Panics if `backend` is not an index, or if the
    /// backend has no agent timer and `check` is `Agent` (never asked: only scheduled checks
    /// reach here).
    fn timer_mut(&mut self, backend: usize, check: Check) -> &mut Timer {
        let timers = &mut self.backends[backend];
        match check {
            Check::Probe | Check::Track => &mut timers.check,
            Check::Agent => timers.agent.get_or_insert_with(Timer::default),
        }
    }
}

impl Check {
    /// The check of an active side (`Probe` for none: never scheduled).
    fn of(active: Active) -> Check {
        match active {
            Active::Track => Check::Track,
            Active::Probe | Active::None => Check::Probe,
        }
    }
}

#[cfg(test)]
mod tests;
