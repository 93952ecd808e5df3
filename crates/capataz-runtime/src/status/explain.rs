//! The one sentence that explains why a backend is in or out and when that changes: a
//! rendering of the engine's [`Standing`], one function per [`Cause`]. Which rule decides is
//! the engine's word; this module only says it, with what the engine does not know (requests
//! in flight, the next probe, the tracked backend's name, the configured intervals, the clock).

use std::time::Duration;

use capataz_health::pool::human_duration;
use capataz_health::rotation::{Back, Cause, DownWhy, Probation, ProbesDown};
use capataz_health::{
    Cadence, OverrideKind, RateSentence, Reason, Role, SlowSentence, Standing, State,
};

use crate::config::{CheckKind, DnsRecord, PoolSource};
use crate::health::{BackendView, PoolRt};
use crate::timefmt::clock;

/// One sentence: the backend's state, since when, why, and what brings it back (or out); for a
/// backup, whether it serves or stands by.
pub fn explain(pool: &PoolRt, view: &BackendView) -> String {
    let mut sentence = Said::new(pool, view).standing();
    if view.standing.role == Role::Backup {
        // Said from the snapshot (serving, on backups) and its own standing: a backup out of
        // rotation itself neither stands by nor waits for another.
        let in_rotation = view.standing.in_rotation();
        sentence.push_str(match (view.serving, view.on_backups, in_rotation) {
            (true, true, _) => "; backup: serving while no primary is in rotation",
            (true, false, _) => "; backup: the pool fails open over it",
            (false, _, false) => "; backup: out of rotation itself",
            (false, true, true) => "; backup: another backup serves (backups = \"first\")",
            (false, false, true) => "; backup: standing by while a primary is in rotation",
        });
    }
    if let Some(clause) = super::queue::limit_clause(pool, view) {
        sentence.push_str(&clause);
    }
    if let Some(source) = source_text(&pool.config.source) {
        sentence.push_str(&format!(
            "; from {source}, joined {}",
            clock(view.info.joined)
        ));
    }
    sentence
}

/// The source of a pool whose backends do not come from the file, as words (`None`: static).
fn source_text(source: &PoolSource) -> Option<String> {
    match source {
        PoolSource::Static => None,
        PoolSource::Dns(dns) => Some(format!(
            "dns {} {}",
            dns.name,
            match dns.record {
                DnsRecord::Address { .. } => "A/AAAA",
                DnsRecord::Srv => "SRV",
            }
        )),
        PoolSource::Etcd(etcd) => Some(format!("etcd {}", etcd.prefix)),
    }
}

/// `1st`, `2nd`, `3rd`, `4th`, ... `11th`, `21st`.
fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The clause that says what brings a backend back, for the sentences that have one.
fn back_words(back: Back) -> String {
    match back {
        Back::LeavingMaintenance { passes: 0 } => {
            "on leaving it, it gets traffic at once (no probes to wait for)".to_owned()
        }
        Back::LeavingMaintenance { passes: 1 } => {
            "on leaving it, it needs 1 passing probe before traffic".to_owned()
        }
        Back::LeavingMaintenance { passes } => {
            format!("on leaving it, it needs {passes} passing probes in a row before traffic")
        }
        Back::AgentUp => "the agent's up or ready brings it back".to_owned(),
        Back::NextPass => "the next passing probe brings it back at once".to_owned(),
        Back::EjectionEnds { until: None } => "one good response readmits it".to_owned(),
        Back::FirstPass => "one passing probe brings it UP at once".to_owned(),
        // The other sentences say it with their own figures (the passes a DOWN backend has and
        // needs, an ejection's end, an override's until), or have nothing to bring back.
        Back::Passes { .. }
        | Back::TrackedUp
        | Back::EjectionEnds { until: Some(_) }
        | Back::OverrideEnds { .. }
        | Back::InRotation => String::new(),
    }
}

/// One backend's standing with what the runtime adds to it, ready to be said.
struct Said<'a> {
    pool: &'a PoolRt,
    view: &'a BackendView,
    standing: &'a Standing,
    /// Requests in flight to it.
    in_flight: usize,
    /// `, next probe in 2 s`, or nothing when it is not probed.
    next_probe: String,
    /// When its verdict began, on the wall clock.
    since: String,
}

impl<'a> Said<'a> {
    fn new(pool: &'a PoolRt, view: &'a BackendView) -> Said<'a> {
        let next_probe = view
            .next_probe
            .filter(|_| pool.config.active.kind != CheckKind::None)
            .map(|due| {
                format!(
                    ", next probe in {}",
                    human_duration(due.saturating_sub(view.now))
                )
            })
            .unwrap_or_default();
        Said {
            pool,
            view,
            standing: &view.standing,
            in_flight: view
                .backend
                .in_flight
                .load(std::sync::atomic::Ordering::Relaxed),
            next_probe,
            since: clock(pool.clock().wall(view.standing.since)),
        }
    }

    /// Engine time `t` as a wall-clock time of day.
    fn clock_of(&self, t: Duration) -> String {
        clock(self.pool.clock().wall(t))
    }

    /// The sentence, by the rule that decides.
    fn standing(&self) -> String {
        match self.standing.cause {
            Cause::Override(o) => self.overridden(o.kind, o.since, o.until),
            Cause::AgentMaintenance => self.agent_maintenance(),
            Cause::Requalifying { has, needs } => self.requalifying(has, needs),
            Cause::AgentDrain => self.agent_drain(),
            Cause::AgentHold => self.agent_hold(),
            Cause::DrainOn404 => self.drain_on_404(),
            Cause::Tracked { state } => self.tracked(state),
            Cause::Ejected {
                since,
                until,
                nth,
                reason,
                probes,
            } => self.ejected(since, until, nth, reason, probes),
            Cause::ProbesDown(down) => self.probes_down(down),
            Cause::Up { probation, ramping } => self.up(probation, ramping),
        }
    }

    /// `health checks say UP (active UP, 0 of 3 failed probes ...)`.
    fn health_says(&self) -> String {
        let h = &self.standing.health;
        let config = &self.pool.config;
        format!(
            "health checks say {} (active {}, {} of {} failed probes and {} of {} passing probes \
             in a row; {} of {} traffic errors in a row)",
            h.verdict(),
            h.active.state,
            h.active.fail_streak,
            config.active.fall,
            h.active.pass_streak.min(config.active.rise.get()),
            config.active.rise,
            h.passive.error_streak,
            config.passive.consecutive_errors
        )
    }

    fn overridden(&self, kind: OverrideKind, since: Duration, until: Option<Duration>) -> String {
        let until = match until {
            Some(until) => format!("until {}", self.clock_of(until)),
            None => "until cleared".into(),
        };
        let (since, in_flight, health_says) =
            (self.clock_of(since), self.in_flight, self.health_says());
        match kind {
            OverrideKind::Drain => format!(
                "DRAINING since {since} (manual, {until}): no new requests, {in_flight} in \
                 flight; {health_says}",
            ),
            OverrideKind::Maintenance => format!(
                "MAINTENANCE since {since} (manual, {until}): no new requests, {in_flight} in \
                 flight, no probes; {}; {health_says}",
                back_words(self.standing.back),
            ),
            OverrideKind::Down => {
                format!("FORCED DOWN since {since} (manual, {until}); {health_says}")
            }
            OverrideKind::Up => format!(
                "FORCED UP since {since} (manual, {until}): gets traffic whatever health says; \
                 {health_says}"
            ),
        }
    }

    fn agent_maintenance(&self) -> String {
        format!(
            "MAINTENANCE (its agent said maint; agent says {}): no new requests, {} in flight, \
             no probes; {}; {}",
            self.standing.agent,
            self.in_flight,
            back_words(self.standing.back),
            self.health_says()
        )
    }

    fn requalifying(&self, has: u32, needs: u32) -> String {
        format!(
            "REQUALIFYING: back from maintenance, needs {needs} passing probes in a row before \
             traffic (has {has}){}; {}",
            self.next_probe,
            self.health_says()
        )
    }

    fn agent_drain(&self) -> String {
        format!(
            "SELF_DRAINING: its agent asked for a drain (agent says {}): no new requests, {} in \
             flight; {}; {}",
            self.standing.agent,
            self.in_flight,
            back_words(self.standing.back),
            self.health_says()
        )
    }

    fn agent_hold(&self) -> String {
        format!(
            "HELD OUT by its agent (agent says {}): no new requests, {} in flight; {}",
            self.standing.agent,
            self.in_flight,
            self.health_says()
        )
    }

    fn drain_on_404(&self) -> String {
        format!(
            "SELF_DRAINING: UP since {}, but its health route answered HTTP 404 \
             (disable_on_404): no new requests, {} in flight; {}{}",
            self.since,
            self.in_flight,
            back_words(self.standing.back),
            self.next_probe
        )
    }

    fn tracked(&self, state: State) -> String {
        let config = &self.pool.config;
        let tracked = config
            .backends
            .get(self.view.index)
            .and_then(|b| b.track.as_ref())
            .map_or_else(
                || "another backend".to_owned(),
                |t| format!("{}/{}", t.pool, t.backend),
            );
        let follows = format!(
            "tracks {tracked}, whose active checks say {state}; it follows them, checked every {}",
            human_duration(config.active.interval)
        );
        let since = &self.since;
        match state {
            State::Down => format!("DOWN since {since}: {follows}"),
            State::Up => format!(
                "UP since {since}: {follows}; traffic errors in a row: {} of {}",
                self.standing.health.passive.error_streak, config.passive.consecutive_errors
            ),
        }
    }

    /// What ejected a backend, by the transition that took it DOWN.
    fn ejected_by(&self, reason: Option<Reason>) -> String {
        match reason {
            Some(Reason::TrafficErrors { streak, last, .. }) => {
                format!("{streak} consecutive traffic errors (last: {last})")
            }
            Some(Reason::ProbationFailed { last, .. }) => {
                format!("a traffic error on probation (last: {last})")
            }
            Some(Reason::SlowTraffic {
                percentile,
                latency,
                median,
                windows,
                ..
            }) => format!(
                "a latency outlier: {}",
                SlowSentence {
                    percentile,
                    latency,
                    median,
                    windows
                }
            ),
            Some(Reason::ErrorRate {
                success_permille,
                mean_permille,
                threshold_permille,
                ..
            }) => format!(
                "an error-rate outlier: {}",
                RateSentence {
                    success_permille,
                    mean_permille,
                    threshold_permille
                }
            ),
            Some(other) => other.to_string(),
            None => format!(
                "{} consecutive traffic errors",
                self.pool.config.passive.consecutive_errors
            ),
        }
    }

    fn ejected(
        &self,
        ejected_at: Duration,
        until: Option<Duration>,
        nth: u32,
        reason: Option<Reason>,
        probes: Option<ProbesDown>,
    ) -> String {
        let cause = self.ejected_by(reason);
        let active_note = match probes {
            Some(probes) => format!(
                "; probes also fail: needs {} passing probes in a row{} (has {}){}",
                probes.needs,
                if probes.ends_ejection {
                    " to come back UP, which also ends this ejection early"
                } else {
                    ""
                },
                probes.has,
                self.next_probe
            ),
            None => String::new(),
        };
        match until {
            Some(until) => format!(
                "ejected until {} ({} ejection, {}): {cause}{active_note}",
                self.clock_of(until),
                ordinal(nth),
                human_duration(until.saturating_sub(ejected_at))
            ),
            None => format!(
                "ejected since {}: {cause}; {}{active_note}",
                self.since,
                back_words(self.standing.back)
            ),
        }
    }

    fn probes_down(&self, down: ProbesDown) -> String {
        let since = &self.since;
        let cause = match down.why {
            DownWhy::ProbesFailed {
                streak,
                last,
                mismatch: Some(mismatch),
            } => format!("{streak} consecutive failed probes (last: {last}, {mismatch})"),
            DownWhy::ProbesFailed {
                streak,
                last,
                mismatch: None,
            } => format!("{streak} consecutive failed probes (last: {last})"),
            DownWhy::FirstProbe => {
                return format!(
                    "DOWN since {since}: waiting for its first probe (initial = first-probe: \
                     {}, a failed one leaves it DOWN until {} pass in a row){}",
                    back_words(self.standing.back),
                    down.needs,
                    self.next_probe
                );
            }
            DownWhy::NeverProven => {
                match self
                    .view
                    .info
                    .probes
                    .back()
                    .and_then(|p| p.outcome.mismatch)
                {
                    Some(mismatch) => format!(
                        "not yet proven healthy (new backends start DOWN); last probe: {mismatch}"
                    ),
                    None => "not yet proven healthy (new backends start DOWN)".to_string(),
                }
            }
            DownWhy::Failing { streak } => format!("{streak} consecutive failed probes"),
        };
        let active = &self.pool.config.active;
        let cadence = match self.standing.cadence {
            Cadence::Down if active.down_interval != active.interval => format!(
                ", probed every {} while DOWN",
                human_duration(active.down_interval)
            ),
            Cadence::Fast if active.fast_interval != active.interval => format!(
                ", probed every {} while the streak lasts",
                human_duration(active.fast_interval)
            ),
            _ => String::new(),
        };
        format!(
            "DOWN since {since}: {cause}; needs {} passing probes in a row (has {}){cadence}{}",
            down.needs, down.has, self.next_probe
        )
    }

    fn up(&self, probation: Option<Probation>, ramping: bool) -> String {
        let standing = self.standing;
        let probation = match probation {
            Some(p) => format!(
                " on probation since {}: one good response readmits it, one traffic error ejects \
                 it again{}",
                self.clock_of(p.since),
                p.next_ejection
                    .map(|d| format!(" for {}", human_duration(d)))
                    .unwrap_or_default()
            ),
            None => String::new(),
        };
        let agent = if standing.agent.weight_percent < 100 {
            format!("; agent weight {}%", standing.agent.weight_percent)
        } else {
            String::new()
        };
        let shed = match standing.shed {
            Some(shed) => format!(
                "; shedding load: answered {}, weight at {} % until {}",
                shed.status,
                shed.weight_percent,
                self.clock_of(shed.until)
            ),
            None => String::new(),
        };
        // Whether it ramps is the engine's word, and the weight the snapshot's: the one the
        // picker uses.
        let ramp = if ramping {
            format!(
                "; slow start: weight {:.1} of {}",
                f64::from(standing.weight_tenths) / 10.0,
                standing.weight
            )
        } else {
            String::new()
        };
        let config = &self.pool.config;
        format!(
            "UP since {}{probation}; failed probes in a row: {} of {}, traffic errors in a row: \
             {} of {}{agent}{shed}{ramp}{}",
            self.since,
            standing.health.active.fail_streak,
            config.active.fall,
            standing.health.passive.error_streak,
            config.passive.consecutive_errors,
            self.next_probe
        )
    }
}
