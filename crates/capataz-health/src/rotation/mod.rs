//! Which backends of a pool get new requests, and with what weight: the engine's verdicts
//! ([`Pool`]) with what operators and the pool's policy add on top. Pure, like the rest of the
//! engine: `now` is always an argument, and the caller sleeps until [`Rotation::poll_timeout`]
//! and then calls [`Rotation::handle_timeout`] for every timer (ejections ending, override TTLs
//! lapsing, slow-start steps).
//!
//! The rules, in order:
//! - A manual override wins: `up` puts a backend in rotation, `down` and `drain` take it out.
//!   Overrides never touch verdicts or streaks; when one is cleared or lapses, the verdict applies
//!   as it stands.
//! - Otherwise a backend is in rotation when its verdict is UP.
//! - With no backend in rotation the pool is "all down" and its policy applies. `fail_open`
//!   spreads traffic over the backends that were proven healthy once (UP at some point since
//!   they joined, or carried over from a reload as proven) and are under no override; gating
//!   wins over fail-open, so a backend that never passed its probes gets no traffic. With none
//!   left, the pool rejects requests (503) and says so.
//! - With slow start, a backend that becomes UP (or joins by a reload straight into rotation)
//!   ramps from 10 % to 100 % of its weight.
//!
//! Events come out in causal order: an override or a transition first, then the all-down or
//! recovered event it caused. Entering all-down is reported again when the policy applied
//! changes while the pool stays all down (an operator drains the last proven backends, say).

pub mod agent;
mod event;
mod policy;
pub mod ramp;

use std::collections::VecDeque;
use std::time::Duration;

pub use agent::{AgentChange, AgentHold, AgentReport, AgentState};
pub use event::{
    ActiveChange, AllDown, Effective, Event, Override, OverrideCause, OverrideChange, OverrideKind,
};
pub use policy::{Carried, Eligible, Join, Policy, WhenAllDown};

use crate::cadence::Cadence;
use crate::pool::{Pool, Settings, State};
use crate::probe::ProbeOutcome;
use crate::rules::{ProbeResult, TrafficResult};
use crate::status::Outcome;

#[derive(Clone, Copy, Debug)]
struct Member {
    weight: u32,
    proven: bool,
    override_: Option<Override>,
    ramp_since: Option<Duration>,
    agent: AgentState,
}

/// One pool's eligibility: its [`Pool`], its overrides, its slow starts, its all-down policy.
#[derive(Clone, Debug)]
pub struct Rotation {
    pool: Pool,
    policy: Policy,
    members: Vec<Member>,
    /// How many members carry an override.
    overridden: usize,
    /// How many members their agent holds out.
    agent_held: usize,
    all_down: Option<AllDown>,
    events: VecDeque<Event>,
    now: Duration,
}

impl Rotation {
    /// A rotation of the backends `joins` (each with its configured weight), at `now`. If the
    /// pool starts all down, the first event says so.
    pub fn new(
        settings: Settings,
        policy: Policy,
        joins: impl IntoIterator<Item = (u32, Join)>,
        now: Duration,
    ) -> Rotation {
        let mut rotation = Rotation {
            pool: Pool::new(settings, 0),
            policy,
            members: Vec::new(),
            overridden: 0,
            agent_held: 0,
            all_down: None,
            events: VecDeque::new(),
            now,
        };
        for (weight, join) in joins {
            let member = match join {
                Join::New { initial, warm_up } => {
                    rotation.pool.push(initial);
                    let up = initial == State::Up;
                    Member {
                        weight,
                        proven: up,
                        override_: None,
                        ramp_since: (up && warm_up && policy.slow_start.is_some()).then_some(now),
                        agent: AgentState::default(),
                    }
                }
                Join::Kept(carried) => {
                    rotation.pool.push_health(carried.health);
                    Member {
                        weight,
                        proven: carried.proven || carried.health.verdict() == State::Up,
                        override_: carried.override_,
                        ramp_since: carried.ramp_since.filter(|_| policy.slow_start.is_some()),
                        agent: carried.agent,
                    }
                }
            };
            rotation.overridden += usize::from(member.override_.is_some());
            rotation.agent_held += usize::from(member.agent.holds_out());
            rotation.members.push(member);
        }
        rotation.settle_all_down(now);
        rotation
    }

    /// The verdicts.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The pool-level policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The number of backends.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the pool has no backend.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The override on `backend`, if any. Panics if `backend` is not an index of this pool.
    pub fn override_of(&self, backend: usize) -> Option<Override> {
        self.members[backend].override_
    }

    /// Whether `backend` was ever proven healthy (fail-open may use it).
    pub fn is_proven(&self, backend: usize) -> bool {
        self.members[backend].proven
    }

    /// The effective state of `backend`: its verdict, or what its override makes of it.
    pub fn effective(&self, backend: usize) -> Effective {
        let kind = self.members[backend].override_.map(|o| o.kind);
        Effective::of(self.pool.verdict(backend), kind)
    }

    /// What `backend`'s agent last said. Panics if `backend` is not an index.
    pub fn agent(&self, backend: usize) -> AgentState {
        self.members[backend].agent
    }

    /// Whether `backend` is in rotation by its own standing (override, agent or verdict),
    /// outside any all-down policy. An override wins; without one, an agent hold keeps the
    /// backend out whatever its verdict.
    pub fn in_rotation(&self, backend: usize) -> bool {
        let member = &self.members[backend];
        if member.override_.is_none() && member.agent.holds_out() {
            return false;
        }
        self.effective(backend).in_rotation()
    }

    /// The all-down policy applied now, or `None` while a backend is in rotation.
    pub fn all_down(&self) -> Option<AllDown> {
        self.all_down
    }

    /// Whether a traffic outcome of `backend` can change anything: see [`Pool::needs_traffic`].
    pub fn needs_traffic(&self, backend: usize) -> bool {
        self.pool.needs_traffic(backend)
    }

    /// What `backend` carries into the next rotation on a reload.
    pub fn carry(&self, backend: usize) -> Carried {
        let member = &self.members[backend];
        Carried {
            health: *self.pool.backend(backend),
            proven: member.proven,
            override_: member.override_,
            ramp_since: member.ramp_since,
            agent: member.agent,
        }
    }

    /// The weight of `backend` at `now`, in tenths of the configured unit (lower while it
    /// ramps, and scaled by the weight its agent reports).
    pub fn weight_tenths(&self, backend: usize, now: Duration) -> u32 {
        let member = &self.members[backend];
        let tenths = match (member.ramp_since, self.policy.slow_start) {
            (Some(since), Some(ramp)) => ramp::weight_tenths(member.weight, since, ramp, now),
            _ => ramp::full_tenths(member.weight),
        };
        member.agent.scale(tenths)
    }

    /// The backends new requests may go to at `now`, with their weights: the ones in rotation,
    /// or when there are none, the all-down policy's choice (possibly nobody).
    pub fn eligible(&self, now: Duration) -> Eligible {
        let backends: Vec<usize> = match self.all_down {
            None => (0..self.len()).filter(|&i| self.in_rotation(i)).collect(),
            Some(AllDown::FailOpen { .. }) => (0..self.len())
                .filter(|&i| self.may_fail_open_to(i))
                .collect(),
            Some(AllDown::Reject | AllDown::NoneToFailOpen { .. }) => Vec::new(),
        };
        let weights = backends
            .iter()
            .map(|&i| self.weight_tenths(i, now))
            .collect();
        Eligible {
            backends,
            weights,
            all_down: self.all_down.is_some(),
        }
    }

    /// Records a probe outcome for `backend` at `now` (an [`Outcome`], or a [`ProbeOutcome`]
    /// with the answer's content match). Panics if `backend` is not an index.
    #[inline(always)]
    pub fn handle_probe(
        &mut self,
        backend: usize,
        probe: impl Into<ProbeOutcome>,
        now: Duration,
    ) -> ProbeResult {
        self.advance(now);
        let probe = probe.into();
        let outcome = probe.outcome;
        let active_before = self.pool.backend(backend).active.state;
        let (result, transition) = self.pool.probe(backend, probe, now);
        match transition {
            Some(transition) => self.on_transitions(&[transition], now),
            None => {
                let active = self.pool.backend(backend).active;
                if active.state != active_before {
                    let streak = match active.state {
                        State::Up => active.pass_streak,
                        State::Down => active.fail_streak,
                    };
                    self.events.push_back(Event::ActiveChange(ActiveChange {
                        backend,
                        state: active.state,
                        streak,
                        last: outcome,
                        at: now,
                    }));
                }
            }
        }
        result
    }

    /// Records the active state of the backend `backend` tracks (HAProxy's `track`), at `now`:
    /// its active side follows it. Returns the backend's verdict after. Panics if `backend` is
    /// not an index.
    pub fn handle_tracked(&mut self, backend: usize, state: State, now: Duration) -> State {
        self.advance(now);
        if let Some(transition) = self.pool.track(backend, state, now) {
            self.on_transitions(&[transition], now);
        }
        self.pool.verdict(backend)
    }

    /// Which probe interval applies to `backend` now: see [`Cadence`]. Panics if `backend` is
    /// not an index.
    pub fn cadence(&self, backend: usize) -> Cadence {
        self.pool.cadence(backend)
    }

    /// Records a traffic outcome for `backend` at `now`. Panics if `backend` is not an index.
    #[inline(always)]
    pub fn handle_traffic(
        &mut self,
        backend: usize,
        outcome: Outcome,
        now: Duration,
    ) -> TrafficResult {
        self.advance(now);
        let (result, transition) = self.pool.observe(backend, outcome, now);
        if let Some(transition) = transition {
            self.on_transitions(&[transition], now);
        }
        result
    }

    /// Records what `backend`'s agent answered at `now` (a parsed line; a failed exchange is
    /// no input at all) and returns the agent state now in force. A change is reported as an
    /// [`Event::Agent`], followed by the all-down or recovered event it causes. The agent never
    /// touches verdicts or streaks. Panics if `backend` is not an index.
    pub fn handle_agent(
        &mut self,
        backend: usize,
        report: AgentReport,
        now: Duration,
    ) -> AgentState {
        self.advance(now);
        let from = self.members[backend].agent;
        let to = from.after(report);
        if to == from {
            return to;
        }
        self.agent_held =
            self.agent_held - usize::from(from.holds_out()) + usize::from(to.holds_out());
        self.members[backend].agent = to;
        self.events.push_back(Event::Agent(AgentChange {
            backend,
            from,
            to,
            in_rotation: self.in_rotation(backend),
            at: now,
        }));
        self.settle_all_down(now);
        to
    }

    /// Sets (`Some`) or clears (`None`) the manual override on `backend` at `now`, for `ttl` or
    /// until cleared, and returns its new effective state. A TTL too long to represent never
    /// lapses. Panics if `backend` is not an index.
    pub fn set_override(
        &mut self,
        backend: usize,
        kind: Option<OverrideKind>,
        ttl: Option<Duration>,
        now: Duration,
    ) -> Effective {
        self.advance(now);
        self.change_override(backend, kind, ttl, OverrideCause::Operator, now)
    }

    /// When the next timer is due: an ejection ending, an override lapsing, a slow-start step.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let ejections = self.pool.next_expiry();
        let overrides = self
            .members
            .iter()
            .filter_map(|m| m.override_.and_then(|o| o.until));
        let ramps = self.members.iter().filter_map(|m| {
            let (since, ramp) = (m.ramp_since?, self.policy.slow_start?);
            Some(ramp::next_step(since, ramp, self.now))
        });
        ejections.into_iter().chain(overrides).chain(ramps).min()
    }

    /// Runs every timer due by `now`: ejections end (into probation), overrides lapse, ramps
    /// finish. Slow-start weights change with time alone, so the caller rebuilds its snapshot
    /// from [`Rotation::eligible`] after every call.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.advance(now);
        let mut transitions = Vec::new();
        self.pool.tick(now, &mut transitions);
        self.on_transitions(&transitions, now);
        for backend in 0..self.members.len() {
            let lapsed = self.members[backend]
                .override_
                .is_some_and(|o| o.until.is_some_and(|until| until <= now));
            if lapsed {
                self.change_override(backend, None, None, OverrideCause::Lapsed, now);
            }
            let member = &mut self.members[backend];
            if let (Some(since), Some(ramp)) = (member.ramp_since, self.policy.slow_start) {
                if ramp::end(since, ramp) <= now {
                    member.ramp_since = None;
                }
            }
        }
    }

    /// Whether events are waiting for [`Rotation::poll_event`].
    #[inline]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event, oldest first.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn advance(&mut self, now: Duration) {
        self.now = self.now.max(now);
    }

    fn may_fail_open_to(&self, backend: usize) -> bool {
        let member = &self.members[backend];
        member.proven && member.override_.is_none() && !member.agent.holds_out()
    }

    fn on_transitions(&mut self, transitions: &[crate::Transition], now: Duration) {
        for transition in transitions {
            let member = &mut self.members[transition.backend];
            if transition.to == State::Up {
                member.proven = true;
                if self.policy.slow_start.is_some() {
                    member.ramp_since = Some(now);
                }
            }
            self.events.push_back(Event::Transition(*transition));
        }
        if !transitions.is_empty() {
            self.settle_all_down(now);
        }
    }

    fn change_override(
        &mut self,
        backend: usize,
        kind: Option<OverrideKind>,
        ttl: Option<Duration>,
        cause: OverrideCause,
        now: Duration,
    ) -> Effective {
        let from = self.effective(backend);
        let had = self.members[backend].override_.is_some();
        self.overridden = self.overridden - usize::from(had) + usize::from(kind.is_some());
        self.members[backend].override_ = kind.map(|kind| Override {
            kind,
            since: now,
            until: ttl.map(|ttl| now.saturating_add(ttl)),
        });
        let to = self.effective(backend);
        self.events.push_back(Event::Override(OverrideChange {
            backend,
            kind,
            ttl: ttl.filter(|_| kind.is_some()),
            from,
            to,
            cause,
            at: now,
        }));
        self.settle_all_down(now);
        to
    }

    /// Whether any backend is in rotation: without overrides, whether any verdict is UP (the
    /// pool counts them), so a transition costs no walk over the pool.
    fn any_in_rotation(&self) -> bool {
        if self.overridden == 0 && self.agent_held == 0 {
            return self.pool.healthy() > 0;
        }
        (0..self.len()).any(|i| self.in_rotation(i))
    }

    /// Works out whether the pool is all down and what it applies, and reports a change.
    fn settle_all_down(&mut self, now: Duration) {
        let next = if self.any_in_rotation() {
            None
        } else {
            Some(self.applied_all_down())
        };
        match (self.all_down, next) {
            (None, Some(applied)) => self.events.push_back(Event::AllDown { applied, at: now }),
            (Some(before), Some(applied)) if before != applied => {
                self.events.push_back(Event::AllDown { applied, at: now });
            }
            (Some(_), None) => self.events.push_back(Event::Recovered { at: now }),
            _ => {}
        }
        self.all_down = next;
    }

    fn applied_all_down(&self) -> AllDown {
        match self.policy.when_all_down {
            WhenAllDown::Reject => AllDown::Reject,
            WhenAllDown::FailOpen => {
                let backends = (0..self.len())
                    .filter(|&i| self.may_fail_open_to(i))
                    .count();
                if backends > 0 {
                    return AllDown::FailOpen {
                        backends,
                        of: self.len(),
                    };
                }
                // A backend its agent holds out counts as overridden here.
                let overridden = self
                    .members
                    .iter()
                    .filter(|m| m.override_.is_some() || m.agent.holds_out())
                    .count();
                AllDown::NoneToFailOpen {
                    overridden,
                    unproven: self.len() - overridden,
                }
            }
        }
    }
}
