//! Debouncing, as a pure state machine: time is an argument.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::Alert;
use crate::events::Notice;

/// Debouncing per pool and backend, as a pure state machine: time is an argument.
///
/// Each pool and backend key has its own window. Pool-level events use the backend `""`. When a
/// key has no open window, an event alerts at once and opens a window of `window`. Events that
/// arrive while it is open are folded in, and only the latest one is kept. When the window
/// ends, [`Debouncer::flush_due`] checks whether the latest state differs from the last one
/// alerted. If it does, one summary alert goes out carrying the latest event and the number of
/// events folded, and it opens a new window. If it does not, the key goes quiet. So a backend
/// that flaps gets at most one alert per window, and the summary always ends on its current
/// state.
///
/// A state is a backend's `to` state (`UP`, `DOWN`, `DRAINING`, ...), or the event type for
/// pool-level events (`all_down`, `recovered`).
#[derive(Debug)]
pub(crate) struct Debouncer {
    window: Duration,
    keys: BTreeMap<(String, String), Window>,
}

/// An open window of one key.
#[derive(Debug)]
struct Window {
    ends: Instant,
    alerted: &'static str,
    latest: Option<Notice>,
    folded: u64,
}

impl Debouncer {
    /// A debouncer with windows of `window`.
    pub(crate) fn new(window: Duration) -> Debouncer {
        Debouncer {
            window,
            keys: BTreeMap::new(),
        }
    }

    /// Takes `event` at `now`. Returns it as an alert to send at once, or `None` when it is
    /// folded into its key's open window.
    ///
    /// A window that has ended but not been flushed yet still counts as open. Call
    /// [`Debouncer::flush_due`] first, so `event` can open a fresh window.
    pub(crate) fn offer(&mut self, event: Notice, now: Instant) -> Option<Alert> {
        let key = (
            event.pool().to_owned(),
            event.backend().unwrap_or_default().to_owned(),
        );
        if let Some(window) = self.keys.get_mut(&key) {
            window.latest = Some(event);
            window.folded += 1;
            return None;
        }
        self.keys.insert(
            key,
            Window {
                ends: now + self.window,
                alerted: state(&event),
                latest: None,
                folded: 0,
            },
        );
        Some(Alert::new(event))
    }

    /// Closes every window that ended at or before `now`. Returns the summaries to send, ordered
    /// by pool and backend.
    pub(crate) fn flush_due(&mut self, now: Instant) -> Vec<Alert> {
        let mut due = Vec::new();
        let window_length = self.window;
        self.keys.retain(|_, window| {
            if window.ends > now {
                return true;
            }
            match window.latest.take() {
                Some(event) if state(&event) != window.alerted => {
                    window.alerted = state(&event);
                    window.ends = now + window_length;
                    due.push(Alert {
                        event,
                        suppressed: window.folded,
                    });
                    window.folded = 0;
                    true
                }
                _ => false,
            }
        });
        due
    }

    /// When the earliest open window ends, and `flush_due` should next be called. Returns
    /// `None` when no window is open.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.keys.values().map(|window| window.ends).min()
    }
}

/// The state an event leaves its key in, for deciding whether a summary is worth sending.
pub(super) fn state(event: &Notice) -> &'static str {
    match event {
        Notice::Transition { transition, .. } => transition.to.as_str(),
        Notice::Override { to, .. } | Notice::Eligibility { to, .. } => to,
        Notice::Backups { serving, .. } if serving.is_empty() => "backups_out",
        Notice::Backups { .. } => "backups_in",
        Notice::Agent { in_rotation, .. } => {
            if *in_rotation {
                "agent_in_rotation"
            } else {
                "agent_out_of_rotation"
            }
        }
        Notice::Shedding { shedding: true, .. } => "shedding",
        Notice::Shedding {
            shedding: false, ..
        } => "not_shedding",
        Notice::AllDown { .. } | Notice::Recovered { .. } => event.kind(),
        Notice::Membership { change, .. } => change.as_str(),
        Notice::Fleet { change, .. } => change.as_str(),
    }
}
