//! Per backend, its state changes over the last [`TIMELINE`]: each a [`Mark`] with the
//! effective state, whether it served, what qualified it (ejected, on probation, shedding load,
//! held by its agent, a backup) and the explain sentence of that moment.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use capataz_health::rotation::Cause;
use capataz_health::{Ejection, Role};
use serde_json::{json, Value};

use crate::health::{BackendView, PoolRt};
use crate::timefmt::rfc3339;

/// How far back a timeline goes.
pub(crate) const TIMELINE: Duration = Duration::from_secs(3600);

/// The most marks kept per backend (a backend flapping faster loses its oldest ones).
pub(crate) const TIMELINE_MARKS: usize = 64;

/// The longest explain sentence kept in a mark, in bytes.
const EXPLAIN_MAX: usize = 600;

/// A backend's state from `at` until the next mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The backend.
    pub backend: Arc<str>,
    /// When the state began.
    pub at: SystemTime,
    /// The effective state (`UP`, `DOWN`, `DRAINING`, `MAINTENANCE`, ...).
    pub state: &'static str,
    /// Whether new requests went to it.
    pub serving: bool,
    /// What qualified the state, comma-separated (`ejected`, `probation`, `shedding`,
    /// `agent drain`, `agent weight 50%`, `backup`); empty for none.
    pub note: String,
    /// The explain sentence.
    pub explain: String,
}

impl Mark {
    /// The mark of `view` now (its `at` is when its state began, as far as the view says).
    pub(crate) fn of(pool: &PoolRt, view: &BackendView) -> Mark {
        let mut notes = Vec::new();
        let standing = &view.standing;
        match standing.health.passive.ejection {
            Ejection::Ejected { .. } => notes.push("ejected".to_owned()),
            Ejection::Probation { .. } => notes.push("probation".to_owned()),
            Ejection::None => {}
        }
        if standing.shed.is_some() {
            notes.push("shedding".to_owned());
        }
        if standing.agent.holds_out() {
            notes.push(format!("agent {}", standing.agent));
        } else if standing.agent.weight_percent < 100 {
            notes.push(format!("agent weight {}%", standing.agent.weight_percent));
        }
        if standing.role == Role::Backup {
            notes.push("backup".to_owned());
        }
        let mut explain = crate::status::explain(pool, view);
        if explain.len() > EXPLAIN_MAX {
            let mut end = EXPLAIN_MAX;
            while !explain.is_char_boundary(end) {
                end -= 1;
            }
            explain.truncate(end);
            explain.push('…');
        }
        Mark {
            backend: view.backend.name.clone(),
            at: pool.clock().wall(match standing.cause {
                Cause::Override(o) => o.since,
                _ => standing.since,
            }),
            state: view.state(),
            serving: view.serving,
            note: notes.join(", "),
            explain,
        }
    }

    fn same_state(&self, other: &Mark) -> bool {
        self.state == other.state && self.serving == other.serving && self.note == other.note
    }
}

/// Every backend's timeline.
#[derive(Debug, Default)]
pub(super) struct Timelines {
    marks: HashMap<(Arc<str>, Arc<str>), VecDeque<Mark>>,
}

impl Timelines {
    /// Notes `mark` of a backend of pool `pool`, seen at `now`: a new mark if its state differs
    /// from the last one (starting at `now`, or for a backend's first mark when its state
    /// began).
    pub(super) fn note(&mut self, pool: &Arc<str>, mut mark: Mark, now: SystemTime) {
        // Most backends never change state: room for one mark, not the four a first push makes.
        let marks = self
            .marks
            .entry((pool.clone(), mark.backend.clone()))
            .or_insert_with(|| VecDeque::with_capacity(1));
        match marks.back() {
            Some(last) if last.same_state(&mark) => return,
            Some(_) => mark.at = now,
            None => mark.at = mark.at.min(now),
        }
        marks.push_back(mark);
        while marks.len() > TIMELINE_MARKS {
            marks.pop_front();
        }
        // The first mark kept is the state at the start of the hour.
        let start = now.checked_sub(TIMELINE).unwrap_or(SystemTime::UNIX_EPOCH);
        while marks.len() > 1 && marks[1].at <= start {
            marks.pop_front();
        }
    }

    /// Forgets the backends no longer in `pools`.
    pub(super) fn retain(&mut self, pools: &[Arc<PoolRt>], _now: SystemTime) {
        let present: HashSet<(&str, &str)> = pools
            .iter()
            .flat_map(|p| p.backends.iter().map(move |b| (&*p.name, &*b.name)))
            .collect();
        self.marks
            .retain(|(pool, backend), _| present.contains(&(&**pool, &**backend)));
    }

    /// The timeline of a backend over the hour before `now`: `at`, `until` (`null` for the
    /// state in force), `state`, `serving`, `note`, `explain`.
    pub(super) fn json(&self, pool: &Arc<str>, backend: &Arc<str>, now: SystemTime) -> Value {
        let Some(marks) = self.marks.get(&(pool.clone(), backend.clone())) else {
            return json!([]);
        };
        let start = now.checked_sub(TIMELINE).unwrap_or(SystemTime::UNIX_EPOCH);
        let entries: Vec<Value> = marks
            .iter()
            .enumerate()
            .filter_map(|(i, mark)| {
                let until = marks.get(i + 1).map(|next| next.at);
                if until.is_some_and(|until| until <= start) {
                    return None;
                }
                Some(json!({
                    "at": rfc3339(mark.at),
                    "until": until.map(rfc3339),
                    "state": mark.state,
                    "serving": mark.serving,
                    "note": mark.note,
                    "explain": mark.explain,
                }))
            })
            .collect();
        Value::Array(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(state: &'static str, at: u64) -> Mark {
        Mark {
            backend: "b".into(),
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
            state,
            serving: state == "UP",
            note: String::new(),
            explain: format!("{state} because"),
        }
    }

    fn states(timelines: &Timelines, now: u64) -> Vec<(String, Option<String>)> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now);
        timelines
            .json(&"p".into(), &"b".into(), now)
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["state"].as_str().unwrap().to_owned(),
                    m["until"].as_str().map(str::to_owned),
                )
            })
            .collect()
    }

    #[test]
    fn a_timeline_keeps_changes_only_and_the_state_at_the_start_of_the_hour() {
        let mut timelines = Timelines::default();
        let pool: Arc<str> = "p".into();
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        // The first mark starts when its state began, not when it was first seen.
        timelines.note(&pool, mark("UP", 10), at(100));
        timelines.note(&pool, mark("UP", 10), at(105));
        timelines.note(&pool, mark("DOWN", 0), at(200));
        timelines.note(&pool, mark("UP", 0), at(300));
        assert_eq!(
            states(&timelines, 400),
            [
                ("UP".to_owned(), Some(rfc3339(at(200)))),
                ("DOWN".to_owned(), Some(rfc3339(at(300)))),
                ("UP".to_owned(), None),
            ]
        );
        // An hour later what ended before the hour began is gone.
        timelines.note(&pool, mark("DOWN", 0), at(3_900));
        assert_eq!(
            states(&timelines, 3_900),
            [
                ("UP".to_owned(), Some(rfc3339(at(3_900)))),
                ("DOWN".to_owned(), None),
            ]
        );
        for n in 0..(TIMELINE_MARKS as u64 * 2) {
            let state = if n % 2 == 0 { "UP" } else { "DOWN" };
            timelines.note(&pool, mark(state, 0), at(4_000 + n));
        }
        assert!(timelines.marks.values().all(|m| m.len() <= TIMELINE_MARKS));
    }
}
