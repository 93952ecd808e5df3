//! Who serves a pool: its primaries in rotation, its backups while no primary is, or the
//! all-down policy (which also covers "too few primaries", below the minimum healthy share).
//!
//! The rule, in order (`in rotation` is a backend's own standing: override, requalification,
//! drain on request, verdict):
//! 1. At least `needed` primaries in rotation ([`MinHealthy::needed`], 1 by default): they serve.
//! 2. Some primaries in rotation, but fewer than `needed`, and the policy is `fail_open`: the pool
//!    fails open over its primaries ([`AllDown::BelowMinHealthy`]): those in rotation and those
//!    fail-open may use. Backups stay out: they stand in only for no primary at all. (With
//!    `reject` the threshold does not apply: a pool never rejects while a primary is in
//!    rotation.)
//! 3. No primary in rotation, some backup in rotation: the first backup in pool order serves, or
//!    every backup in rotation with [`BackupUse::All`].
//! 4. Nothing in rotation: the all-down policy, over every backend (primaries and backups).
//!
//! Fail-open may use a backend proven healthy once and held out by nothing but health checks:
//! no override, not requalifying after maintenance, not drained on its health route's request.
//!
//! Changes are reported in causal order after the event that caused them, leaving events
//! first: backups handing back, then the pool recovering; then backups taking over (again, when
//! the serving ones change), then the all-down policy (again, when what it applies changes).

use std::time::Duration;

use super::{AllDown, BackupUse, Event, OnBackups, Role, Rotation, WhenAllDown};

/// Who serves, as [`Rotation::settle`] works it out.
struct Serving {
    on_backups: Option<OnBackups>,
    all_down: Option<AllDown>,
}

impl Rotation {
    /// Works out who serves the pool and reports what changed.
    pub(super) fn settle(&mut self, now: Duration) {
        let Serving {
            on_backups,
            all_down,
        } = self.serving();
        if self.on_backups.is_some() && on_backups.is_none() {
            self.events.push_back(Event::Backups {
                on: None,
                serving: Vec::new(),
                to_primaries: all_down.is_none(),
                at: now,
            });
        }
        if self.all_down.is_some() && all_down.is_none() {
            self.events.push_back(Event::Recovered { at: now });
        }
        if let Some(on) = on_backups.filter(|_| on_backups != self.on_backups) {
            self.events.push_back(Event::Backups {
                on: on_backups,
                serving: self.backups_serving(on),
                to_primaries: false,
                at: now,
            });
        }
        if let Some(applied) = all_down {
            if self.all_down != Some(applied) {
                self.events.push_back(Event::AllDown { applied, at: now });
            }
        }
        self.on_backups = on_backups;
        self.all_down = all_down;
    }

    /// The backends new requests go to now, in pool order (see the module's rule).
    pub(super) fn serving_backends(&self) -> Vec<usize> {
        let all = 0..self.len();
        match (self.on_backups, self.all_down) {
            (Some(on), _) => self.backups_serving(on),
            (None, None) => all
                .filter(|&i| self.members[i].role == Role::Primary && self.in_rotation(i))
                .collect(),
            (None, Some(AllDown::BelowMinHealthy { .. })) => all
                .filter(|&i| {
                    self.members[i].role == Role::Primary
                        && (self.in_rotation(i) || self.may_fail_open_to(i))
                })
                .collect(),
            (None, Some(AllDown::FailOpen { .. })) => {
                all.filter(|&i| self.may_fail_open_to(i)).collect()
            }
            (None, Some(AllDown::Reject | AllDown::NoneToFailOpen { .. })) => Vec::new(),
        }
    }

    /// The backups that serve while `on` (no primary in rotation), in pool order.
    fn backups_serving(&self, on: OnBackups) -> Vec<usize> {
        match self.policy.backups {
            BackupUse::First => vec![on.first],
            BackupUse::All => (0..self.len())
                .filter(|&i| self.is_backup_in_rotation(i))
                .collect(),
        }
    }

    fn serving(&self) -> Serving {
        let primaries = self.len() - self.backups;
        let up = self.primaries_in_rotation();
        let needed = self.policy.min_healthy.needed(primaries);
        let fails_open = self.policy.when_all_down == WhenAllDown::FailOpen;
        let none = Serving {
            on_backups: None,
            all_down: None,
        };
        if up >= needed || (up > 0 && !fails_open) {
            return none;
        }
        if up > 0 {
            let backends = (0..self.len())
                .filter(|&i| {
                    self.members[i].role == Role::Primary
                        && (self.in_rotation(i) || self.may_fail_open_to(i))
                })
                .count();
            return Serving {
                on_backups: None,
                all_down: Some(AllDown::BelowMinHealthy {
                    up,
                    needed,
                    threshold: self.policy.min_healthy,
                    backends,
                    primaries,
                }),
            };
        }
        if self.backups > 0 {
            let mut backups = (0..self.len()).filter(|&i| self.is_backup_in_rotation(i));
            if let Some(first) = backups.next() {
                let serving = match self.policy.backups {
                    BackupUse::First => 1,
                    BackupUse::All => 1 + backups.count(),
                };
                return Serving {
                    on_backups: Some(OnBackups { first, serving }),
                    all_down: None,
                };
            }
        }
        Serving {
            on_backups: None,
            all_down: Some(self.applied_all_down()),
        }
    }

    /// Primaries in rotation. In a plain pool (no override, nobody held, no backup) this is the
    /// pool's UP count, so a transition costs no walk over the pool; otherwise one walk.
    fn primaries_in_rotation(&self) -> usize {
        if self.overridden == 0 && self.held == 0 && self.backups == 0 {
            return self.pool.healthy();
        }
        (0..self.len())
            .filter(|&i| self.members[i].role == Role::Primary && self.in_rotation(i))
            .count()
    }

    fn is_backup_in_rotation(&self, backend: usize) -> bool {
        self.members[backend].role == Role::Backup && self.in_rotation(backend)
    }

    /// Whether fail-open may send traffic to `backend`: proven healthy once, and held out by
    /// nothing but health checks.
    pub(super) fn may_fail_open_to(&self, backend: usize) -> bool {
        let member = &self.members[backend];
        member.proven && member.override_.is_none() && !member.held()
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
                let overridden = self.overridden;
                let held = self
                    .members
                    .iter()
                    .filter(|m| m.override_.is_none() && m.held())
                    .count();
                AllDown::NoneToFailOpen {
                    overridden,
                    unproven: self.len() - overridden - held,
                    held,
                }
            }
        }
    }
}
