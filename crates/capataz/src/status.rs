//! What the admin API says about pools and backends: the `/status` JSON and the one sentence
//! that explains why a backend is in or out and when that changes.

use std::sync::Arc;
use std::time::Duration;

use capataz_health::pool::human_duration;
use capataz_health::{
    AgentHold, Cadence, Effective, Ejection, EjectionPolicy, RateSentence, Reason, Role,
    SlowSentence, State, TrafficRule,
};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::ser::PrettyFormatter;
use serde_json::{json, Value};

use crate::config::{AllDownPolicy, CheckKind, DnsRecord, PoolSource};
use crate::events::OverrideKind;
use crate::health::{BackendView, PoolRt};
use crate::timefmt::{clock, rfc3339};

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

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// One sentence: the backend's state, since when, why, and what brings it back (or out); for a
/// backup, whether it serves or stands by.
pub fn explain(pool: &PoolRt, view: &BackendView) -> String {
    let mut sentence = explain_standing(pool, view);
    if view.role == Role::Backup {
        // Said from the snapshot (serving, on backups) and its own standing: a backup out of
        // rotation itself neither stands by nor waits for another.
        sentence.push_str(match (view.serving, view.on_backups, view.eligible) {
            (true, true, _) => "; backup: serving while no primary is in rotation",
            (true, false, _) => "; backup: the pool fails open over it",
            (false, _, false) => "; backup: out of rotation itself",
            (false, true, true) => "; backup: another backup serves (backups = \"first\")",
            (false, false, true) => "; backup: standing by while a primary is in rotation",
        });
    }
    if let Some(source) = source_text(&pool.config.source) {
        sentence.push_str(&format!(
            "; from {source}, joined {}",
            clock(view.info.joined)
        ));
    }
    sentence
}

/// What leaving maintenance takes, by the passing probes a backend needs.
fn back_from_maintenance(passes: u32) -> String {
    match passes {
        0 => "on leaving it, it gets traffic at once (no probes to wait for)".to_owned(),
        1 => "on leaving it, it needs 1 passing probe before traffic".to_owned(),
        n => format!("on leaving it, it needs {n} passing probes in a row before traffic"),
    }
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

/// The pool's source and what it last did, for `/status`: `kind`, and for a source other than
/// `static`, `age_seconds` (since the source last answered; `null` before its first
/// answer), `confirmed_at`, `failing` (why, while it fails) and `held` (a drop held for
/// confirmation: `from` and `to`); a DNS source adds `name`, `record` and `unresolved` (the
/// SRV targets without an address: `target`, `reason`, and `kept`, the last known address it
/// stays at while its lookup fails, else `null`: left out), an etcd one `prefix` and
/// `endpoints`.
fn source_json(pool: &PoolRt) -> Value {
    let source = &pool.config.source;
    match source {
        PoolSource::Static => json!({ "kind": "static" }),
        PoolSource::Dns(_) | PoolSource::Etcd(_) => {
            let state = pool.membership.state();
            let now = pool.clock().now();
            let mut value = json!({
                "kind": source.kind(),
                "age_seconds": state.confirmed.map(|t| now.saturating_sub(t).as_secs_f64()),
                "confirmed_at": state.confirmed_wall.map(rfc3339),
                "failing": state.failing,
                "held": state.held.map(|(from, to)| json!({ "from": from, "to": to })),
            });
            match source {
                PoolSource::Dns(dns) => {
                    value["unresolved"] = state
                        .unresolved
                        .iter()
                        .map(|u| {
                            json!({
                                "target": u.target,
                                "reason": u.trouble.to_string(),
                                "kept": u.kept.map(|a| a.to_string()),
                            })
                        })
                        .collect();
                    value["name"] = dns.name.clone().into();
                    value["record"] = match dns.record {
                        DnsRecord::Address { .. } => "a",
                        DnsRecord::Srv => "srv",
                    }
                    .into();
                }
                PoolSource::Etcd(etcd) => {
                    value["prefix"] = etcd.prefix.clone().into();
                    value["endpoints"] = etcd
                        .endpoints
                        .iter()
                        .map(|e| e.url.clone())
                        .collect::<Vec<_>>()
                        .into();
                }
                PoolSource::Static => {}
            }
            value
        }
    }
}

fn explain_standing(pool: &PoolRt, view: &BackendView) -> String {
    let config = &pool.config;
    let clock_of = |t: Duration| clock(pool.clock().wall(t));
    let health = &view.health;
    let active = &health.active;
    let passive = &health.passive;
    let rise = config.active.rise.get();
    let in_flight = view
        .backend
        .in_flight
        .load(std::sync::atomic::Ordering::Relaxed);
    let fall = config.active.fall.get();
    let limit = config.passive.consecutive_errors.get();
    let next_probe = view
        .next_probe
        .filter(|_| config.active.kind != CheckKind::None)
        .map(|due| {
            format!(
                ", next probe in {}",
                human_duration(due.saturating_sub(view.now))
            )
        })
        .unwrap_or_default();
    if let Some(o) = view.info.override_ {
        let until = match o.until {
            Some(until) => format!("until {}", clock_of(until)),
            None => "until cleared".into(),
        };
        let health_says = format!(
            "health checks say {} ({})",
            health.verdict(),
            short_health(pool, view)
        );
        return match o.kind {
            OverrideKind::Drain => format!(
                "DRAINING since {} (manual, {until}): no new requests, {in_flight} in flight; {health_says}",
                clock(o.since),
            ),
            OverrideKind::Maintenance => {
                let back = back_from_maintenance(pool.requalify_passes());
                format!(
                    "MAINTENANCE since {} (manual, {until}): no new requests, {in_flight} in flight, \
                     no probes; {back}; {health_says}",
                    clock(o.since),
                )
            }
            OverrideKind::Down => format!(
                "FORCED DOWN since {} (manual, {until}); {health_says}",
                clock(o.since)
            ),
            OverrideKind::Up => format!(
                "FORCED UP since {} (manual, {until}): gets traffic whatever health says; {health_says}",
                clock(o.since)
            ),
        };
    }
    let agent_says = view.agent;
    if view.effective == Effective::Maintenance && agent_says.hold == Some(AgentHold::Maint) {
        return format!(
            "MAINTENANCE (its agent said maint; agent says {agent_says}): no new requests, \
             {in_flight} in flight, no probes; {}; health checks say {} ({})",
            back_from_maintenance(pool.requalify_passes()),
            health.verdict(),
            short_health(pool, view)
        );
    }
    if let Some((has, needs)) = view.requalifying {
        return format!(
            "REQUALIFYING: back from maintenance, needs {needs} passing probes in a row before \
             traffic (has {has}){next_probe}; health checks say {} ({})",
            health.verdict(),
            short_health(pool, view)
        );
    }
    if view.effective == Effective::SelfDraining && agent_says.holds_out() {
        return format!(
            "SELF_DRAINING: its agent asked for a drain (agent says {agent_says}): no new \
             requests, {in_flight} in flight; the agent's up or ready brings it back; health \
             checks say {} ({})",
            health.verdict(),
            short_health(pool, view)
        );
    }
    if agent_says.holds_out() {
        return format!(
            "HELD OUT by its agent (agent says {agent_says}): no new requests, {in_flight} in flight; health checks say {} ({})",
            health.verdict(),
            short_health(pool, view)
        );
    }
    let since = clock(view.info.since);
    if view.effective == Effective::SelfDraining {
        return format!(
            "SELF_DRAINING: UP since {since}, but its health route answered HTTP 404 \
             (disable_on_404): no new requests, {in_flight} in flight; the next passing probe \
             brings it back at once{next_probe}"
        );
    }
    let tracked = config
        .backends
        .get(view.index)
        .and_then(|b| b.track.as_ref());
    if let (Some(track), Ejection::None | Ejection::Probation { .. }) = (tracked, passive.ejection)
    {
        let follows = format!(
            "tracks {}/{}, whose active checks say {}; it follows them, checked every {}",
            track.pool,
            track.backend,
            active.state,
            human_duration(config.active.interval)
        );
        return match active.state {
            State::Down => format!("DOWN since {since}: {follows}"),
            State::Up => format!(
                "UP since {since}: {follows}; traffic errors in a row: {} of {limit}",
                passive.error_streak
            ),
        };
    }
    if let Ejection::Ejected {
        until,
        nth,
        since: ejected_at,
    } = passive.ejection
    {
        let cause = match view.info.last_transition {
            Some((_, t)) if t.to == State::Down => match t.reason {
                Reason::TrafficErrors { streak, last, .. } => {
                    format!("{streak} consecutive traffic errors (last: {last})")
                }
                Reason::ProbationFailed { last, .. } => {
                    format!("a traffic error on probation (last: {last})")
                }
                Reason::SlowTraffic {
                    percentile,
                    latency,
                    median,
                    windows,
                    ..
                } => format!(
                    "a latency outlier: {}",
                    SlowSentence {
                        percentile,
                        latency,
                        median,
                        windows
                    }
                ),
                Reason::ErrorRate {
                    success_permille,
                    mean_permille,
                    threshold_permille,
                    ..
                } => format!(
                    "an error-rate outlier: {}",
                    RateSentence {
                        success_permille,
                        mean_permille,
                        threshold_permille
                    }
                ),
                other => other.to_string(),
            },
            _ => format!("{limit} consecutive traffic errors"),
        };
        let active_note = if active.state == State::Down {
            let then = if config.passive.probes_end_ejection && until.is_some() {
                " to come back UP, which also ends this ejection early"
            } else {
                ""
            };
            format!(
                "; probes also fail: needs {rise} passing probes in a row{then} (has {}){next_probe}",
                active.pass_streak
            )
        } else {
            String::new()
        };
        return match until {
            Some(until) => format!(
                "ejected until {} ({} ejection, {}): {cause}{active_note}",
                clock_of(until),
                ordinal(nth),
                human_duration(until.saturating_sub(ejected_at))
            ),
            None => format!(
                "ejected since {since}: {cause}; one good response readmits it{active_note}"
            ),
        };
    }
    if active.state == State::Down {
        let cause = match view.info.last_transition {
            Some((_, t))
                if t.to == State::Down && matches!(t.reason, Reason::ProbesFailed { .. }) =>
            {
                match t.reason {
                    Reason::ProbesFailed {
                        streak,
                        last,
                        mismatch,
                    } => match mismatch {
                        Some(mismatch) => {
                            format!("{streak} consecutive failed probes (last: {last}, {mismatch})")
                        }
                        None => format!("{streak} consecutive failed probes (last: {last})"),
                    },
                    _ => unreachable!("matched ProbesFailed above"),
                }
            }
            _ if config.active.first_probe && !active.probed => {
                return format!(
                    "DOWN since {since}: waiting for its first probe (initial = first-probe: \
                     one passing probe brings it UP at once, a failed one leaves it DOWN until \
                     {rise} pass in a row){next_probe}"
                );
            }
            _ if view.info.last_transition.is_none() => {
                match view.info.probes.back().and_then(|p| p.outcome.mismatch) {
                    Some(mismatch) => format!(
                        "not yet proven healthy (new backends start DOWN); last probe: {mismatch}"
                    ),
                    None => "not yet proven healthy (new backends start DOWN)".to_string(),
                }
            }
            _ => format!("{} consecutive failed probes", active.fail_streak),
        };
        let cadence = match view.cadence {
            Cadence::Down if config.active.down_interval != config.active.interval => format!(
                ", probed every {} while DOWN",
                human_duration(config.active.down_interval)
            ),
            Cadence::Fast if config.active.fast_interval != config.active.interval => format!(
                ", probed every {} while the streak lasts",
                human_duration(config.active.fast_interval)
            ),
            _ => String::new(),
        };
        return format!(
            "DOWN since {since}: {cause}; needs {rise} passing probes in a row (has {}){cadence}{next_probe}",
            active.pass_streak
        );
    }
    let probation = match passive.ejection {
        Ejection::Probation { since } => format!(
            " on probation since {}: one good response readmits it, one traffic error ejects it again for {}",
            clock_of(since),
            human_duration(
                EjectionPolicy {
                    base: config.passive.ejection_time,
                    max: config.passive.max_ejection_time,
                }
                .duration(passive.times_ejected.saturating_add(1))
            )
        ),
        _ => String::new(),
    };
    let agent = if view.agent.weight_percent < 100 {
        format!("; agent weight {}%", view.agent.weight_percent)
    } else {
        String::new()
    };
    let shed = match (view.shed, config.passive.load_shedding) {
        (Some(shed), Some(shedding)) => format!(
            "; shedding load: answered {}, weight at {} % until {}",
            shed.status,
            shedding.weight_percent,
            clock_of(shed.until)
        ),
        _ => String::new(),
    };
    // Whether it ramps is the engine's word, and the weight the snapshot's: the one the
    // picker uses.
    let ramp = if view.ramping {
        format!(
            "; slow start: weight {:.1} of {}",
            f64::from(view.effective_weight_tenths) / 10.0,
            view.backend.weight
        )
    } else {
        String::new()
    };
    format!(
        "UP since {since}{probation}; failed probes in a row: {} of {fall}, traffic errors in a row: {} of {limit}{agent}{shed}{ramp}{next_probe}",
        active.fail_streak, passive.error_streak
    )
}

fn short_health(pool: &PoolRt, view: &BackendView) -> String {
    let h = &view.health;
    format!(
        "active {}, {} of {} failed probes and {} of {} passing probes in a row; {} of {} traffic errors in a row",
        h.active.state,
        h.active.fail_streak,
        pool.config.active.fall,
        h.active.pass_streak.min(pool.config.active.rise.get()),
        pool.config.active.rise,
        h.passive.error_streak,
        pool.config.passive.consecutive_errors
    )
}

/// What ejected a backend, by its last transition: `traffic_errors`, `probation_failed`,
/// `latency_outlier`, `error_rate` (`null` if that transition says otherwise).
fn ejection_cause(view: &BackendView) -> Option<&'static str> {
    match view.info.last_transition?.1.reason {
        Reason::TrafficErrors { .. } => Some("traffic_errors"),
        Reason::ProbationFailed { .. } => Some("probation_failed"),
        Reason::SlowTraffic { .. } => Some("latency_outlier"),
        Reason::ErrorRate { .. } => Some("error_rate"),
        _ => None,
    }
}

/// The JSON of one backend (with its explain sentence).
pub fn backend_json(pool: &PoolRt, view: &BackendView) -> Value {
    let clock = pool.clock();
    let wall = |t: Duration| rfc3339(clock.wall(t));
    let health = &view.health;
    let ejection = match health.passive.ejection {
        Ejection::None => json!({ "state": "none" }),
        Ejection::Ejected { since, until, nth } => json!({
            "state": "ejected",
            "cause": ejection_cause(view),
            "since": wall(since),
            "until": until.map(wall),
            "nth": nth,
            "duration_ms": until.map(|u| u.saturating_sub(since).as_millis() as u64),
        }),
        Ejection::Probation { since } => json!({ "state": "probation", "since": wall(since) }),
    };
    let last_probe = view.info.probes.back().map(|p| {
        json!({
            "outcome": p.outcome.outcome.to_string(),
            "mismatch": p.outcome.mismatch.map(|m| m.to_string()),
            "result": p.result.as_str(),
            "latency_ms": ms(p.latency),
            "at": rfc3339(p.at),
        })
    });
    let probes: Vec<Value> = view
        .info
        .probes
        .iter()
        .map(|p| json!({ "outcome": p.outcome.outcome.to_string(), "mismatch": p.outcome.mismatch.map(|m| m.to_string()), "result": p.result.as_str(), "at": rfc3339(p.at) }))
        .collect();
    let rule = TrafficRule {
        count_503: pool.config.passive.count_503,
        grpc_errors: pool.config.passive.grpc_error_codes,
    };
    let traffic: Vec<Value> = view
        .backend
        .traffic
        .recent()
        .into_iter()
        .map(|o| json!({ "outcome": o.to_string(), "result": rule.judge(o).as_str() }))
        .collect();
    let last_transition = view.info.last_transition.map(|(at, t)| {
        json!({
            "at": rfc3339(at),
            "from": t.from.as_str(),
            "to": t.to.as_str(),
            "side": t.reason.side().as_str(),
            "reason": t.reason.to_string(),
        })
    });
    let override_ = view.info.override_.map(|o| {
        json!({
            "kind": o.kind.as_str(),
            "since": rfc3339(o.since),
            "until": o.until.map(wall),
        })
    });
    let next_probe_in_ms = view
        .next_probe
        .filter(|_| pool.config.active.kind != CheckKind::None)
        .map(|due| due.saturating_sub(view.now).as_millis() as u64);
    json!({
        "pool": &*pool.name,
        "name": &*view.backend.name,
        "address": view.backend.address,
        "verdict": health.verdict().as_str(),
        "state": view.state(),
        "eligible": view.eligible,
        "since": rfc3339(view.info.since),
        "source": pool.config.source.kind(),
        "joined": rfc3339(view.info.joined),
        "active": {
            "kind": match pool.config.active.kind { CheckKind::Http => "http", CheckKind::Tcp => "tcp", CheckKind::Grpc => "grpc", CheckKind::None => "none" },
            "state": health.active.state.as_str(),
            "fail_streak": health.active.fail_streak,
            "pass_streak": health.active.pass_streak,
            "rise": pool.config.active.rise.get(),
            "fall": pool.config.active.fall.get(),
            "last_probe": last_probe,
            "next_probe_in_ms": next_probe_in_ms,
            "cadence": view.cadence.as_str(),
            "track": pool.config.backends.get(view.index).and_then(|b| b.track.as_ref()).map(|t| format!("{}/{}", t.pool, t.backend)),
            "probe_interval_ms": crate::health::probe_intervals(&pool.config).of(view.cadence).as_millis() as u64,
        },
        "agent": pool.config.agent.map(|_| json!({
            "says": view.agent.to_string(),
            "hold": view.agent.hold.map(|h| h.as_str()),
            "weight_percent": view.agent.weight_percent,
        })),
        "passive": {
            "enabled": pool.config.passive.enabled,
            "error_streak": health.passive.error_streak,
            "consecutive_errors": pool.config.passive.consecutive_errors.get(),
            "ejection": ejection,
            "times_ejected": health.passive.times_ejected,
            "slow_windows": health.passive.slow_windows,
            "shedding": view.shed.map(|shed| json!({
                "status": shed.status,
                "until": rfc3339(pool.clock().wall(shed.until)),
                "remaining_ms": shed.until.saturating_sub(view.now).as_millis() as u64,
            })),
        },
        "history": { "probes": probes, "traffic": traffic },
        "last_transition": last_transition,
        "in_flight": view.backend.in_flight.load(std::sync::atomic::Ordering::Relaxed),
        "weight": view.backend.weight,
        "effective_weight": f64::from(view.effective_weight_tenths) / 10.0,
        "override": override_,
        "role": match view.role { Role::Primary => "primary", Role::Backup => "backup" },
        "serving": view.serving,
        "requalify": view.requalifying.map(|(has, needs)| json!({ "passes": has, "needs": needs })),
        "explain": explain(pool, view),
    })
}

/// The whole `GET /status` page, pretty-printed: the time and every pool with all its backends.
///
/// It is written backend by backend: each backend's JSON tree is built, written out and
/// dropped before the next, so building the page costs its text plus one backend's tree.
/// (With the whole tree built first, 10,000 backends took about 230 MB for a 10 MB page.)
pub fn page(
    pools: &[Arc<PoolRt>],
    time: &str,
    fleet: Option<Value>,
) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, PrettyFormatter::new());
    Page { pools, time, fleet }.serialize(&mut serializer)?;
    out.push(b'\n');
    Ok(out)
}

// Keys are written in alphabetical order, as `json!` (a sorted map) writes the backends' own.

struct Page<'a> {
    pools: &'a [Arc<PoolRt>],
    time: &'a str,
    /// Shared probing, with `[fleet]` on.
    fleet: Option<Value>,
}

impl Serialize for Page<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(fleet) = &self.fleet {
            map.serialize_entry("fleet", fleet)?;
        }
        map.serialize_entry("pools", &Pools(self.pools))?;
        map.serialize_entry("time", self.time)?;
        map.end()
    }
}

struct Pools<'a>(&'a [Arc<PoolRt>]);

impl Serialize for Pools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for pool in self.0 {
            seq.serialize_element(&PoolPage(pool))?;
        }
        seq.end()
    }
}

/// One pool and all its backends.
struct PoolPage<'a>(&'a PoolRt);

impl Serialize for PoolPage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let pool = self.0;
        // One snapshot, the picker's, says who serves and why; the views were copied beside it.
        let (snapshot, views) = pool.standing();
        let all_down = snapshot.all_down;
        let healthy = views.iter().filter(|v| v.eligible).count();
        let when_all_down = match pool.config.when_all_down {
            AllDownPolicy::FailOpen => "fail_open",
            AllDownPolicy::Reject { .. } => "reject",
        };
        let all_down_now = snapshot.applied;
        let applied = all_down_now.map(|applied| applied.policy());
        let on_backups = snapshot.on_backups.map(|_| {
            snapshot
                .eligible
                .iter()
                .map(|&i| pool.backends[i].name.to_string())
                .collect::<Vec<_>>()
        });
        let primaries = pool.config.backends.iter().filter(|b| !b.backup).count();
        let min = pool.config.min_healthy;
        let min_healthy = json!({
            "count": min.count,
            "percent": min.percent,
            "needed": min.needed(primaries),
        });
        let explain = match (all_down_now, &on_backups) {
            (Some(applied), _) => format!("{}: {applied}", applied.headline()),
            (None, Some(names)) => format!(
                "no primary backend in rotation: served by its backup{} {}",
                if names.len() == 1 { "" } else { "s" },
                names.join(", ")
            ),
            (None, None) => "served by its primary backends in rotation".to_owned(),
        };
        let mut map = serializer.serialize_map(Some(12))?;
        map.serialize_entry("all_down", &all_down)?;
        map.serialize_entry("all_down_policy", &applied)?;
        map.serialize_entry(
            "backends",
            &Backends {
                pool,
                views: &views,
            },
        )?;
        map.serialize_entry("backends_total", &views.len())?;
        map.serialize_entry("backups", pool.config.backups.as_str())?;
        map.serialize_entry("explain", &explain)?;
        map.serialize_entry("healthy", &healthy)?;
        map.serialize_entry("min_healthy", &min_healthy)?;
        map.serialize_entry("name", &*pool.name)?;
        map.serialize_entry("on_backups", &on_backups)?;
        map.serialize_entry("source", &source_json(pool))?;
        map.serialize_entry("when_all_down", when_all_down)?;
        map.end()
    }
}

struct Backends<'a> {
    pool: &'a PoolRt,
    views: &'a [BackendView],
}

impl Serialize for Backends<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.views.len()))?;
        for view in self.views {
            seq.serialize_element(&backend_json(self.pool, view))?;
        }
        seq.end()
    }
}
