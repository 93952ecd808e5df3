//! The engine's settings for one pool, and the two-valued [`State`] of a verdict or a side.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::rules::{ProbeRule, TrafficRule};

/// A backend's health verdict, or one side's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Eligible for traffic.
    Up,
    /// Out of rotation.
    Down,
}

impl State {
    /// `UP` or `DOWN`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Up => "UP",
            State::Down => "DOWN",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long passive ejections last; see the module documentation for the exact rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectionPolicy {
    /// The first ejection's length; the n-th lasts `base x n`.
    pub base: Duration,
    /// The longest any ejection lasts. A backend that stays clear of ejection this long after a
    /// readmission starts counting its ejections from one again.
    pub max: Duration,
}

impl EjectionPolicy {
    /// How long the `nth` ejection (counting from 1) lasts.
    pub fn duration(&self, nth: u32) -> Duration {
        self.base.saturating_mul(nth.max(1)).min(self.max)
    }
}

/// Which latency percentile the latency-outlier detector compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Percentile {
    /// The median of a window's requests.
    P50,
    /// The 99th percentile of a window's requests.
    P99,
}

impl Percentile {
    /// `p50` or `p99`.
    pub fn as_str(self) -> &'static str {
        match self {
            Percentile::P50 => "p50",
            Percentile::P99 => "p99",
        }
    }
}

impl fmt::Display for Percentile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The latency-outlier detector: a backend whose `percentile` over a window of its relayed
/// traffic is more than `factor` times the pool's median of that percentile, and at least
/// `min_latency`, for `windows` consecutive judged windows, is ejected like a passive error
/// ejection. A window judges a backend only when it relayed at least `min_requests` requests
/// in it; the pool's median is taken over the backends judged in that window and not ejected
/// (the lower median for an even count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyOutliers {
    /// Which percentile is compared.
    pub percentile: Percentile,
    /// How many times the pool's median makes an outlier (more than this).
    pub factor: NonZeroU32,
    /// Consecutive outlying windows that eject.
    pub windows: NonZeroU32,
    /// Requests a backend must relay within a window to be judged in it.
    pub min_requests: u32,
    /// A latency below this is never an outlier, whatever the median.
    pub min_latency: Duration,
}

/// The success-rate detector (Envoy's `success_rate` outlier detection): each window, over
/// the backends that relayed at least `min_requests` requests in it (and are not ejected),
/// when there are at least `min_backends` of them, a backend whose success rate is below
/// `mean - stdev_factor x stdev` of theirs is ejected like a passive error ejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuccessRate {
    /// Requests a backend must relay within a window to be judged in it.
    pub min_requests: u32,
    /// Judged backends a window needs before it judges any.
    pub min_backends: u32,
    /// How many standard deviations below the mean make an outlier, in thousandths.
    pub stdev_factor_milli: u32,
}

/// The engine's settings for one pool. The defaults are the replay protocol's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Consecutive passing probes that bring a DOWN active side UP (default 2).
    pub rise: NonZeroU32,
    /// Consecutive failed probes that take an UP active side DOWN (default 3).
    pub fall: NonZeroU32,
    /// Consecutive traffic errors that eject a backend (default 3).
    pub consecutive_errors: NonZeroU32,
    /// The active state of a backend that joins the pool (default UP).
    pub initial: State,
    /// Whether the first probe result of a backend that joined DOWN decides at once (HAProxy's
    /// `first-probe`): its first passing probe brings it UP without waiting for `rise`; a
    /// failing one leaves it DOWN, and from then on the streaks apply. Default false.
    pub first_probe: bool,
    /// How probe outcomes are judged.
    pub probe_rule: ProbeRule,
    /// How traffic outcomes are judged.
    pub traffic_rule: TrafficRule,
    /// Timed ejection with probation, or `None` for "ejected until the next good response".
    pub ejection: Option<EjectionPolicy>,
    /// The most of the pool, in percent, that passive checks may hold ejected at once
    /// (default 100). The cap is `floor(backends x percent / 100)` but at least one backend,
    /// except that 0 disables passive ejection.
    pub max_ejected_percent: u8,
    /// Whether probes that bring a DOWN active side back UP also end a passive ejection early,
    /// into probation (default false; Envoy's `successful_active_health_check_uneject_host`).
    /// Only that edge does it: a backend whose probes pass all along while its traffic fails
    /// (a "liar") stays ejected, because its active side never went DOWN.
    pub probes_end_ejection: bool,
    /// The latency-outlier detector, or `None` (default) for none.
    pub latency_outliers: Option<LatencyOutliers>,
    /// The success-rate detector, or `None` (default) for none.
    pub success_rate: Option<SuccessRate>,
}

const fn nz(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => panic!("zero threshold"),
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            rise: nz(2),
            fall: nz(3),
            consecutive_errors: nz(3),
            initial: State::Up,
            first_probe: false,
            probe_rule: ProbeRule::default(),
            traffic_rule: TrafficRule::default(),
            ejection: None,
            max_ejected_percent: 100,
            probes_end_ejection: false,
            latency_outliers: None,
            success_rate: None,
        }
    }
}
