//! Following a pool's backend source: one task per pool with a `dns` or `etcd` source
//! turns the source's answers, through the pool's [`Guard`], into membership updates, and
//! each update builds that one pool anew from the build in force ([`PoolRt::with_members`]:
//! kept backends are the same runtime and carry their health, added ones are gated until
//! `rise` probes, removed ones drain), applied by the supervisor as a command (so between
//! reloads and overrides, never during one), on the blocking pool. The kept backends' tasks go
//! on ([`PoolTasks::carry`]), so an update costs in
//! proportion to the change, not to the pool.
//!
//! Invariant: at most one update waits. While one is applied, the task keeps reading the
//! source and merges what it reads ([`Pending`]): a later membership replaces an earlier one
//! (each is whole), so a burst of changes is applied as one update, still through the guard.
//!
//! [`PoolTasks::carry`]: crate::health::PoolTasks::carry

use std::collections::HashSet;
use std::sync::{Arc, Weak};

use super::listener::handles;
use super::ordered::Ordered;
use super::task::Owned;
use super::Supervisor;
use crate::config::{BackendConfig, PoolConfig, PoolSource};
use crate::discovery::{Answer, Guard, Source};
use crate::events::{MembershipChange, Notice};
use crate::health::PoolRt;

impl Owned {
    /// Stops the running membership tasks and starts one per pool of `pools` whose source is
    /// not static. A pool that already had members (a reload) starts its guard from them.
    pub(super) fn restart_membership(
        &mut self,
        supervisor: &Arc<Supervisor>,
        pools: &[Arc<PoolRt>],
        had_members: &HashSet<&str>,
    ) {
        let mut tasks = Vec::new();
        for pool in pools {
            if !pool.config.source.is_dynamic() {
                continue;
            }
            let initial = had_members
                .contains(&*pool.name)
                .then(|| pool.config.backends.clone());
            tasks.push(tokio::spawn(follow(
                Arc::downgrade(supervisor),
                pool.config.clone(),
                initial,
            )));
        }
        for task in std::mem::replace(&mut self.membership_tasks, tasks) {
            task.abort();
        }
    }

    /// Puts `members` in force in pool `name`, as a reload would, and tells the `updated`
    /// event; `(added, removed, total)`, or `None` when the pool is gone, follows another
    /// source now, or the balancer is shutting down. The supervisor's
    /// [`Command::SetMembers`](super::task::Command::SetMembers), on the blocking pool.
    pub(super) fn replace_members(
        &mut self,
        supervisor: &Supervisor,
        name: &str,
        source: &PoolSource,
        members: Vec<BackendConfig>,
    ) -> Option<(usize, usize, usize)> {
        if *supervisor.shutdown.borrow() {
            return None;
        }
        let pools = supervisor.pools();
        let index = pools.iter().position(|p| &*p.name == name)?;
        let old = &pools[index];
        if old.config.source != *source {
            return None;
        }
        let before: HashSet<(&str, &str)> = old
            .backends
            .iter()
            .map(|b| (&*b.name, b.address.as_str()))
            .collect();
        let kept = members
            .iter()
            .filter(|m| before.contains(&(m.name.as_str(), m.address.as_str())))
            .count();
        let counts = (
            members.len() - kept,
            old.backends.len().saturating_sub(kept),
            members.len(),
        );
        let pool = old.with_members(
            members,
            old.config.gate_new_backends,
            supervisor.metrics.families(),
        );
        let mut next = (*pools).clone();
        next[index] = pool.clone();
        {
            // The backends that stay keep their tasks (no restart, no new phase); only the
            // added ones get new ones, the removed ones' stop.
            let running = &mut self.pool_tasks;
            let at = running.iter().position(|(p, _)| &**p == name);
            let old_tasks = at
                .map(|i| std::mem::take(&mut running[i].1))
                .unwrap_or_default();
            // Among the pools in force, so a backend of this pool tracking another finds it.
            let tasks = old_tasks.carry(&pool, &next);
            match at {
                Some(i) => running[i].1 = tasks,
                None => running.push((pool.name.clone(), tasks)),
            }
        }
        let next = Arc::new(next);
        supervisor.publish(|s| s.pools = next.clone());
        // The listeners' routes hold the pools' handles: give them the new one.
        let config = supervisor.config();
        let pool_handles = handles(&next);
        let kept = super::listener::kept(&self.listeners, &config);
        for (new, running) in config.listeners.iter().zip(kept) {
            if let Some(listener) = running.map(|i| &self.listeners[i]) {
                // Same settings, same log: a membership update reopens nothing.
                let previous = listener.state.load_full();
                let log = previous.proxy.access_log();
                listener.state.store(supervisor.listener_state(
                    new,
                    &pool_handles,
                    log,
                    Some(&previous),
                ));
            }
        }
        // Told once the listeners route to the new pool (so that a client acting on the event
        // reaches the new backends), and before anything else can happen to them (their first
        // probes are an interval away), so the update comes before their transitions.
        let (added, removed, total) = counts;
        if added + removed > 0 {
            supervisor.tell(
                name,
                source.kind(),
                MembershipChange::Updated {
                    added,
                    removed,
                    total,
                },
            );
        }
        Some(counts)
    }
}

impl Supervisor {
    /// Asks the supervisor to put `members` in force in pool `name` (see
    /// [`Owned::replace_members`]); `None` as it says, or when the supervisor has stopped.
    async fn set_members(
        &self,
        name: &str,
        source: &PoolSource,
        members: Vec<BackendConfig>,
    ) -> Option<(usize, usize, usize)> {
        self.ask_in_order(|reply| Ordered::SetMembers {
            pool: name.to_owned(),
            source: source.clone(),
            members,
            reply,
        })
        .await
        .ok()
        .flatten()
    }

    /// Tells `change` about pool `name`, from the pool in force.
    fn tell(&self, name: &str, source: &'static str, change: MembershipChange) {
        if let Some(pool) = self.pool(name) {
            pool.emit(Notice::Membership {
                pool: pool.name.clone(),
                source,
                change,
                time: self.clock.wall(self.clock.now()),
            });
        }
    }
}

/// Follows the source of pool `config` until aborted (a reload, a shutdown) or the balancer
/// is gone.
async fn follow(me: Weak<Supervisor>, config: PoolConfig, initial: Option<Vec<BackendConfig>>) {
    let name = config.name.clone();
    let (max_drop_percent, retry) = match &config.source {
        PoolSource::Static => return,
        PoolSource::Dns(dns) => (dns.max_drop_percent, dns.ttl_min),
        PoolSource::Etcd(etcd) => (etcd.max_drop_percent, etcd.reconnect_min),
    };
    let mut guard = Guard::new(initial, max_drop_percent);
    // Building the source may read /etc/resolv.conf: off the runtime threads.
    let mut source = loop {
        let source_config = config.source.clone();
        let started = tokio::task::spawn_blocking(move || Source::start(&source_config)).await;
        let error = match started {
            Ok(Some(Ok(source))) => break source,
            Ok(None) => return,
            Ok(Some(Err(error))) => error.to_string(),
            Err(_) => "starting the source failed unexpectedly".to_owned(),
        };
        let Some(supervisor) = me.upgrade() else {
            return;
        };
        for change in guard.handle_failure(error.clone()).changes {
            supervisor.tell(&name, config.source.kind(), change);
        }
        note(&supervisor, &name, |m| m.failing = Some(error));
        drop(supervisor);
        tokio::time::sleep(retry).await;
    };
    // After a reload: failing SRV targets stay where they were, and what was told about the
    // targets is not told again.
    if let Some(pool) = me.upgrade().and_then(|supervisor| supervisor.pool(&name)) {
        let unresolved = pool.source_record.state().unresolved;
        source.resume(&pool.config.backends, unresolved);
    }
    let kind = source.kind();
    let mut pending = Pending::default();
    loop {
        if pending.is_empty() {
            let answer = source.next().await;
            let Some(supervisor) = me.upgrade() else {
                return;
            };
            pending.read(&supervisor, &name, kind, answer);
        }
        let Some(supervisor) = me.upgrade() else {
            return;
        };
        if pending.changed {
            // The source said it changed: its membership now, built once for this update.
            pending.resolve(&supervisor, &name, kind, source.members());
        }
        // What came since the last update, in order: the guard judges each failure, and the
        // latest membership as a whole (a drop is measured against the membership in force).
        let mut apply = None;
        for answer in pending.take() {
            let verdict = match answer {
                Read::Members(members) => guard.handle_members(members),
                Read::Failed(error) => guard.handle_failure(error),
            };
            let held = verdict.changes.iter().find_map(|c| match c {
                MembershipChange::DropHeld { from, to } => Some((*from, *to)),
                _ => None,
            });
            for change in verdict.changes {
                supervisor.tell(&name, kind, change);
            }
            // Noted before the update is applied, so the record agrees with its `updated`
            // event.
            let holding = guard.holding();
            if holding {
                source.confirm_later();
            }
            note(&supervisor, &name, |m| {
                m.held = if holding { held.or(m.held) } else { None };
            });
            if let Some(members) = verdict.apply {
                apply = Some(members);
            }
        }
        let Some(members) = apply else { continue };
        // While the update is applied, the source is still read: what arrives meanwhile
        // waits, merged, for the next update (one at most, however long this one takes).
        let update = supervisor.set_members(&name, &config.source, members);
        tokio::pin!(update);
        loop {
            tokio::select! {
                biased;
                _ = &mut update => break,
                answer = source.next() => pending.read(&supervisor, &name, kind, answer),
            }
        }
    }
}

/// An answer the guard is to judge.
#[derive(Debug, PartialEq)]
enum Read {
    Members(Vec<BackendConfig>),
    Failed(String),
}

/// The answers read since the guard last judged, merged so that one update at most waits:
/// a failure (the first of its run) before the latest membership, that membership, and a
/// failure after it. A later membership replaces an earlier one (both are whole), so the
/// guard sees one membership per update, and each failure's run is still told, then its
/// recovery.
/// `changed` stands for a membership the source has yet to build ([`Source::members`]): the
/// latest, like `members`.
#[derive(Debug, Default)]
struct Pending {
    failed_before: Option<String>,
    members: Option<Vec<BackendConfig>>,
    changed: bool,
    failed_after: Option<String>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.failed_before.is_none()
            && self.members.is_none()
            && !self.changed
            && self.failed_after.is_none()
    }

    /// Takes in one answer of the source: what it says about the source (when it last
    /// answered, whether it fails, which SRV targets have no address) is noted at once, a
    /// skipped key or a target's change told at once.
    fn read(&mut self, supervisor: &Supervisor, name: &str, kind: &'static str, answer: Answer) {
        match answer {
            Answer::Members(members) => {
                let now = supervisor.clock.now();
                let wall = supervisor.clock.wall(now);
                note(supervisor, name, |m| {
                    m.confirmed = Some(now);
                    m.confirmed_wall = Some(wall);
                    m.failing = None;
                });
                if let Some(error) = self.failed_after.take() {
                    self.failed_before.get_or_insert(error);
                }
                self.members = Some(members);
                self.changed = false;
            }
            Answer::Changed => {
                let now = supervisor.clock.now();
                let wall = supervisor.clock.wall(now);
                note(supervisor, name, |m| {
                    m.confirmed = Some(now);
                    m.confirmed_wall = Some(wall);
                    m.failing = None;
                });
                if let Some(error) = self.failed_after.take() {
                    self.failed_before.get_or_insert(error);
                }
                self.members = None;
                self.changed = true;
            }
            Answer::Failed(error) => {
                tracing::debug!(pool = %name, %error, "the backend source failed");
                note(supervisor, name, |m| m.failing = Some(error.clone()));
                let slot = if self.members.is_some() || self.changed {
                    &mut self.failed_after
                } else {
                    &mut self.failed_before
                };
                slot.get_or_insert(error);
            }
            Answer::Skipped { key, error } => {
                supervisor.tell(name, kind, MembershipChange::Skipped { key, error });
            }
            Answer::Targets {
                unresolved,
                changes,
            } => {
                note(supervisor, name, |m| m.unresolved = unresolved);
                for change in changes {
                    supervisor.tell(name, kind, change);
                }
            }
        }
    }

    /// Puts the membership the source built (`answers`, from [`Source::members`]) in the place
    /// of `changed`, telling the skipped keys; the record and the failures stay as read.
    fn resolve(
        &mut self,
        supervisor: &Supervisor,
        name: &str,
        kind: &'static str,
        answers: Vec<Answer>,
    ) {
        for answer in answers {
            match answer {
                Answer::Members(members) => {
                    self.members = Some(members);
                    self.changed = false;
                }
                Answer::Skipped { key, error } => {
                    supervisor.tell(name, kind, MembershipChange::Skipped { key, error });
                }
                Answer::Changed | Answer::Failed(_) | Answer::Targets { .. } => {}
            }
        }
    }

    /// The merged answers, in order; empties it.
    fn take(&mut self) -> Vec<Read> {
        // Resolved before (a source that says `Changed` builds its members when asked).
        self.changed = false;
        let before = self.failed_before.take().map(Read::Failed);
        let members = self.members.take().map(Read::Members);
        let after = self.failed_after.take().map(Read::Failed);
        before.into_iter().chain(members).chain(after).collect()
    }
}

/// Changes the membership record of pool `name` (shared by its every build).
fn note(supervisor: &Supervisor, name: &str, change: impl FnOnce(&mut crate::health::SourceState)) {
    if let Some(pool) = supervisor.pool(name) {
        pool.source_record.update(change);
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::broadcast;

    use super::*;
    use crate::config::Config;

    fn config() -> Config {
        crate::config::parse_str(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [\
             { name = \"a\", address = \"127.0.0.1:9\" }, { name = \"b\", address = \"127.0.0.1:9\" }]\n\
             [pools.web.active]\nkind = \"none\"\n",
            "<test>",
        )
        .expect("valid test config")
    }

    /// What the guard gets from `answers` read in a row (`None` for a `Changed` resolved to
    /// `built`).
    fn merged(
        supervisor: &Supervisor,
        answers: Vec<Answer>,
        built: Option<Vec<Answer>>,
    ) -> Vec<Read> {
        let mut pending = Pending::default();
        for answer in answers {
            pending.read(supervisor, "web", "etcd", answer);
        }
        if let Some(built) = built {
            assert!(pending.changed);
            pending.resolve(supervisor, "web", "etcd", built);
        }
        let taken = pending.take();
        assert!(pending.is_empty());
        taken
    }

    /// Answers read while an update waits are bounded: the latest membership, with the first
    /// failure before it and the first after it; a `Changed` is the source's membership then.
    #[tokio::test]
    async fn pending_keeps_the_latest_membership_and_the_failures_around_it() {
        let config = config();
        let (events, _rx) = broadcast::channel(16);
        let supervisor = Supervisor::start(&config, events, None, Vec::new());
        let all = config.pools[0].backends.clone();
        let one = vec![all[0].clone()];
        let m = |v: &Vec<BackendConfig>| Answer::Members(v.clone());
        let f = |e: &str| Answer::Failed(e.to_owned());
        assert_eq!(
            merged(&supervisor, vec![m(&all), m(&one), m(&all)], None),
            vec![Read::Members(all.clone())]
        );
        assert_eq!(
            merged(
                &supervisor,
                vec![f("1"), f("2"), m(&one), f("3"), f("4")],
                None
            ),
            vec![
                Read::Failed("1".into()),
                Read::Members(one.clone()),
                Read::Failed("3".into())
            ]
        );
        // A failure between two memberships: said, then the recovery, with the later one.
        assert_eq!(
            merged(&supervisor, vec![m(&all), f("1"), m(&one)], None),
            vec![Read::Failed("1".into()), Read::Members(one.clone())]
        );
        // `Changed` after a membership: the source's membership when judged wins.
        assert_eq!(
            merged(
                &supervisor,
                vec![m(&all), Answer::Changed, f("1")],
                Some(vec![m(&one)])
            ),
            vec![Read::Members(one.clone()), Read::Failed("1".into())]
        );
        // A membership after `Changed`: it is the latest, nothing to build.
        assert_eq!(
            merged(&supervisor, vec![Answer::Changed, m(&all)], None),
            vec![Read::Members(all.clone())]
        );
        supervisor.abort();
    }
}
