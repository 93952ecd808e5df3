//! A backend's own standing, apart from its verdict and its override: requalifying after
//! maintenance (passing probes counted apart from the health streaks, so the verdict and the
//! streaks are never touched) and a drain its health route asked for (`disable_on_404`).
//! Each change is reported as an [`Event::Standing`], before the pool-level event it causes.

use std::time::Duration;

use super::{AgentHold, Event, Member, OverrideKind, Rotation, StandingCause, StandingChange};
use crate::rules::ProbeResult;
use crate::status::Outcome;

impl Rotation {
    /// In maintenance: by an operator's override, or by its agent's `maint` when no override
    /// says otherwise.
    pub(super) fn in_maintenance(&self, backend: usize) -> bool {
        let member = &self.members[backend];
        match member.override_ {
            Some(o) => o.kind == OverrideKind::Maintenance,
            None => member.agent.hold == Some(AgentHold::Maint),
        }
    }

    /// After an override or agent change: entering maintenance forgets a requalification;
    /// leaving it (`was` in maintenance) starts one, unless the pool needs no probes for it.
    pub(super) fn maintenance_changed(&mut self, backend: usize, was: bool) {
        let now_in = self.in_maintenance(backend);
        let needs = self.policy.requalify_passes != Some(0);
        let member = &mut self.members[backend];
        if now_in {
            member.requalify = None;
        } else if was && needs {
            // Leaving maintenance: no traffic before the probes say it is back.
            member.requalify = Some(0);
        }
    }

    /// Passing probes in a row a backend needs after maintenance before traffic (0: none).
    pub fn requalify_passes(&self) -> u32 {
        self.policy
            .requalify_passes
            .unwrap_or(self.pool.settings().rise.get())
    }

    /// What a judged probe does to a drain requested by the health route and to a
    /// requalification; returns whether anything changed.
    pub(super) fn after_probe(
        &mut self,
        backend: usize,
        result: ProbeResult,
        outcome: Outcome,
        now: Duration,
    ) -> bool {
        let member = self.members[backend];
        let mut changed = false;
        if result == ProbeResult::Pass && member.self_drained {
            let cause = StandingCause::DrainEnded { last: outcome };
            self.change_standing(backend, |m| m.self_drained = false, cause, now);
            changed = true;
        }
        let Some(has) = member.requalify else {
            return changed;
        };
        let need = self.requalify_passes();
        let next = match result {
            ProbeResult::Pass => has.saturating_add(1),
            ProbeResult::Fail => 0,
            ProbeResult::Drain => has,
        };
        if next >= need {
            let cause = StandingCause::Requalified { passes: need };
            self.change_standing(backend, |m| m.requalify = None, cause, now);
            changed = true;
        } else {
            self.members[backend].requalify = Some(next);
        }
        changed
    }

    /// Changes a member's own standing (requalifying, drained on request) and reports it.
    pub(super) fn change_standing(
        &mut self,
        backend: usize,
        change: impl FnOnce(&mut Member),
        cause: StandingCause,
        now: Duration,
    ) {
        let from = self.effective(backend);
        let held_before = self.members[backend].held();
        change(&mut self.members[backend]);
        let held_after = self.members[backend].held();
        self.held = self.held - usize::from(held_before) + usize::from(held_after);
        let to = self.effective(backend);
        self.events.push_back(Event::Standing(StandingChange {
            backend,
            from,
            to,
            cause,
            at: now,
        }));
    }
}
