//! Publishing what the engine decided: the new [`Snapshot`] the request path reads, one log
//! line per event, and the broadcast [`Notice`] the admin API and the alert hooks receive.
//!
//! Events leave in the engine's order, which is causal: an override or a transition comes
//! before the all-down or recovered event it caused. The snapshot is swapped before any of them
//! is logged, so a listener that reacts to an event already sees its effect. Each event carries
//! what its sentence needs (which backups serve, the streak behind an active change, a shed's
//! weight): they are rendered as drained, without asking the engine again.
//!
//! The snapshot carries every backend's weight as the engine computed it at that moment; the
//! picker, `/status`, the metrics and the dashboard all read it there, never the engine again.
//! Weights that move with time alone (slow start's steps) move only at the engine's timeouts,
//! so publishing wakes the timer whenever what it published brings the next timeout earlier
//! than the one the timer sleeps until (a ramp that just began, a new ejection or shed).

use std::time::Duration;

use capataz_health::pool::human_duration;
use capataz_health::rotation::{
    ActiveChange, AgentChange, Event as EngineEvent, OverrideCause, OverrideChange, ShedChange,
};
use capataz_health::{AllDown, State};

use super::{Inner, PoolRt};
use crate::events::{MembershipChange, Notice};
use crate::logging;

impl PoolRt {
    /// Drains what the engine's schedule says each probe came to (`probes.rs`), then the
    /// engine's events: rebuilds the snapshot if anything happened (or when `rebuild`: time
    /// alone moves slow-start weights), wakes the timer if the next timeout moved earlier, and
    /// logs and broadcasts each event. A probe that changes nothing costs no rebuild.
    pub(super) fn publish(&self, inner: &mut Inner, now: Duration, rebuild: bool) {
        self.publish_probes(inner);
        let time = self.clock.wall(now);
        let events: Vec<EngineEvent> = std::iter::from_fn(|| inner.engine.poll_event()).collect();
        if rebuild || !events.is_empty() {
            self.handle.publish(inner.engine.eligible(now));
            inner.published = now;
            // Whatever made these events may have started a timer (a ramp, an ejection, a
            // shed): the timer must not sleep past it.
            if let Some(due) = inner.engine.poll_timeout() {
                if inner.armed.is_none_or(|armed| due < armed) {
                    inner.armed = Some(due);
                    self.timer.notify_one();
                }
            }
        }
        for event in events {
            match event {
                EngineEvent::Transition(transition) => {
                    let metrics = &self.backends[transition.backend].metrics;
                    metrics.transition(&transition);
                    self.emit(Notice::Transition {
                        pool: self.name.clone(),
                        backend: self.backends[transition.backend].name.clone(),
                        transition,
                        time,
                    });
                }
                EngineEvent::ActiveChange(change) => self.log_hidden_active_change(&change),
                EngineEvent::Override(change) => self.emit(self.override_event(&change)),
                EngineEvent::AllDown { applied, .. } => self.emit(Notice::AllDown {
                    pool: self.name.clone(),
                    policy: applied,
                    time,
                }),
                EngineEvent::Agent(change) => self.emit(self.agent_event(&change)),
                EngineEvent::Shedding(change) => self.emit(self.shed_event(&change)),
                EngineEvent::Recovered { .. } => self.emit(Notice::Recovered {
                    pool: self.name.clone(),
                    time,
                }),
                EngineEvent::Backups {
                    serving,
                    to_primaries,
                    ..
                } => self.emit(Notice::Backups {
                    pool: self.name.clone(),
                    serving: serving
                        .iter()
                        .map(|&i| self.backends[i].name.clone())
                        .collect(),
                    to_primaries,
                    time,
                }),
                EngineEvent::CloseTunnels { backend, .. } => {
                    let rt = &self.backends[backend];
                    let open = rt.close_tunnels();
                    let sentence = format!(
                        "pool={} backend={} is DOWN: closing its {open} upgraded connections \
                         (close_tunnels_on_down)",
                        self.name, rt.name
                    );
                    logging::emit(
                        tracing::Level::INFO,
                        &sentence,
                        logging::Fields {
                            event: "close_tunnels",
                            pool: Some(&self.name),
                            backend: Some(&rt.name),
                            ..Default::default()
                        },
                    );
                }
                EngineEvent::Standing(change) => self.emit(Notice::Eligibility {
                    pool: self.name.clone(),
                    backend: self.backends[change.backend].name.clone(),
                    from: change.from.as_str(),
                    to: change.to.as_str(),
                    reason: change.cause.to_string(),
                    time: self.clock.wall(change.at),
                }),
            }
        }
    }

    fn override_event(&self, change: &OverrideChange) -> Notice {
        let reason = match (change.cause, change.kind, change.ttl) {
            (OverrideCause::Operator, Some(kind), Some(ttl)) => format!(
                "manual {} set by an operator, for {} (until {})",
                kind.as_str(),
                human_duration(ttl),
                crate::timefmt::clock(self.clock.wall(change.at.saturating_add(ttl)))
            ),
            (OverrideCause::Operator, Some(kind), None) => {
                format!("manual {} set by an operator, until cleared", kind.as_str())
            }
            (OverrideCause::Operator, None, _) => {
                "cleared by an operator; health checks decide again".to_owned()
            }
            (OverrideCause::Lapsed, ..) => {
                "manual override lapsed; health checks decide again".to_owned()
            }
        };
        Notice::Override {
            pool: self.name.clone(),
            backend: self.backends[change.backend].name.clone(),
            kind: change.kind,
            from: change.from.as_str(),
            to: change.to.as_str(),
            reason,
            time: self.clock.wall(change.at),
        }
    }

    fn shed_event(&self, change: &ShedChange) -> Notice {
        let reason = match change.shed {
            Some(shed) => format!(
                "sheds load: answered {} asking for {} of relief; weight at {} % until then \
                 (not counted as an error)",
                shed.status,
                human_duration(shed.duration),
                shed.weight_percent,
            ),
            None => "no longer sheds load: weight restored".to_owned(),
        };
        Notice::Shedding {
            pool: self.name.clone(),
            backend: self.backends[change.backend].name.clone(),
            shedding: change.shed.is_some(),
            status: change.shed.map(|s| s.status),
            duration: change.shed.map(|s| s.duration),
            reason,
            time: self.clock.wall(change.at),
        }
    }

    fn agent_event(&self, change: &AgentChange) -> Notice {
        let to = change.to;
        let reason = if change.in_rotation {
            format!(
                "in rotation with {} % of its weight (health checks still decide)",
                to.weight_percent
            )
        } else if to.hold == Some(capataz_health::AgentHold::Maint) {
            format!(
                "in maintenance while the agent says {to} (no new requests, in-flight ones \
                 finish, no probes; it requalifies on leaving it)"
            )
        } else if to.holds_out() {
            format!(
                "out of rotation while the agent says {} (no new requests, in-flight ones finish)",
                to
            )
        } else {
            "the agent does not hold it out; health checks, requalification after maintenance or \
             an override keep it out"
                .to_owned()
        };
        Notice::Agent {
            pool: self.name.clone(),
            backend: self.backends[change.backend].name.clone(),
            from: change.from.to_string(),
            to: to.to_string(),
            in_rotation: change.in_rotation,
            reason,
            time: self.clock.wall(change.at),
        }
    }

    fn log_hidden_active_change(&self, change: &ActiveChange) {
        // The verdict did not move (passive checks hold the backend out), but an operator
        // still wants to know what the probes concluded.
        let name = &self.backends[change.backend].name;
        let sentence = format!(
            "pool={} backend={} active checks say {} after {} consecutive {} probes \
             (last: {}); the verdict stays DOWN: ejected by passive checks",
            self.name,
            name,
            change.state,
            change.streak,
            if change.state == State::Up {
                "passing"
            } else {
                "failed"
            },
            change.last
        );
        logging::emit(
            tracing::Level::INFO,
            &sentence,
            logging::Fields {
                event: "active_change",
                pool: Some(&self.name),
                backend: Some(name),
                to: Some(change.state.as_str()),
                side: Some("active"),
                ..Default::default()
            },
        );
    }

    /// Logs `event` once and broadcasts it.
    pub(crate) fn emit(&self, event: Notice) {
        let sentence = event.sentence();
        let change = event.change();
        let side = match &event {
            Notice::Transition { transition, .. } => Some(transition.reason.side().as_str()),
            _ => None,
        };
        let policy = match &event {
            Notice::AllDown { policy, .. } => Some(policy.policy()),
            _ => None,
        };
        let level = match &event {
            Notice::AllDown { policy, .. }
                if !matches!(policy, AllDown::BelowMinHealthy { .. }) =>
            {
                tracing::Level::ERROR
            }
            Notice::Backups {
                to_primaries: true, ..
            } => tracing::Level::INFO,
            Notice::AllDown { .. } | Notice::Backups { .. } => tracing::Level::WARN,
            Notice::Transition { transition, .. } if transition.to == State::Down => {
                tracing::Level::WARN
            }
            Notice::Membership {
                change:
                    MembershipChange::Failing { .. }
                    | MembershipChange::DropHeld { .. }
                    | MembershipChange::Skipped { .. }
                    | MembershipChange::TargetLeftOut { .. }
                    | MembershipChange::TargetFailing { .. },
                ..
            } => tracing::Level::WARN,
            _ => tracing::Level::INFO,
        };
        logging::emit(
            level,
            &sentence,
            logging::Fields {
                event: event.kind(),
                pool: Some(event.pool()),
                backend: event.backend(),
                from: change.as_ref().map(|c| c.0),
                to: change.as_ref().map(|c| c.1),
                side,
                reason: change.as_ref().map(|c| c.2.as_str()),
                policy,
            },
        );
        let _ = self.events.send(event);
    }
}
