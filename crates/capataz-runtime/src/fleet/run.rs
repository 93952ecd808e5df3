//! The fleet task: one per balancer with `[fleet]`. It holds a lease, registers this instance
//! under it, reads then watches the group's keys (members and verdicts), publishes the active
//! verdicts of the backends this instance owns, and feeds the others' verdicts to the pools.
//!
//! A session: grant a lease (or keep the last one, if etcd still has it), create the member key
//! with it if the name is free (held under another lease, the name is taken: the instance does
//! not join, says so once, and tries again), read the group's keys at a revision, watch from
//! the next one. Only what instances write counts: members and verdicts without a lease, and
//! verdicts under another lease than their publisher's registration, are skipped. The lease
//! is revoked when the task is replaced (a reload) or the balancer stops cleanly. Meanwhile keepalives
//! every third of the lease (on a task of their own, so a long scan never lets the lease
//! lapse), a scan every [`SCAN`] (new pools, ownership moves, verdicts to publish or
//! withdraw, written in transactions of [`TXN_OPS`]), and transition events bring the next
//! scan forward (within [`COALESCE`], so a burst costs one scan). A failed call ends the
//! session; the next one starts after a short backoff on the next endpoint. Failing for longer
//! than the lease, the instance is cut off: it owns every backend until a session succeeds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use capataz_health::{Group, Published, Snippet};
use serde::Deserialize;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::wire::{self, GroupKey, GroupKeys, Verdict};
use super::{backend_key, FleetRt, HeldLease};
use crate::config::{EtcdEndpoint, FleetConfig};
use crate::discovery::etcd::http::{call, Watch};
use crate::discovery::etcd::wire::{
    decode as b64decode, encode as b64encode, range_request, watch_request, RangeResponse,
    WatchLine,
};
use crate::events::{FleetChange, Notice};
use crate::health::{PoolRt, ProbingSlot};
use crate::logging;

/// How often the task looks at every pool (new pools, ownership, verdicts to publish).
const SCAN: Duration = Duration::from_millis(500);

/// The most members a group may have; more are ignored (with an event).
const MAX_MEMBERS: usize = 1024;

/// The most verdicts kept, all backends and publishers together; more are ignored (with an
/// event).
const MAX_VERDICTS: usize = 200_000;

/// The longest key of the group read, in bytes; longer ones are ignored (with an event).
const MAX_KEY: usize = 1024;

/// The most operations in one transaction (etcd's `--max-txn-ops` defaults to 128).
const TXN_OPS: usize = 100;

/// How long a transition waits for others to publish them together (a burst of transitions,
/// a pool coming UP at start, costs one scan, not one per backend).
const COALESCE: Duration = Duration::from_millis(20);

/// The pools of the balancer, as it has them now (`None` once it is gone).
pub(crate) type PoolsNow = Box<dyn Fn() -> Option<Arc<Vec<Arc<PoolRt>>>> + Send + Sync>;

/// What the task needs.
pub(crate) struct Task {
    pub(crate) fleet: Arc<FleetRt>,
    pub(crate) config: FleetConfig,
    pub(crate) instance: String,
    pub(crate) pools: PoolsNow,
    pub(crate) events: broadcast::Sender<Notice>,
    /// The lease of the task this one replaces (a reload), revoked before registering: the
    /// old registration must not hold this instance's name.
    pub(crate) revoke: Option<HeldLease>,
}

/// What a session ended with.
type Failed = String;

struct State {
    keys: GroupKeys,
    members: HashSet<String>,
    /// The lease each member (but this instance) is registered with: a verdict published in
    /// its name counts only under that lease.
    leases: HashMap<String, i64>,
    lease: Option<i64>,
    /// The last time etcd answered.
    last_ok: Instant,
    joined_once: bool,
    /// What this instance last published, by (pool, address).
    put: HashMap<(String, String), capataz_health::State>,
    /// What was last fed to each pool: (pool build, publisher, verdict), by (pool, address).
    applied: HashMap<(String, String), (usize, String, Verdict)>,
    /// The backends this instance owned at the last scan.
    owned: HashSet<(String, String)>,
    endpoint: usize,
    failures: u32,
    /// The verdicts held in `FleetRt::published`, all backends together.
    verdicts: usize,
    /// This session found this instance's name registered under another lease.
    taken_now: bool,
    /// The `name_taken` event was emitted and the name has not been won since.
    taken_said: bool,
    /// Why the session must end (this instance's registration was deleted or overwritten).
    lost: Option<Failed>,
}

/// What a scan found among the backends this instance owns.
#[derive(Default)]
struct Seen {
    /// How many it owns (all of them, when cut off).
    owned: usize,
    /// Which, by (pool, address).
    slots: HashSet<(String, String)>,
    /// The verdicts to publish: those that changed since last published, or never were.
    to_put: Vec<(String, String, Verdict)>,
}

impl Task {
    /// Runs until aborted (or the balancer is gone).
    pub(crate) async fn run(mut self) {
        let mut events = self.events.subscribe();
        let mut state = State {
            keys: GroupKeys::new(&self.config.prefix, &self.config.group),
            members: HashSet::new(),
            leases: HashMap::new(),
            lease: None,
            last_ok: Instant::now(),
            joined_once: false,
            put: HashMap::new(),
            applied: HashMap::new(),
            owned: HashSet::new(),
            endpoint: 0,
            failures: 0,
            verdicts: 0,
            taken_now: false,
            taken_said: false,
            lost: None,
        };
        if let Some(held) = self.revoke.take() {
            revoke(&held).await;
        }
        self.fleet
            .set_group(&self.config.group, Some(self.group(&state.members)));
        loop {
            if (self.pools)().is_none() {
                return;
            }
            let error = self.session(&mut state, &mut events).await;
            state.failures = state.failures.saturating_add(1);
            state.endpoint = (state.endpoint + 1) % self.config.endpoints.len().max(1);
            tracing::debug!(group = %self.config.group, %error, "fleet session ended");
            if std::mem::take(&mut state.taken_now) {
                // etcd answers: this is no cut-off. Not a member, this instance probes every
                // backend itself and publishes nothing under the name it does not hold.
                state.last_ok = Instant::now();
                state.members.clear();
                self.fleet
                    .set_group(&self.config.group, Some(self.group(&state.members)));
                if !state.taken_said {
                    state.taken_said = true;
                    self.emit(FleetChange::NameTaken {
                        instance: self.instance.clone(),
                    });
                }
                self.scan(&mut state).await.ok();
            }
            if !self.fleet.cut_off() && state.last_ok.elapsed() >= self.config.lease_ttl {
                self.fleet.set_cut_off(true);
                state.members.clear();
                self.fleet
                    .set_group(&self.config.group, Some(self.group(&state.members)));
                self.emit(FleetChange::CutOff { error });
                self.scan(&mut state).await.ok();
            }
            let backoff = Duration::from_millis(100u64 << state.failures.min(4).saturating_sub(1))
                .min(self.config.lease_ttl / 4);
            tokio::time::sleep(backoff).await;
        }
    }

    fn endpoint<'a>(&'a self, state: &State) -> &'a EtcdEndpoint {
        &self.config.endpoints[state.endpoint % self.config.endpoints.len()]
    }

    fn group(&self, members: &HashSet<String>) -> Group {
        Group::new(members.iter().cloned(), &self.instance, self.config.owners)
    }

    fn emit(&self, change: FleetChange) {
        let event = Notice::Fleet {
            group: self.config.group.as_str().into(),
            change,
            time: SystemTime::now(),
        };
        let level = match &event {
            Notice::Fleet {
                change:
                    FleetChange::CutOff { .. }
                    | FleetChange::Skipped { .. }
                    | FleetChange::NameTaken { .. },
                ..
            } => tracing::Level::WARN,
            _ => tracing::Level::INFO,
        };
        logging::emit(
            level,
            &event.sentence(),
            logging::Fields {
                event: event.kind(),
                pool: None,
                backend: None,
                from: None,
                to: None,
                side: None,
                reason: None,
                policy: None,
            },
        );
        let _ = self.events.send(event);
    }

    async fn call(&self, state: &State, path: &str, body: String) -> Result<Vec<u8>, Failed> {
        Ok(call(self.endpoint(state), path, body, self.config.timeout)
            .await?
            .to_vec())
    }

    /// One session, until something fails; returns why.
    async fn session(&self, state: &mut State, events: &mut broadcast::Receiver<Notice>) -> Failed {
        match self.session_inner(state, events).await {
            Ok(never) => match never {},
            Err(error) => error,
        }
    }

    async fn session_inner(
        &self,
        state: &mut State,
        events: &mut broadcast::Receiver<Notice>,
    ) -> Result<std::convert::Infallible, Failed> {
        let lease = self.lease(state).await?;
        self.fleet.hold(Some(HeldLease {
            endpoint: self.endpoint(state).clone(),
            lease,
            timeout: self.config.timeout,
        }));
        self.register(state, lease).await?;
        // Read the group at a revision, then watch from the next one.
        let root = state.keys.root.clone();
        let answer = self
            .call(
                state,
                "/v3/kv/range",
                range_request(root.as_bytes(), MAX_VERDICTS + MAX_MEMBERS, false),
            )
            .await?;
        let range: RangeResponse = serde_json::from_slice(&answer)
            .map_err(|e| format!("etcd's range answer is not readable: {e}"))?;
        state.members.clear();
        state.leases.clear();
        self.fleet.published().clear();
        state.verdicts = 0;
        state.applied.clear();
        for kv in &range.kvs {
            self.take(state, &kv.key, Some(&kv.value), kv.lease);
        }
        if range.more {
            self.emit(FleetChange::Skipped {
                key: root.clone(),
                error: format!(
                    "the group has more than {} keys; the ones after them are ignored",
                    MAX_VERDICTS + MAX_MEMBERS
                ),
            });
        }
        if let Some(error) = state.lost.take() {
            return Err(error);
        }
        state.members.insert(self.instance.clone());
        state.last_ok = Instant::now();
        state.failures = 0;
        let count = state.members.len();
        self.fleet
            .set_group(&self.config.group, Some(self.group(&state.members)));
        let was_taken = std::mem::take(&mut state.taken_said);
        if self.fleet.cut_off() {
            self.fleet.set_cut_off(false);
            self.emit(FleetChange::Reconnected { members: count });
        } else if !state.joined_once || was_taken {
            self.emit(FleetChange::Joined { members: count });
        }
        state.joined_once = true;
        // What this instance published before may be gone with an old lease: publish again,
        // after taking over what the others published for the backends it owns now.
        state.put.clear();
        state.owned.clear();
        self.scan(state).await?;
        let mut watch = Watch::open(
            self.endpoint(state),
            watch_request(root.as_bytes(), range.header.revision + 1),
            self.config.timeout,
        )
        .await?;
        // Keepalives run on their own, so a long scan (publishing thousands of verdicts) never
        // lets the lease lapse; the task ends with the session.
        let alive = Arc::new(std::sync::Mutex::new(Instant::now()));
        let (lost_tx, mut lost) = tokio::sync::oneshot::channel::<Failed>();
        let keeper = KeepAlive {
            endpoint: self.endpoint(state).clone(),
            timeout: self.config.timeout,
            every: (self.config.lease_ttl / 3).max(Duration::from_millis(500)),
            lease,
            alive: alive.clone(),
        };
        let keeper = AbortOnDropHandle::new(tokio::spawn(async move {
            let error = keeper.run().await;
            let _ = lost_tx.send(error);
        }));
        let result = self.follow(state, events, &mut watch, &mut lost).await;
        drop(keeper);
        let alive = *alive.lock().unwrap_or_else(|e| e.into_inner());
        state.last_ok = state.last_ok.max(alive);
        result
    }

    /// The session's loop: the watch, the scans, the transition events, until one fails or
    /// the keepalives do.
    async fn follow(
        &self,
        state: &mut State,
        events: &mut broadcast::Receiver<Notice>,
        watch: &mut Watch,
        lost: &mut tokio::sync::oneshot::Receiver<Failed>,
    ) -> Result<std::convert::Infallible, Failed> {
        let mut scan_at = Instant::now() + SCAN;
        loop {
            tokio::select! {
                line = watch.next_line() => {
                    let line = line?;
                    let line: WatchLine = serde_json::from_slice(&line)
                        .map_err(|e| format!("etcd's watch line is not readable: {e}"))?;
                    if let Some(error) = line.error {
                        return Err(format!("the watch failed: {error}"));
                    }
                    let Some(result) = line.result else { continue };
                    if result.canceled {
                        return Err(format!("the watch was cancelled: {}", result.cancel_reason));
                    }
                    let before = state.members.len();
                    let had: HashSet<String> = state.members.clone();
                    for event in &result.events {
                        let value = (event.kind != "DELETE").then_some(event.kv.value.as_str());
                        self.take(state, &event.kv.key, value, event.kv.lease);
                    }
                    if let Some(error) = state.lost.take() {
                        return Err(error);
                    }
                    // This instance is a member while its session lasts.
                    state.members.insert(self.instance.clone());
                    state.last_ok = Instant::now();
                    if state.members != had {
                        self.fleet.set_group(&self.config.group, Some(self.group(&state.members)));
                        let _ = before;
                        self.emit(FleetChange::Members { members: state.members.len() });
                    }
                    self.scan(state).await?;
                }
                error = &mut *lost => {
                    return Err(error.unwrap_or_else(|_| "the keepalives stopped".into()));
                }
                () = tokio::time::sleep_until(scan_at) => {
                    self.scan(state).await?;
                    scan_at = Instant::now() + SCAN;
                }
                event = events.recv() => {
                    match event {
                        Ok(Notice::Transition { .. }) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            scan_at = scan_at.min(Instant::now() + COALESCE);
                        }
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Closed) => {
                            return Err("the balancer is gone".into());
                        }
                    }
                }
            }
        }
    }

    /// The lease to register with: the last one if etcd still has it, else a new one.
    async fn lease(&self, state: &mut State) -> Result<i64, Failed> {
        if let Some(lease) = state.lease {
            if keepalive(self.endpoint(state), self.config.timeout, lease)
                .await
                .is_ok()
            {
                return Ok(lease);
            }
        }
        #[derive(Deserialize)]
        struct Granted {
            #[serde(rename = "ID")]
            id: String,
        }
        let ttl = self.config.lease_ttl.as_secs().max(2);
        let answer = self
            .call(state, "/v3/lease/grant", format!(r#"{{"TTL": {ttl}}}"#))
            .await?;
        let granted: Granted = serde_json::from_slice(&answer)
            .map_err(|e| format!("etcd's lease grant is not readable: {e}"))?;
        let lease = granted
            .id
            .parse()
            .map_err(|_| format!("etcd granted lease {:?}, not a number", granted.id))?;
        state.lease = Some(lease);
        Ok(lease)
    }

    /// Registers this instance under `lease`: creates its member key if nobody has it, or puts
    /// it again if it is this lease's already. Held under another lease, the name is taken
    /// (another instance configured with the same name, or a key written by hand): refused,
    /// with `taken_now` set.
    async fn register(&self, state: &mut State, lease: i64) -> Result<(), Failed> {
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            succeeded: bool,
            #[serde(default)]
            responses: Vec<Response>,
        }
        #[derive(Deserialize)]
        struct Response {
            #[serde(default)]
            response_range: Option<RangeResponse>,
        }
        let member = state.keys.member(&self.instance);
        let key = b64encode(member.as_bytes());
        let body = serde_json::json!({
            "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
            "success": [{ "request_put": {
                "key": key,
                "value": b64encode(b"{}"),
                "lease": lease.to_string(),
            }}],
            "failure": [{ "request_range": { "key": key } }],
        })
        .to_string();
        let answer = self.call(state, "/v3/kv/txn", body).await?;
        let answer: Answer = serde_json::from_slice(&answer)
            .map_err(|e| format!("etcd's transaction answer is not readable: {e}"))?;
        if answer.succeeded {
            return Ok(());
        }
        let holder = answer
            .responses
            .into_iter()
            .find_map(|r| r.response_range)
            .and_then(|r| r.kvs.into_iter().next())
            .map(|kv| kv.lease);
        match holder {
            Some(holder) if holder == lease => {
                self.write(state, &[(member, Some("{}".to_owned()))], lease)
                    .await
            }
            Some(holder) => {
                state.taken_now = true;
                Err(format!(
                    "the name {:?} is registered under lease {holder:x}, not this instance's",
                    self.instance
                ))
            }
            None => Err("this instance's member key changed while registering".into()),
        }
    }

    /// Puts (`Some(value)`, with `lease`) and deletes (`None`) in transactions of at most
    /// [`TXN_OPS`] operations (etcd's default limit is 128), one request each.
    async fn write(
        &self,
        state: &State,
        ops: &[(String, Option<String>)],
        lease: i64,
    ) -> Result<(), Failed> {
        for chunk in ops.chunks(TXN_OPS) {
            let success: Vec<serde_json::Value> = chunk
                .iter()
                .map(|(key, value)| match value {
                    Some(value) => serde_json::json!({ "request_put": {
                        "key": b64encode(key.as_bytes()),
                        "value": b64encode(value.as_bytes()),
                        "lease": lease.to_string(),
                    }}),
                    None => serde_json::json!({ "request_delete_range": {
                        "key": b64encode(key.as_bytes()),
                    }}),
                })
                .collect();
            let body = serde_json::json!({ "success": success }).to_string();
            self.call(state, "/v3/kv/txn", body).await?;
        }
        Ok(())
    }

    /// Takes one key of the group (`value` `None`: deleted; `lease`: the lease it is written
    /// with) into the members or the verdicts; anything unreadable is skipped with an event.
    /// This instance's own member key is not taken: deleted, or written under another lease,
    /// it ends the session (`lost`), which registers again.
    fn take(&self, state: &mut State, key: &str, value: Option<&str>, lease: i64) {
        let Some(key) = b64decode(key) else {
            return;
        };
        let key = match String::from_utf8(key) {
            Ok(key) => key,
            Err(error) => {
                let bytes = error.into_bytes();
                let cut = &bytes[..bytes.len().min(64)];
                self.emit(FleetChange::Skipped {
                    key: String::from_utf8_lossy(cut).into_owned(),
                    error: "the key is not UTF-8".into(),
                });
                return;
            }
        };
        if key.len() > MAX_KEY {
            self.emit(FleetChange::Skipped {
                key: format!("{}...", key.chars().take(64).collect::<String>()),
                error: format!("the key is {} bytes, more than {MAX_KEY}", key.len()),
            });
            return;
        }
        let Some(kind) = state.keys.parse(&key) else {
            return;
        };
        match kind {
            GroupKey::Member(name) if name == self.instance => match value {
                None => state.lost = Some("this instance's registration was deleted".into()),
                Some(_) if Some(lease) != state.lease => {
                    state.taken_now = true;
                    state.lost = Some(format!(
                        "this instance's registration was written again under lease {lease:x}"
                    ));
                }
                Some(_) => {}
            },
            GroupKey::Member(name) => {
                if value.is_none() {
                    state.members.remove(name);
                    state.leases.remove(name);
                } else if lease == 0 {
                    // Never from an instance: it would be a member forever, owning backends
                    // that nobody probes.
                    state.members.remove(name);
                    state.leases.remove(name);
                    self.emit(FleetChange::Skipped {
                        key: key.clone(),
                        error: "a member written without a lease (instances register with one)"
                            .into(),
                    });
                } else if state.members.contains(name) || state.members.len() < MAX_MEMBERS {
                    state.members.insert(name.to_owned());
                    state.leases.insert(name.to_owned(), lease);
                } else {
                    self.emit(FleetChange::Skipped {
                        key: key.clone(),
                        error: format!("the group has more than {MAX_MEMBERS} members"),
                    });
                }
            }
            GroupKey::Verdict { pool, address, by } => {
                let slot = (pool.to_owned(), address.to_owned());
                let Some(value) = value else {
                    self.forget(state, &slot, by);
                    return;
                };
                let verdict = match b64decode(value)
                    .ok_or_else(|| "the value is not base64".to_owned())
                    .and_then(|v| wire::decode(&v).map_err(|e| e.to_string()))
                    .and_then(|verdict| match state.leases.get(by) {
                        _ if lease == 0 => Err("a verdict written without a lease (instances \
                                                publish with theirs)"
                            .to_owned()),
                        Some(&theirs) if theirs != lease => Err(format!(
                            "a verdict written under lease {lease:x}, not the one instance \
                             {by:?} is registered with"
                        )),
                        _ => Ok(verdict),
                    }) {
                    Ok(verdict) => verdict,
                    Err(error) => {
                        // What the key held before is no verdict any more either.
                        self.forget(state, &slot, by);
                        self.emit(FleetChange::Skipped {
                            key: key.clone(),
                            error,
                        });
                        return;
                    }
                };
                let mut published = self.fleet.published();
                let known = published
                    .get(&slot)
                    .and_then(|list| list.iter().position(|(who, _)| who == by));
                if let Some(at) = known {
                    if let Some(list) = published.get_mut(&slot) {
                        list[at].1 = verdict;
                    }
                    return;
                }
                if state.verdicts >= MAX_VERDICTS {
                    drop(published);
                    self.emit(FleetChange::Skipped {
                        key: key.clone(),
                        error: format!("the group has more than {MAX_VERDICTS} verdicts"),
                    });
                    return;
                }
                published
                    .entry(slot)
                    .or_default()
                    .push((by.to_owned(), verdict));
                state.verdicts += 1;
            }
        }
    }

    /// Drops the verdict `by` published for `slot`, if any.
    fn forget(&self, state: &mut State, slot: &(String, String), by: &str) {
        let mut published = self.fleet.published();
        if let Some(list) = published.get_mut(slot) {
            let before = list.len();
            list.retain(|(who, _)| who != by);
            state.verdicts = state.verdicts.saturating_sub(before - list.len());
            if list.is_empty() {
                published.remove(slot);
            }
        }
    }

    /// Looks at every pool: attaches the fleet to pools new to it, counts the backends owned,
    /// publishes owned backends whose active state changed (or that were never published),
    /// withdraws verdicts of backends no longer owned, and feeds followed verdicts that changed.
    async fn scan(&self, state: &mut State) -> Result<(), Failed> {
        let Some(pools) = (self.pools)() else {
            return Err("the balancer is gone".into());
        };
        let group = self.group(&state.members);
        // Not a member (cut off, whose members are cleared; not registered yet; or its name is
        // taken): the group makes it own every backend, and it publishes nothing.
        let cut_off = !group.joined();
        let mut seen = Seen::default();
        for pool in pools.iter() {
            attach(&pool.probing, &self.fleet);
            for index in 0..pool.backends.len() {
                self.look_at(state, &group, cut_off, pool, index, &mut seen);
            }
        }
        self.fleet
            .counters
            .owned
            .store(seen.owned, std::sync::atomic::Ordering::Relaxed);
        state.owned = if cut_off {
            HashSet::new()
        } else {
            seen.slots.clone()
        };
        if cut_off {
            // Nothing reaches etcd; publish when back.
            return Ok(());
        }
        self.publish(state, seen).await
    }

    /// Looks at backend `index` of `pool`: an owned one is noted in `seen` (with its verdict,
    /// if that changed since published), a followed one gets the verdict its owner published.
    fn look_at(
        &self,
        state: &mut State,
        group: &Group,
        cut_off: bool,
        pool: &Arc<PoolRt>,
        index: usize,
        seen: &mut Seen,
    ) {
        let backend = &pool.backends[index];
        let slot = (pool.name.to_string(), backend.address.clone());
        let key = backend_key(&pool.name, &backend.address);
        if cut_off || group.owns(&key) {
            seen.owned += 1;
            if !cut_off && !state.owned.contains(&slot) {
                self.take_over(group, pool, index, &slot, &key);
            }
            seen.slots.insert(slot.clone());
            let Some((active, streak, last)) = pool.active_published(index) else {
                return;
            };
            if state.put.get(&slot) != Some(&active) {
                let why = capataz_health::PublishedWhy { streak, last };
                let verdict = Verdict { state: active, why };
                seen.to_put.push((slot.0, slot.1, verdict));
            }
            return;
        }
        let followed = {
            let published = self.fleet.published();
            published
                .get(&slot)
                .and_then(|list| group.followed(&key, list))
                .cloned()
        };
        let Some((by, verdict)) = followed else {
            return;
        };
        let current = (Arc::as_ptr(pool) as usize, by.clone(), verdict);
        if state.applied.get(&slot) == Some(&current) {
            return;
        }
        pool.record_published(
            index,
            Published {
                by: Snippet::new(&by),
                state: verdict.state,
                why: verdict.why,
            },
        );
        state.applied.insert(slot, current);
    }

    /// A backend newly owned starts from what its previous owners published, so that nothing
    /// flaps while ownership moves.
    fn take_over(
        &self,
        group: &Group,
        pool: &PoolRt,
        index: usize,
        slot: &(String, String),
        key: &str,
    ) {
        let handed = {
            let published = self.fleet.published();
            published
                .get(slot)
                .and_then(|list| group.handed_over(key, list))
                .cloned()
        };
        if let Some((by, verdict)) = handed {
            pool.record_published(
                index,
                Published {
                    by: Snippet::new(&by),
                    state: verdict.state,
                    why: verdict.why,
                },
            );
        }
    }

    /// Writes what a scan found to etcd: the verdicts that changed, and the withdrawal of those
    /// of backends no longer owned (nothing before a lease is held).
    async fn publish(&self, state: &mut State, seen: Seen) -> Result<(), Failed> {
        let Some(lease) = state.lease else {
            return Ok(());
        };
        let gone: Vec<(String, String)> = state
            .put
            .keys()
            .filter(|slot| !seen.slots.contains(*slot))
            .cloned()
            .collect();
        let to_put = seen.to_put;
        let mut ops: Vec<(String, Option<String>)> = to_put
            .iter()
            .map(|(pool, address, verdict)| {
                (
                    state.keys.verdict(pool, address, &self.instance),
                    Some(wire::encode(verdict)),
                )
            })
            .collect();
        ops.extend(
            gone.iter()
                .map(|slot| (state.keys.verdict(&slot.0, &slot.1, &self.instance), None)),
        );
        if ops.is_empty() {
            return Ok(());
        }
        self.write(state, &ops, lease).await?;
        self.fleet
            .counters
            .published
            .fetch_add(to_put.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for (pool, address, verdict) in to_put {
            state.put.insert((pool, address), verdict.state);
        }
        for slot in gone {
            state.put.remove(&slot);
        }
        Ok(())
    }
}

/// Revokes a lease this instance held (best effort, within its timeout): its registration and
/// verdicts go at once, so the group re-owns its backends now rather than one lease later.
pub(crate) async fn revoke(held: &HeldLease) {
    let body = format!(r#"{{"ID": "{}"}}"#, held.lease);
    match call(&held.endpoint, "/v3/lease/revoke", body, held.timeout).await {
        Ok(_) => tracing::debug!(lease = held.lease, "fleet lease revoked"),
        Err(error) => tracing::debug!(lease = held.lease, %error, "fleet lease not revoked"),
    }
}

/// One keepalive of `lease`: an error when etcd no longer has it.
async fn keepalive(endpoint: &EtcdEndpoint, timeout: Duration, lease: i64) -> Result<(), Failed> {
    #[derive(Deserialize)]
    struct Kept {
        result: Option<KeptResult>,
    }
    #[derive(Deserialize)]
    struct KeptResult {
        #[serde(rename = "TTL", default)]
        ttl: Option<String>,
    }
    let answer = call(
        endpoint,
        "/v3/lease/keepalive",
        format!(r#"{{"ID": "{lease}"}}"#),
        timeout,
    )
    .await?;
    let kept: Kept = serde_json::from_slice(&answer)
        .map_err(|e| format!("etcd's keepalive answer is not readable: {e}"))?;
    match kept
        .result
        .and_then(|r| r.ttl)
        .and_then(|t| t.parse::<i64>().ok())
    {
        Some(ttl) if ttl > 0 => Ok(()),
        _ => Err("the lease expired".into()),
    }
}

/// The keepalives of one session, on their own task.
struct KeepAlive {
    endpoint: EtcdEndpoint,
    timeout: Duration,
    every: Duration,
    lease: i64,
    /// When etcd last confirmed the lease.
    alive: Arc<std::sync::Mutex<Instant>>,
}

impl KeepAlive {
    /// Keeps the lease alive every `every` until a keepalive fails; returns why.
    async fn run(self) -> Failed {
        loop {
            tokio::time::sleep(self.every).await;
            if let Err(error) = keepalive(&self.endpoint, self.timeout, self.lease).await {
                return error;
            }
            *self.alive.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}

/// Gives `pool` (and its later builds) the fleet's ownership, if it has none yet.
pub(crate) fn attach(slot: &ProbingSlot, fleet: &Arc<FleetRt>) {
    if slot.get().is_none() {
        let _ = slot.set(fleet.clone());
    }
}
