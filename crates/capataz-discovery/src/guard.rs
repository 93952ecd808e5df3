//! [`Guard`]: what of a source's answers reaches the pool. Pure: answers in, a verdict out.

use std::collections::HashSet;

use capataz_config::BackendConfig;
use capataz_events::MembershipChange;

/// One pool's membership guard.
#[derive(Debug)]
pub struct Guard {
    /// The membership in force (`None` before the first answer).
    current: Option<Vec<BackendConfig>>,
    /// A large drop held for confirmation.
    held: bool,
    /// Whether the source is failing (a `Failing` event was said, `Restored` not yet).
    failing: bool,
    /// The share of the pool (percent) one answer may remove without being held.
    max_drop_percent: u8,
}

/// What the guard decided about one answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The membership to put in force, if it changes.
    pub apply: Option<Vec<BackendConfig>>,
    /// What to tell (the `Updated` event comes from whoever applies it, with its counts).
    pub changes: Vec<MembershipChange>,
}

impl Guard {
    /// A guard over `current` (`None`: no answer yet, the first one is applied whatever it
    /// says).
    pub fn new(current: Option<Vec<BackendConfig>>, max_drop_percent: u8) -> Guard {
        Guard {
            current,
            held: false,
            failing: false,
            max_drop_percent,
        }
    }

    /// Whether a drop is held now.
    pub fn holding(&self) -> bool {
        self.held
    }

    /// An answer with the whole membership.
    pub fn handle_members(&mut self, members: Vec<BackendConfig>) -> Verdict {
        let mut verdict = Verdict::default();
        if std::mem::take(&mut self.failing) {
            verdict.changes.push(MembershipChange::Restored {
                kept: self.current.as_ref().map_or(0, Vec::len),
            });
        }
        let Some(current) = &self.current else {
            self.current = Some(members.clone());
            verdict.apply = Some(members);
            return verdict;
        };
        if same(current, &members) {
            self.held = false;
            return verdict;
        }
        let (from, to) = (current.len(), members.len());
        let dropped = from.saturating_sub(to);
        let large = dropped * 100 > usize::from(self.max_drop_percent) * from;
        if large {
            if !self.held {
                self.held = true;
                verdict
                    .changes
                    .push(MembershipChange::DropHeld { from, to });
                return verdict;
            }
            verdict
                .changes
                .push(MembershipChange::DropConfirmed { from, to });
        }
        self.held = false;
        self.current = Some(members.clone());
        verdict.apply = Some(members);
        verdict
    }

    /// A failed answer: the membership stays; said once per run of failures.
    pub fn handle_failure(&mut self, error: String) -> Verdict {
        let mut verdict = Verdict::default();
        if !self.failing {
            self.failing = true;
            verdict.changes.push(MembershipChange::Failing {
                error,
                kept: self.current.as_ref().map_or(0, Vec::len),
            });
        }
        verdict
    }
}

/// Whether two memberships have the same backends (name, address, weight and role).
fn same(a: &[BackendConfig], b: &[BackendConfig]) -> bool {
    let key = |m: &BackendConfig| (m.name.clone(), m.address.clone(), m.weight, m.backup);
    a.len() == b.len() && a.iter().map(key).collect::<HashSet<_>>() == b.iter().map(key).collect()
}
