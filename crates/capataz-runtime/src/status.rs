//! What the admin API says about pools and backends: the `/status` JSON and the one sentence
//! that explains why a backend is in or out and when that changes (`explain.rs`). Both render
//! each backend's [`Standing`](capataz_health::Standing), the engine's one value: which rule
//! decides, since when and with what weight is never worked out here.

mod explain;
mod listeners;
mod queue;

pub use listeners::ListenerView;

use std::sync::Arc;
use std::time::Duration;

use capataz_health::rotation::Cause;
use capataz_health::{Ejection, Reason, Role, TrafficRule};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::ser::PrettyFormatter;
use serde_json::{json, Value};

use crate::config::{AllDownPolicy, CheckKind, DnsRecord, PoolSource};
use crate::health::{BackendView, PoolRt};
use crate::timefmt::rfc3339;

pub use explain::explain;

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
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
            let state = pool.source_record.state();
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

/// What ejected a backend, by its last transition: `traffic_errors`, `probation_failed`,
/// `latency_outlier`, `error_rate` (`null` if that transition says otherwise).
fn ejection_cause(view: &BackendView) -> Option<&'static str> {
    match view.standing.last_transition?.reason {
        Reason::TrafficErrors { .. } => Some("traffic_errors"),
        Reason::ProbationFailed { .. } => Some("probation_failed"),
        Reason::SlowTraffic { .. } => Some("latency_outlier"),
        Reason::ErrorRate { .. } => Some("error_rate"),
        _ => None,
    }
}

/// A backend's passive ejection, for `/status`: `state` (`none`, `ejected`, `probation`), and
/// when ejected its `cause`, `since`, `until`, `nth` and `duration_ms`.
fn ejection_json(pool: &PoolRt, view: &BackendView) -> Value {
    let clock = pool.clock();
    let wall = |t: Duration| rfc3339(clock.wall(t));
    match view.standing.health.passive.ejection {
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
    }
}

/// A backend's recent probes and traffic outcomes, oldest first, each with how its rule
/// judged it.
fn history_json(pool: &PoolRt, view: &BackendView) -> Value {
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
    json!({ "probes": probes, "traffic": traffic })
}

/// The JSON of one backend (with its explain sentence).
pub fn backend_json(pool: &PoolRt, view: &BackendView) -> Value {
    let clock = pool.clock();
    let wall = |t: Duration| rfc3339(clock.wall(t));
    let standing = &view.standing;
    let health = &standing.health;
    let last_probe = view.info.probes.back().map(|p| {
        json!({
            "outcome": p.outcome.outcome.to_string(),
            "mismatch": p.outcome.mismatch.map(|m| m.to_string()),
            "result": p.result.as_str(),
            "latency_ms": ms(p.latency),
            "at": rfc3339(p.at),
        })
    });
    let last_transition = standing.last_transition.map(|t| {
        json!({
            "at": wall(t.at),
            "from": t.from.as_str(),
            "to": t.to.as_str(),
            "side": t.reason.side().as_str(),
            "reason": t.reason.to_string(),
        })
    });
    let override_ = match standing.cause {
        Cause::Override(o) => Some(json!({
            "kind": o.kind.as_str(),
            "since": wall(o.since),
            "until": o.until.map(wall),
        })),
        _ => None,
    };
    let next_probe_in_ms = view
        .next_probe
        .filter(|_| pool.config.active.kind != CheckKind::None)
        .map(|due| due.saturating_sub(view.now).as_millis() as u64);
    let mut backend = json!({
        "pool": &*pool.name,
        "name": &*view.backend.name,
        "address": view.backend.address,
        "verdict": health.verdict().as_str(),
        "state": view.state(),
        "eligible": standing.in_rotation(),
        "since": wall(standing.since),
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
            "cadence": standing.cadence.as_str(),
            "track": pool.config.backends.get(view.index).and_then(|b| b.track.as_ref()).map(|t| format!("{}/{}", t.pool, t.backend)),
            "probe_interval_ms": crate::health::probe_intervals(&pool.config).of(standing.cadence).as_millis() as u64,
        },
        "agent": pool.config.agent.map(|_| json!({
            "says": standing.agent.to_string(),
            "hold": standing.agent.hold.map(|h| h.as_str()),
            "weight_percent": standing.agent.weight_percent,
        })),
        "passive": {
            "enabled": pool.config.passive.enabled,
            "error_streak": health.passive.error_streak,
            "consecutive_errors": pool.config.passive.consecutive_errors.get(),
            "ejection": ejection_json(pool, view),
            "times_ejected": health.passive.times_ejected,
            "slow_windows": health.passive.slow_windows,
            "shedding": standing.shed.map(|shed| json!({
                "status": shed.status,
                "until": rfc3339(pool.clock().wall(shed.until)),
                "remaining_ms": shed.until.saturating_sub(view.now).as_millis() as u64,
            })),
        },
        "history": history_json(pool, view),
        "last_transition": last_transition,
        "in_flight": view.backend.in_flight.load(std::sync::atomic::Ordering::Relaxed),
        "limit": queue::limit_of(pool, view),
        "weight": view.backend.weight,
        "effective_weight": f64::from(standing.weight_tenths) / 10.0,
        "override": override_,
        "role": match standing.role { Role::Primary => "primary", Role::Backup => "backup" },
        "serving": view.serving,
        "requalify": standing.requalifying.map(|(has, needs)| json!({ "passes": has, "needs": needs })),
        "explain": explain(pool, view),
    });
    // Peak EWMA pools only: the latency estimate the picker compares (null: unsampled).
    if let Some(ewma) = &view.backend.ewma {
        let estimate = ewma.estimate(std::time::Instant::now());
        backend["latency_estimate_ms"] = json!(estimate.map(|ns| ns / 1e6));
    }
    backend
}

/// The whole `GET /status` page, pretty-printed: the time, the client listeners (`listeners`,
/// left out when empty) and every pool with all its backends.
///
/// It is written backend by backend: each backend's JSON tree is built, written out and
/// dropped before the next, so building the page costs its text plus one backend's tree.
/// (With the whole tree built first, 10,000 backends took about 230 MB for a 10 MB page.)
pub fn page(
    pools: &[Arc<PoolRt>],
    time: &str,
    fleet: Option<Value>,
    listeners: &[ListenerView],
) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, PrettyFormatter::new());
    let page = Page {
        pools,
        time,
        fleet,
        listeners,
    };
    page.serialize(&mut serializer)?;
    out.push(b'\n');
    Ok(out)
}

// Keys are written in alphabetical order, as `json!` (a sorted map) writes the backends' own.

struct Page<'a> {
    pools: &'a [Arc<PoolRt>],
    time: &'a str,
    /// Shared probing, with `[fleet]` on.
    fleet: Option<Value>,
    /// The client listeners (none on a page of pools alone).
    listeners: &'a [ListenerView],
}

impl Serialize for Page<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(fleet) = &self.fleet {
            map.serialize_entry("fleet", fleet)?;
        }
        if !self.listeners.is_empty() {
            map.serialize_entry("listeners", self.listeners)?;
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
        let healthy = views.iter().filter(|v| v.standing.in_rotation()).count();
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
        let mut map = serializer.serialize_map(Some(15))?;
        map.serialize_entry("all_down", &all_down)?;
        map.serialize_entry("affinity", &affinity_json(pool, &snapshot))?;
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
        map.serialize_entry("protocol", protocol_name(pool.config.protocol))?;
        map.serialize_entry("queue", &queue::queue_json(pool))?;
        map.serialize_entry("source", &source_json(pool))?;
        map.serialize_entry("when_all_down", when_all_down)?;
        map.end()
    }
}

/// A pool's hashing and sticky sessions as configured, and the draining backends that keep
/// their sticky clients now (the snapshot's list); `null` for a pool with neither.
fn affinity_json(pool: &PoolRt, snapshot: &crate::balance::Snapshot) -> Value {
    let affinity = &pool.config.affinity;
    if affinity.hash.is_none() && affinity.sticky.is_none() {
        return Value::Null;
    }
    let hash = affinity
        .hash
        .as_ref()
        .map(|hash| json!({ "key": hash.key.to_string(), "balance_factor": hash.balance_factor }));
    let sticky = affinity.sticky.as_ref().map(|sticky| {
        let keeping: Vec<&str> = match sticky.on_drain {
            crate::config::OnDrain::Keep => snapshot
                .draining
                .iter()
                .filter_map(|&i| pool.backends.get(i).map(|b| &*b.name))
                .collect(),
            crate::config::OnDrain::Move => Vec::new(),
        };
        json!({
            "cookie": sticky.cookie,
            "on_drain": sticky.on_drain.as_str(),
            "keeping": keeping,
        })
    });
    json!({ "hash": hash, "sticky": sticky })
}

/// A pool's `protocol` as written in the config.
fn protocol_name(protocol: crate::config::BackendProtocol) -> &'static str {
    use crate::config::BackendProtocol;
    match protocol {
        BackendProtocol::Http1 => "http1",
        BackendProtocol::H2 => "h2",
        BackendProtocol::H2c => "h2c",
        BackendProtocol::Tcp => "tcp",
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
