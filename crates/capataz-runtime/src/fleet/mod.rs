//! Shared probing across balancers (`[fleet]`): the instances configured with the
//! same etcd and group register with a lease, each backend is probed by `owners` of them
//! (rendezvous hashing over the live members, decided by the engine's
//! [`Group`](capataz_health::Group)), owners publish their active verdicts, and every instance
//! feeds the published verdicts of backends it does not own to its engine
//! ([`PoolRt::record_published`]). Passive checks, overrides, events and metrics stay local.
//!
//! [`FleetRt`] is what the rest of the balancer sees: the pools' drivers ask it whether this
//! instance owns a due probe's backend (through [`ProbeOwnership`], which `health` defines), `/status`
//! and the metrics read it. `run.rs` is the task that talks to etcd (reusing the etcd
//! source's gateway client, `discovery::etcd::http`) and keeps it current; `wire.rs` the keys
//! and values.
//!
//! Invariants: an instance that has not joined, or is cut off from etcd for longer than its
//! lease, owns every backend (it probes everything itself); a verdict published by an instance
//! that is not an owner is never followed; nothing here decides health: the engine does.

pub(crate) mod run;
pub(crate) mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use capataz_health::Group;
use serde_json::{json, Value};

use crate::health::{PoolRt, ProbeOwnership};
use wire::Verdict;

/// The backend key ownership is hashed on: `<pool>/<address>`.
pub(crate) fn backend_key(pool: &str, address: &str) -> String {
    format!("{pool}/{address}")
}

/// The instance name used without `fleet.instance`: the host's name (from
/// `/proc/sys/kernel/hostname`, else `capataz`) and the first listener's port, `HOST:PORT`,
/// cut to a key-safe name.
pub(crate) fn default_instance(port: u16) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(50)
        .collect();
    let host = if host.is_empty() {
        "capataz".to_owned()
    } else {
        host
    };
    format!("{host}:{port}")
}

/// The fleet's counters, read by the metrics at each scrape.
#[derive(Debug, Default)]
pub(crate) struct FleetCounters {
    /// Live members of the group, as last seen (0 while not joined).
    pub members: AtomicUsize,
    /// Backends this instance probes.
    pub owned: AtomicUsize,
    /// Verdicts this instance published.
    pub published: AtomicU64,
    /// Whether it is cut off from etcd (probing everything itself).
    pub cut_off: AtomicBool,
}

/// The verdicts published for one backend, by publisher.
pub(crate) type Publications = Vec<(String, Verdict)>;

/// The lease this instance's registration is written with, as the task last held it: what a
/// clean stop or a reload revokes, so that the group moves this instance's backends at once
/// instead of one lease later.
#[derive(Clone, Debug)]
pub(crate) struct HeldLease {
    /// The endpoint that granted or last kept it.
    pub(crate) endpoint: crate::config::EtcdEndpoint,
    pub(crate) lease: i64,
    pub(crate) timeout: std::time::Duration,
}

/// This instance's place in its fleet group.
#[derive(Debug)]
pub struct FleetRt {
    view: RwLock<View>,
    /// The lease the task holds now, if any.
    held: Mutex<Option<HeldLease>>,
    /// Published verdicts by (pool, address): what followers read.
    published: Mutex<HashMap<(String, String), Publications>>,
    counters: Arc<FleetCounters>,
}

#[derive(Debug)]
struct View {
    /// `None`: no `[fleet]`, this instance probes everything.
    group: Option<Group>,
    /// The group's name.
    name: String,
    cut_off: bool,
}

impl FleetRt {
    /// A fleet runtime that owns every backend until a group is set, counting into `counters`.
    pub(crate) fn new(counters: Arc<FleetCounters>) -> Arc<FleetRt> {
        Arc::new(FleetRt {
            view: RwLock::new(View {
                group: None,
                name: String::new(),
                cut_off: false,
            }),
            held: Mutex::new(None),
            published: Mutex::new(HashMap::new()),
            counters,
        })
    }

    /// Records the lease the task holds (`None`: none).
    pub(crate) fn hold(&self, held: Option<HeldLease>) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = held;
    }

    /// Takes the lease the task held, to revoke it once the task is stopped.
    pub(crate) fn take_held(&self) -> Option<HeldLease> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn view(&self) -> std::sync::RwLockReadGuard<'_, View> {
        // Every writer replaces whole fields: poison is harmless.
        self.view.read().unwrap_or_else(|e| e.into_inner())
    }

    fn view_mut(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.view.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn published(&self) -> MutexGuard<'_, HashMap<(String, String), Publications>> {
        self.published.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters.
    pub(crate) fn counters(&self) -> &Arc<FleetCounters> {
        &self.counters
    }

    /// Sets the group seen (`None`: shared probing off) under the group name `name`.
    pub(crate) fn set_group(&self, name: &str, group: Option<Group>) {
        let mut view = self.view_mut();
        let members = group
            .as_ref()
            .filter(|g| g.joined())
            .map_or(0, |g| g.members().len());
        self.counters.members.store(members, Ordering::Relaxed);
        view.name = name.to_owned();
        view.group = group;
    }

    /// Marks this instance cut off from etcd (it owns everything) or back.
    pub(crate) fn set_cut_off(&self, cut_off: bool) {
        self.view_mut().cut_off = cut_off;
        self.counters.cut_off.store(cut_off, Ordering::Relaxed);
    }

    /// Whether this instance is cut off from etcd.
    pub(crate) fn cut_off(&self) -> bool {
        self.view().cut_off
    }

    /// Whether this instance probes the backend at `address` of `pool` (see the module's
    /// invariants): the group's answer, every backend without `[fleet]`. (Cut off, the group
    /// set has no members, and the engine's `Group` says an instance outside it owns all.)
    pub fn owns_backend(&self, pool: &str, address: &str) -> bool {
        self.view()
            .group
            .as_ref()
            .is_none_or(|group| group.owns(&backend_key(pool, address)))
    }

    /// The `fleet` object of `/status` (`None` without `[fleet]`): the group, this instance,
    /// the live members, `owners`, whether it is cut off, and per backend its owners and where
    /// its active verdict comes from (`self`, or the owner whose published verdict it follows;
    /// `null` while no owner has published).
    pub fn status(&self, pools: &[Arc<PoolRt>]) -> Option<Value> {
        let view = self.view();
        let group = view.group.as_ref()?;
        let published = self.published();
        let mut backends = Vec::new();
        for pool in pools {
            for backend in pool.backends.iter() {
                let key = backend_key(&pool.name, &backend.address);
                let owners = group.owners(&key);
                let mine = owners.contains(&group.me());
                let from = if mine {
                    Some(group.me().to_owned())
                } else {
                    published
                        .get(&(pool.name.to_string(), backend.address.clone()))
                        .and_then(|list| group.followed(&key, list))
                        .map(|(by, _)| by.clone())
                };
                backends.push(json!({
                    "pool": &*pool.name,
                    "backend": &*backend.name,
                    "owners": owners,
                    "probed_here": mine,
                    "verdict_from": from,
                }));
            }
        }
        Some(json!({
            "group": view.name,
            "instance": group.me(),
            "members": group.members(),
            "owners": group.k(),
            "joined": group.joined(),
            "cut_off": view.cut_off,
            "backends": backends,
        }))
    }
}

impl ProbeOwnership for FleetRt {
    fn owns(&self, pool: &str, address: &str) -> bool {
        self.owns_backend(pool, address)
    }
}
