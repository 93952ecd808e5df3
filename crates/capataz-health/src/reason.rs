//! Why a verdict changed ([`Reason`]), and the change itself ([`Transition`]): the pool's events,
//! with their sentences.

use std::fmt;
use std::time::Duration;

use crate::fleet::Published;
use crate::probe::Mismatch;
use crate::settings::{Percentile, State};
use crate::status::Outcome;

/// Which side of the health checks caused a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Probes.
    Active,
    /// Relayed traffic.
    Passive,
}

impl Side {
    /// `active` or `passive`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Active => "active",
            Side::Passive => "passive",
        }
    }
}

/// One ejection, as reported in a [`Reason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectionInfo {
    /// Which ejection this is, counting from 1.
    pub nth: u32,
    /// How long it lasts.
    pub duration: Duration,
    /// When it ends.
    pub until: Duration,
}

/// Why a verdict changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The failure streak reached `fall`.
    ProbesFailed {
        /// The failure streak.
        streak: u32,
        /// The last probe outcome.
        last: Outcome,
        /// The content rule the last probe's answer broke, if that is why it failed.
        mismatch: Option<Mismatch>,
    },
    /// The pass streak reached `rise`.
    ProbesPassed {
        /// The pass streak.
        streak: u32,
        /// The last probe outcome.
        last: Outcome,
    },
    /// The traffic error streak reached `consecutive_errors`.
    TrafficErrors {
        /// The error streak.
        streak: u32,
        /// The last traffic outcome.
        last: Outcome,
        /// The ejection's length, with timed ejection.
        ejection: Option<EjectionInfo>,
    },
    /// A good response ended a streak-mode ejection.
    TrafficRecovered {
        /// The good response.
        last: Outcome,
    },
    /// A timed ejection ran out: the backend is back on probation.
    EjectionExpired {
        /// The ejection that ended.
        nth: u32,
        /// How long it lasted.
        duration: Duration,
    },
    /// The pass streak reached `rise` while the backend was also ejected, and
    /// [`Settings::probes_end_ejection`](crate::Settings::probes_end_ejection) ended the
    /// ejection early: the backend is back on probation.
    ProbesEndedEjection {
        /// The pass streak.
        streak: u32,
        /// The last probe outcome.
        last: Outcome,
        /// The ejection that ended.
        nth: u32,
    },
    /// The backend tracks another one (HAProxy's `track`), whose active side is now `state`.
    Tracked {
        /// The tracked backend's active state.
        state: State,
    },
    /// The latency-outlier detector ejected the backend: its `percentile` was more than the
    /// configured factor times the pool's median for `windows` judged windows in a row (one,
    /// on probation).
    SlowTraffic {
        /// The percentile compared.
        percentile: Percentile,
        /// The backend's latency at that percentile in the last window.
        latency: Duration,
        /// The pool's median of that percentile in the last window.
        median: Duration,
        /// The slow windows in a row.
        windows: u32,
        /// The ejection's length, with timed ejection.
        ejection: Option<EjectionInfo>,
    },
    /// The success-rate detector ejected the backend: its success rate over the last window
    /// was below the pool's mean minus `stdev_factor` standard deviations.
    ErrorRate {
        /// Its success rate, in tenths of a percent.
        success_permille: u32,
        /// The judged backends' mean success rate, in tenths of a percent.
        mean_permille: u32,
        /// The rate below which a backend was an outlier, in tenths of a percent.
        threshold_permille: u32,
        /// The ejection's length, with timed ejection.
        ejection: Option<EjectionInfo>,
    },
    /// Another member of the balancer's fleet group owns the backend's probes and published
    /// this active verdict (shared probing, `[fleet]`).
    Published(Published),
    /// A traffic error during probation ejected the backend again.
    ProbationFailed {
        /// The error.
        last: Outcome,
        /// The new ejection.
        ejection: EjectionInfo,
    },
}

impl Reason {
    /// The side that caused the transition.
    pub fn side(&self) -> Side {
        match self {
            Reason::ProbesFailed { .. }
            | Reason::ProbesPassed { .. }
            | Reason::ProbesEndedEjection { .. }
            | Reason::Tracked { .. }
            | Reason::Published(_) => Side::Active,
            _ => Side::Passive,
        }
    }

    /// The outcome that triggered the transition, if one did (an expiry has none).
    pub fn last(&self) -> Option<Outcome> {
        match *self {
            Reason::ProbesFailed { last, .. }
            | Reason::ProbesPassed { last, .. }
            | Reason::ProbesEndedEjection { last, .. }
            | Reason::TrafficErrors { last, .. }
            | Reason::TrafficRecovered { last }
            | Reason::ProbationFailed { last, .. } => Some(last),
            Reason::Published(published) => published.why.last,
            Reason::EjectionExpired { .. }
            | Reason::Tracked { .. }
            | Reason::SlowTraffic { .. }
            | Reason::ErrorRate { .. } => None,
        }
    }
}

/// Writes a duration for people: `250 ms`, `1.5 s`, `30 s`.
pub fn human_duration(d: Duration) -> impl fmt::Display {
    struct Human(Duration);
    impl fmt::Display for Human {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let ms = self.0.as_millis();
            if ms < 1000 {
                write!(f, "{ms} ms")
            } else if ms % 1000 == 0 {
                write!(f, "{} s", ms / 1000)
            } else {
                write!(f, "{:.1} s", self.0.as_secs_f64())
            }
        }
    }
    Human(d)
}

fn plural(n: u32, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

impl fmt::Display for EjectionInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ejected for {} (ejection #{})",
            human_duration(self.duration),
            self.nth
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reason::ProbesFailed {
                streak,
                last,
                mismatch,
            } => {
                let what = plural(streak, "failed probe", "consecutive failed probes");
                write!(f, "{streak} {what}, last: {last}")?;
                match mismatch {
                    Some(mismatch) => write!(f, ", {mismatch}"),
                    None => Ok(()),
                }
            }
            Reason::ProbesPassed { streak, last } => {
                let what = plural(streak, "passing probe", "consecutive passing probes");
                write!(f, "{streak} {what}, last: {last}")
            }
            Reason::ProbesEndedEjection { streak, last, nth } => {
                let what = plural(streak, "passing probe", "consecutive passing probes");
                write!(
                    f,
                    "{streak} {what} after DOWN, last: {last}; ends ejection #{nth} early, back on probation"
                )
            }
            Reason::TrafficErrors {
                streak,
                last,
                ejection,
            } => {
                let what = plural(streak, "traffic error", "consecutive traffic errors");
                write!(f, "{streak} {what}, last: {last}")?;
                match ejection {
                    Some(ejection) => write!(f, "; {ejection}"),
                    None => Ok(()),
                }
            }
            Reason::TrafficRecovered { last } => {
                write!(f, "a good response ended the error streak, last: {last}")
            }
            Reason::EjectionExpired { nth, duration } => write!(
                f,
                "ejection #{nth} ({}) is over, back on probation",
                human_duration(duration)
            ),
            Reason::Tracked { state } => {
                write!(f, "the backend it tracks is {state} by its active checks")
            }
            Reason::Published(published) => write!(f, "{published}"),
            Reason::ProbationFailed { last, ejection } => {
                write!(f, "traffic error on probation, last: {last}; {ejection}")
            }
            Reason::ErrorRate {
                success_permille,
                mean_permille,
                threshold_permille,
                ejection,
            } => {
                write!(
                    f,
                    "{}",
                    RateSentence {
                        success_permille,
                        mean_permille,
                        threshold_permille
                    }
                )?;
                match ejection {
                    Some(ejection) => write!(f, "; {ejection}"),
                    None => Ok(()),
                }
            }
            Reason::SlowTraffic {
                percentile,
                latency,
                median,
                windows,
                ejection,
            } => {
                write!(
                    f,
                    "{}",
                    SlowSentence {
                        percentile,
                        latency,
                        median,
                        windows
                    }
                )?;
                match ejection {
                    Some(ejection) => write!(f, "; {ejection}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// `p99 412 ms against a pool median of 38 ms over the last 3 windows`: why the
/// latency-outlier detector ejected a backend, without the ejection's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowSentence {
    /// The percentile compared.
    pub percentile: Percentile,
    /// The backend's latency at it.
    pub latency: Duration,
    /// The pool's median.
    pub median: Duration,
    /// Slow windows in a row.
    pub windows: u32,
}

impl fmt::Display for SlowSentence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} against a pool median of {} ",
            self.percentile,
            human_duration(self.latency),
            human_duration(self.median)
        )?;
        match self.windows {
            1 => write!(f, "over the last window"),
            n => write!(f, "over the last {n} windows"),
        }
    }
}

/// `success rate 80.0 % against a pool mean of 96.0 % (outliers below 80.8 %) over the last
/// window`: why the success-rate detector ejected a backend, without the ejection's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateSentence {
    /// Its success rate, in tenths of a percent.
    pub success_permille: u32,
    /// The pool's mean, in tenths of a percent.
    pub mean_permille: u32,
    /// The outlier threshold, in tenths of a percent.
    pub threshold_permille: u32,
}

impl fmt::Display for RateSentence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |p: u32| format!("{}.{} %", p / 10, p % 10);
        write!(
            f,
            "success rate {} against a pool mean of {} (outliers below {}) over the last window",
            pct(self.success_permille),
            pct(self.mean_permille),
            pct(self.threshold_permille)
        )
    }
}

/// A change of one backend's verdict: the engine's only output event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The backend's index in the pool.
    pub backend: usize,
    /// The verdict before.
    pub from: State,
    /// The verdict after.
    pub to: State,
    /// Why.
    pub reason: Reason,
    /// When, on the caller's clock.
    pub at: Duration,
    /// How many backends of the pool are UP after the change.
    pub healthy_after: usize,
}

impl Transition {
    /// Whether this transition left the pool with no UP backend.
    pub fn emptied_pool(&self) -> bool {
        self.to == State::Down && self.healthy_after == 0
    }

    /// Whether this transition ended a time with no UP backend.
    pub fn refilled_pool(&self) -> bool {
        self.to == State::Up && self.healthy_after == 1
    }
}

impl fmt::Display for Transition {
    /// `UP -> DOWN: 3 consecutive failed probes, last: TIMEOUT` (the caller names the backend).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}: {}", self.from, self.to, self.reason)
    }
}
