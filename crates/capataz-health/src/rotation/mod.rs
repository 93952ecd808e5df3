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
//! - Maintenance (an override) also stops probes ([`Rotation::wants_probes`]; a result that
//!   still arrives is ignored), and on leaving it the backend requalifies: out of rotation until
//!   `requalify_passes` probes in a row pass (`rise` by default), counted apart from the streaks.
//! - With `disable_on_404`, a probe answered `404` is a drain request, not a failure: no streak
//!   moves, the backend leaves rotation (in-flight requests finish), and the next passing probe
//!   brings it back at once (a DOWN backend still needs its `rise`).
//! - Backups (`Role::Backup`) get traffic only while no primary is in rotation: the first one
//!   in rotation, or all of them (`BackupUse`). The all-down policy applies only when the
//!   backups are out too; while some but too few primaries are in rotation (the minimum healthy
//!   share, `MinHealthy`) and the policy is `fail_open`, the pool fails open over its primaries.
//!   See `serving.rs`.
//! - With `close_tunnels_on_down`, a verdict going DOWN is followed by
//!   [`Event::CloseTunnels`]: the runtime closes the backend's upgraded connections.
//!
//! Events come out in causal order: an override or a transition first, then the all-down or
//! recovered event it caused. Entering all-down is reported again when the policy applied
//! changes while the pool stays all down (an operator drains the last proven backends, say).

pub mod agent;
mod event;
mod policy;
pub mod ramp;
mod serving;
mod shedding;
mod standing;
mod standing_view;

use std::collections::VecDeque;
use std::time::Duration;

pub use agent::{AgentChange, AgentHold, AgentReport, AgentState};
pub use event::{
    ActiveChange, AllDown, Effective, Event, OnBackups, Override, OverrideCause, OverrideChange,
    OverrideKind, StandingCause, StandingChange,
};
pub use policy::{BackupUse, Carried, Eligible, Join, MinHealthy, Policy, Role, WhenAllDown};
pub use shedding::{LoadShedding, Shed, ShedChange};
pub use standing_view::{Back, Cause, DownWhy, Probation, ProbesDown, Standing};

use crate::cadence::Cadence;
use crate::fleet::Published;
use crate::outliers::{LatencyWindow, SuccessWindow};
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
    role: Role,
    /// Passing probes in a row since leaving maintenance; `None` unless requalifying.
    requalify: Option<u32>,
    /// Its health route answered `404` (with `disable_on_404`) and no probe passed since.
    self_drained: bool,
    /// What its agent last said.
    agent: AgentState,
    /// The load shed it asked for, while it lasts.
    shed: Option<Shed>,
    /// Since when its verdict holds: its last transition, or when it joined.
    since: Duration,
    /// Its last verdict change (with its index in this rotation).
    last: Option<crate::Transition>,
    /// Whether it tracks another backend's active state ([`Rotation::set_tracks`]).
    tracks: bool,
}

impl Member {
    /// Held out of rotation by itself (requalifying, draining on request, or held by its
    /// agent), not by health.
    fn held(&self) -> bool {
        self.requalify.is_some() || self.self_drained || self.agent.holds_out()
    }
}

/// One pool's eligibility: its [`Pool`], its overrides, its slow starts, its all-down policy.
#[derive(Clone, Debug)]
pub struct Rotation {
    pool: Pool,
    policy: Policy,
    members: Vec<Member>,
    /// How many members carry an override.
    overridden: usize,
    /// How many members are [`Member::held`].
    held: usize,
    /// How many members are backups.
    backups: usize,
    all_down: Option<AllDown>,
    on_backups: Option<OnBackups>,
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
        let joins = joins
            .into_iter()
            .map(|(weight, join)| (weight, join, Role::Primary));
        Rotation::with_roles(settings, policy, joins, now)
    }

    /// [`Rotation::new`] with each backend's [`Role`]: backups serve only while no primary is
    /// in rotation.
    pub fn with_roles(
        settings: Settings,
        policy: Policy,
        joins: impl IntoIterator<Item = (u32, Join, Role)>,
        now: Duration,
    ) -> Rotation {
        let mut rotation = Rotation {
            pool: Pool::new(settings, 0),
            policy,
            members: Vec::new(),
            overridden: 0,
            held: 0,
            backups: 0,
            all_down: None,
            on_backups: None,
            events: VecDeque::new(),
            now,
        };
        for (weight, join, role) in joins {
            let member = match join {
                Join::New { initial, warm_up } => {
                    rotation.pool.push(initial);
                    let up = initial == State::Up;
                    Member {
                        weight,
                        proven: up,
                        override_: None,
                        ramp_since: (up && warm_up && policy.slow_start.is_some()).then_some(now),
                        role,
                        requalify: None,
                        self_drained: false,
                        agent: AgentState::default(),
                        shed: None,
                        since: now,
                        last: None,
                        tracks: false,
                    }
                }
                Join::Kept(carried) => {
                    rotation.pool.push_health(carried.health);
                    Member {
                        weight,
                        proven: carried.proven || carried.health.verdict() == State::Up,
                        override_: carried.override_,
                        ramp_since: carried.ramp_since.filter(|_| policy.slow_start.is_some()),
                        role,
                        // A pool without probes to wait for readmits at once.
                        requalify: carried
                            .requalify
                            .filter(|_| policy.requalify_passes != Some(0)),
                        // A pool that no longer drains on 404 forgets the request.
                        self_drained: carried.self_drained && policy.disable_on_404,
                        agent: carried.agent,
                        // A shed does not outlive a reload: the backend asks again if it must.
                        shed: None,
                        since: carried.since,
                        last: carried.last.map(|t| crate::Transition {
                            backend: rotation.members.len(),
                            ..t
                        }),
                        tracks: false,
                    }
                }
            };
            rotation.overridden += usize::from(member.override_.is_some());
            rotation.held += usize::from(member.held());
            rotation.backups += usize::from(member.role == Role::Backup);
            rotation.members.push(member);
        }
        rotation.settle(now);
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

    /// The role of `backend`. Panics if `backend` is not an index of this pool.
    pub fn role(&self, backend: usize) -> Role {
        self.members[backend].role
    }

    /// Passing probes in a row `backend` has since it left maintenance, while it requalifies,
    /// and how many it needs. Panics if `backend` is not an index of this pool.
    pub fn requalifying(&self, backend: usize) -> Option<(u32, u32)> {
        let has = self.members[backend].requalify?;
        Some((has, self.requalify_passes()))
    }

    /// Whether the runtime should probe `backend` now: not while it is in maintenance. Panics if
    /// `backend` is not an index of this pool.
    pub fn wants_probes(&self, backend: usize) -> bool {
        !self.in_maintenance(backend)
    }

    /// The backups serving now, if no primary is in rotation and some backup is.
    pub fn on_backups(&self) -> Option<OnBackups> {
        self.on_backups
    }

    /// The effective state of `backend`: what its override makes of it, else `MAINTENANCE` if
    /// its agent said `maint`, else requalifying after maintenance, else `DOWN` if its agent
    /// said `down`, else its verdict, `SELF_DRAINING` for an UP verdict whose health route or
    /// agent asked for a drain.
    pub fn effective(&self, backend: usize) -> Effective {
        let member = &self.members[backend];
        if let Some(o) = member.override_ {
            return Effective::of(State::Up, Some(o.kind));
        }
        if member.agent.hold == Some(AgentHold::Maint) {
            return Effective::Maintenance;
        }
        if member.requalify.is_some() {
            return Effective::Requalifying;
        }
        if member.agent.hold == Some(AgentHold::Down) {
            return Effective::Down;
        }
        match self.pool.verdict(backend) {
            State::Up if member.self_drained || member.agent.holds_out() => Effective::SelfDraining,
            verdict => Effective::of(verdict, None),
        }
    }

    /// What `backend`'s agent last said. Panics if `backend` is not an index.
    pub fn agent(&self, backend: usize) -> AgentState {
        self.members[backend].agent
    }

    /// Whether `backend` is in rotation by its own standing (override, agent, requalification,
    /// drain on request, verdict: [`Rotation::effective`]), outside any all-down policy. An
    /// override wins; without one, an agent hold keeps the backend out whatever its verdict.
    pub fn in_rotation(&self, backend: usize) -> bool {
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
            requalify: member.requalify,
            self_drained: member.self_drained,
            agent: member.agent,
            since: member.since,
            last: member.last,
        }
    }

    /// Says whether `backend` tracks another backend's active state (HAProxy's `track`, fed by
    /// [`Rotation::handle_tracked`]): its [`Standing`] then says so. Panics if `backend` is not
    /// an index.
    pub fn set_tracks(&mut self, backend: usize, tracks: bool) {
        self.members[backend].tracks = tracks;
    }

    /// The weight of `backend` at `now`, in tenths of the configured unit (lower while it
    /// ramps, and scaled by the weight its agent reports and by a load shed). It changes with
    /// time only at the steps [`Rotation::poll_timeout`] announces, so a snapshot of it built
    /// at each timeout is exact until the next.
    pub fn weight_tenths(&self, backend: usize, now: Duration) -> u32 {
        let member = &self.members[backend];
        let tenths = match (member.ramp_since, self.policy.slow_start) {
            (Some(since), Some(ramp)) => ramp::weight_tenths(member.weight, since, ramp, now),
            _ => ramp::full_tenths(member.weight),
        };
        let tenths = member.agent.scale(tenths);
        // A shed lasts until the timeout at its end clears it (and says so in an event), not
        // until a clock reading passes it: the weight and the shed reported are one state.
        match (member.shed, self.policy.load_shedding) {
            (Some(_), Some(shedding)) => shedding.scaled(tenths),
            _ => tenths,
        }
    }

    /// Whether `backend`'s slow start is under way as of the last input: its weight is below
    /// the one its agent and any load shed leave it, and rises at the steps
    /// [`Rotation::poll_timeout`] announces. Panics if `backend` is not an index.
    pub fn ramping(&self, backend: usize) -> bool {
        match (self.members[backend].ramp_since, self.policy.slow_start) {
            (Some(since), Some(ramp)) => ramp::end(since, ramp) > self.now,
            _ => false,
        }
    }

    /// The load shed `backend` asked for, while it lasts. Panics if `backend` is not an index.
    pub fn shed(&self, backend: usize) -> Option<Shed> {
        self.members[backend].shed
    }

    /// Records that `backend` answered `status` (`429`, or `503` with `Retry-After`) asking
    /// for `retry_after` of relief, at `now`: with [`Policy::load_shedding`], its weight is
    /// scaled down until `now + min(retry_after, max)` and the answer is not judged as traffic
    /// at all; returns true. A shed already under way is extended (never shortened) without a
    /// new event; a new one is reported as an [`Event::Shedding`]. Without load shedding this
    /// does nothing and returns false (the caller then judges the answer as traffic). Panics if
    /// `backend` is not an index.
    pub fn handle_shed(
        &mut self,
        backend: usize,
        status: u16,
        retry_after: Duration,
        now: Duration,
    ) -> bool {
        let Some(shedding) = self.policy.load_shedding else {
            return false;
        };
        self.advance(now);
        let duration = retry_after.min(shedding.max);
        if duration.is_zero() {
            // `Retry-After: 0` asks for no relief: a shedding answer (never judged) that
            // changes no weight. A shed of nothing would start and end at once, two events
            // and two snapshot rebuilds for every such answer.
            return true;
        }
        let until = now.saturating_add(duration);
        let member = &mut self.members[backend];
        match &mut member.shed {
            Some(shed) if shed.until > now => {
                if until > shed.until {
                    shed.until = until;
                    shed.duration = until.saturating_sub(now);
                }
            }
            slot => {
                let shed = Shed {
                    status,
                    duration,
                    until,
                    weight_percent: shedding.weight_percent,
                };
                *slot = Some(shed);
                self.events.push_back(Event::Shedding(ShedChange {
                    backend,
                    shed: Some(shed),
                    at: now,
                }));
            }
        }
        true
    }

    /// The backends new requests may go to at `now`, with their weights: the ones in rotation,
    /// or when there are none, the all-down policy's choice (possibly nobody); and every
    /// backend's weight, the one value the runtime both picks by and reports.
    pub fn eligible(&self, now: Duration) -> Eligible {
        let backends = self.serving_backends();
        let member_weights: Vec<u32> = (0..self.members.len())
            .map(|i| self.weight_tenths(i, now))
            .collect();
        let weights = backends.iter().map(|&i| member_weights[i]).collect();
        Eligible {
            draining: self.draining(),
            backends,
            weights,
            member_weights,
            all_down: self.all_down.is_some(),
            applied: self.all_down,
            on_backups: self.on_backups,
        }
    }

    /// The backends that drain while their verdict is UP: out of rotation for new clients
    /// only (an operator's drain, or one their health route or agent asked for), so they may
    /// keep serving the clients stuck to them (`on_drain = "keep"`). A draining backend whose
    /// verdict is DOWN is not among them: it serves nobody.
    pub fn draining(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| {
                matches!(
                    self.effective(i),
                    Effective::Draining | Effective::SelfDraining
                ) && self.pool.verdict(i) == State::Up
            })
            .collect()
    }

    /// Records a probe outcome for `backend` at `now` (an [`Outcome`], or a [`ProbeOutcome`]
    /// with the answer's content match). Panics if `backend` is not an index.
    #[inline(always)]
    ///
    /// A backend in maintenance ignores it (the probe rule's judgement is returned, nothing
    /// changes); with `disable_on_404`, a `404` is [`ProbeResult::Drain`] and moves no streak.
    pub fn handle_probe(
        &mut self,
        backend: usize,
        probe: impl Into<ProbeOutcome>,
        now: Duration,
    ) -> ProbeResult {
        self.advance(now);
        let probe = probe.into();
        let outcome = probe.outcome;
        if self.in_maintenance(backend) {
            return self.pool.settings().probe_rule.judge(outcome);
        }
        if self.policy.disable_on_404 && outcome == Outcome::Status(404) {
            if !self.members[backend].self_drained {
                self.change_standing(
                    backend,
                    |m| m.self_drained = true,
                    StandingCause::DrainRequested,
                    now,
                );
                self.settle(now);
            }
            return ProbeResult::Drain;
        }
        let active_before = self.pool.backend(backend).active.state;
        let (result, transition) = self.pool.probe(backend, probe, now);
        match transition {
            Some(transition) => self.record_transition(transition, now),
            None => {
                let active = self.pool.backend(backend).active;
                if active.state != active_before {
                    self.events.push_back(Event::ActiveChange(ActiveChange {
                        backend,
                        state: active.state,
                        streak: active.streak(),
                        last: outcome,
                        at: now,
                    }));
                }
            }
        }
        let standing = self.after_probe(backend, result, outcome, now);
        if transition.is_some() || standing {
            self.settle(now);
        }
        result
    }

    /// Records the active state of the backend `backend` tracks (HAProxy's `track`), at `now`:
    /// its active side follows it. Returns the backend's verdict after. Panics if `backend` is
    /// not an index.
    ///
    /// A tracking backend is never probed, so each reading stands in for a probe where probes
    /// matter to its own standing: in maintenance it is ignored (like a probe), and while the
    /// backend requalifies after maintenance a reading of `UP` counts as a passing probe and
    /// `DOWN` as a failing one.
    pub fn handle_tracked(&mut self, backend: usize, state: State, now: Duration) -> State {
        self.advance(now);
        if self.in_maintenance(backend) {
            return self.pool.verdict(backend);
        }
        let transition = self.pool.track(backend, state, now);
        if let Some(transition) = transition {
            self.record_transition(transition, now);
        }
        let standing = if self.members[backend].requalify.is_some() {
            let (result, last) = reading_as_probe(state);
            self.after_probe(backend, result, last, now)
        } else {
            false
        };
        if transition.is_some() || standing {
            self.settle(now);
        }
        self.pool.verdict(backend)
    }

    /// Records the active verdict the owner of `backend` published (shared probing: another
    /// member of the fleet group probes it), at `now`: its active side follows it, with
    /// [`Reason::Published`](crate::Reason::Published). Returns the backend's verdict after.
    /// Panics if `backend` is not an index.
    ///
    /// Like a tracked reading, a published verdict stands in for a probe: ignored in
    /// maintenance, counted as a pass (UP) or a failure (DOWN) while the backend requalifies.
    pub fn handle_published(
        &mut self,
        backend: usize,
        published: Published,
        now: Duration,
    ) -> State {
        self.advance(now);
        if self.in_maintenance(backend) {
            return self.pool.verdict(backend);
        }
        let transition = self.pool.publish(backend, published, now);
        if let Some(transition) = transition {
            self.record_transition(transition, now);
        }
        let standing = if self.members[backend].requalify.is_some() {
            let (result, last) = reading_as_probe(published.state);
            self.after_probe(backend, result, last, now)
        } else {
            false
        };
        if transition.is_some() || standing {
            self.settle(now);
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
            self.record_transition(transition, now);
            self.settle(now);
        }
        result
    }

    /// Judges one latency window of every backend at `now` (`windows[i]` is backend `i`'s):
    /// see [`Pool::latency_window`]. An ejection it causes is a transition like any other.
    pub fn handle_latency_window(&mut self, windows: &[LatencyWindow], now: Duration) {
        self.advance(now);
        let mut transitions = Vec::new();
        self.pool.latency_window(windows, now, &mut transitions);
        for &transition in &transitions {
            self.record_transition(transition, now);
        }
        if !transitions.is_empty() {
            self.settle(now);
        }
    }

    /// Judges one window of every backend's traffic outcomes at `now` (`windows[i]` is
    /// backend `i`'s): see [`Pool::success_window`].
    pub fn handle_success_window(&mut self, windows: &[SuccessWindow], now: Duration) {
        self.advance(now);
        let mut transitions = Vec::new();
        self.pool.success_window(windows, now, &mut transitions);
        for &transition in &transitions {
            self.record_transition(transition, now);
        }
        if !transitions.is_empty() {
            self.settle(now);
        }
    }

    /// Records what `backend`'s agent answered at `now` (a parsed line; a failed exchange is
    /// no input at all) and returns the agent state now in force. A change is reported as an
    /// [`Event::Agent`], followed by the backups, all-down or recovered event it causes. The
    /// agent never touches verdicts or streaks. Panics if `backend` is not an index.
    ///
    /// An agent `maint` is maintenance (as an operator's, which wins over it): no probes, and
    /// on leaving it (`up`/`ready`, or another hold) the backend requalifies. `drain` (or `0%`)
    /// is a drain like `disable_on_404`'s (`SELF_DRAINING` while the verdict is UP), lifted by
    /// `up`/`ready` alone; `down` shows the backend `DOWN` whatever its verdict.
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
        let was_maintenance = self.in_maintenance(backend);
        let held_before = self.members[backend].held();
        self.members[backend].agent = to;
        self.maintenance_changed(backend, was_maintenance);
        let held_after = self.members[backend].held();
        self.held = self.held - usize::from(held_before) + usize::from(held_after);
        self.events.push_back(Event::Agent(AgentChange {
            backend,
            from,
            to,
            in_rotation: self.in_rotation(backend),
            at: now,
        }));
        self.settle(now);
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
        let sheds = self.members.iter().filter_map(|m| m.shed.map(|s| s.until));
        ejections
            .into_iter()
            .chain(overrides)
            .chain(ramps)
            .chain(sheds)
            .min()
    }

    /// Runs every timer due by `now`: ejections end (into probation), overrides lapse, ramps
    /// finish. Slow-start weights change with time alone, so the caller rebuilds its snapshot
    /// from [`Rotation::eligible`] after every call.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.advance(now);
        let mut transitions = Vec::new();
        self.pool.tick(now, &mut transitions);
        for &transition in &transitions {
            self.record_transition(transition, now);
        }
        if !transitions.is_empty() {
            self.settle(now);
        }
        for backend in 0..self.members.len() {
            let lapsed = self.members[backend]
                .override_
                .is_some_and(|o| o.until.is_some_and(|until| until <= now));
            if lapsed {
                self.change_override(backend, None, None, OverrideCause::Lapsed, now);
            }
            let member = &mut self.members[backend];
            if member.shed.is_some_and(|shed| shed.until <= now) {
                member.shed = None;
                self.events.push_back(Event::Shedding(ShedChange {
                    backend,
                    shed: None,
                    at: now,
                }));
            }
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

    /// Records a verdict change (the caller settles the pool's state after).
    fn record_transition(&mut self, transition: crate::Transition, now: Duration) {
        let member = &mut self.members[transition.backend];
        member.since = now;
        member.last = Some(transition);
        if transition.to == State::Up {
            member.proven = true;
            if self.policy.slow_start.is_some() {
                member.ramp_since = Some(now);
            }
        }
        self.events.push_back(Event::Transition(transition));
        if transition.to == State::Down && self.policy.close_tunnels_on_down {
            self.events.push_back(Event::CloseTunnels {
                backend: transition.backend,
                at: now,
            });
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
        let was_maintenance = self.in_maintenance(backend);
        self.overridden = self.overridden - usize::from(had) + usize::from(kind.is_some());
        let held_before = self.members[backend].held();
        let member = &mut self.members[backend];
        member.override_ = kind.map(|kind| Override {
            kind,
            since: now,
            until: ttl.map(|ttl| now.saturating_add(ttl)),
        });
        self.maintenance_changed(backend, was_maintenance);
        let held_after = self.members[backend].held();
        self.held = self.held - usize::from(held_before) + usize::from(held_after);
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
        self.settle(now);
        to
    }
}

/// What an active state read elsewhere (a tracked backend's, an owner's published verdict)
/// counts as where a probe of the backend itself would count (requalifying after
/// maintenance): UP a pass, DOWN a failure.
fn reading_as_probe(state: State) -> (ProbeResult, Outcome) {
    match state {
        State::Up => (ProbeResult::Pass, Outcome::Status(200)),
        State::Down => (ProbeResult::Fail, Outcome::Refused),
    }
}
