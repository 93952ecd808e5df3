//! Backend sources: where a pool's backends come from when they are not a list in the file.
//!
//! A [`Source`] produces [`Answer`]s (a full membership, or a failure); a [`Guard`] per pool
//! decides what reaches the pool: a failure keeps the last known membership, a drop of more
//! than the configured share is held until the next answer confirms it, and an unchanged
//! answer changes nothing. What the guard lets through is applied by the supervisor the way a
//! reload is (kept backends keep their health; added ones are gated; removed ones drain).
//! `dns` asks again when the answer's TTL runs out; `etcd` ([`EtcdWatch`]) reads a key prefix
//! once and then follows its watch. An SRV target without an address is that target's
//! trouble, not the source's: [`Answer::Targets`] says it beside the membership, which holds
//! the other targets.

mod dns;
pub mod etcd;
mod guard;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use tokio::time::Instant;

use capataz_config::{BackendConfig, PoolSource};
use capataz_events::{MembershipChange, Unresolved};
pub use dns::{DnsResolver, DnsSetupError};
pub use etcd::EtcdWatch;
pub use guard::{Guard, Verdict};

/// The most backends one answer may bring: beyond it the rest are ignored (and said so), so a
/// hostile or broken registry cannot grow a pool without bound.
pub const MAX_MEMBERS: usize = 10_000;

/// What a source said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The whole membership now, sorted by name, names unique.
    Members(Vec<BackendConfig>),
    /// The membership changed (etcd: a watch response); [`Source::members`] says to what.
    /// An etcd source says this rather than the whole membership, so that when changes come
    /// faster than they are applied, the membership is built once per update, not per change.
    Changed,
    /// The source could not say (an error, a timeout, an unreachable server).
    Failed(String),
    /// A key of the source (etcd) whose value is no backend: it counts as absent.
    Skipped {
        /// The key, as text.
        key: String,
        /// What is wrong with its value.
        error: String,
    },
    /// The SRV targets (DNS) of the answer that follows that have no address now, and what
    /// to tell about the targets whose standing changed since the last answer.
    Targets {
        /// The targets without an address, sorted.
        unresolved: Vec<Unresolved>,
        /// `TargetLeftOut`, `TargetFailing` and `TargetRestored` changes.
        changes: Vec<MembershipChange>,
    },
}

/// A running backend source.
#[derive(Debug)]
pub enum Source {
    /// A DNS name re-resolved on its TTL.
    Dns {
        /// The resolver for the name.
        resolver: Box<DnsResolver>,
        /// When to ask next (`None`: at once, before the first query). A deadline, not a
        /// delay, so that [`Source::next`] is cancel-safe: called again, it waits for the
        /// same time.
        due: Option<Instant>,
        /// The rest of the last query's answers, told before the next query.
        queued: VecDeque<Answer>,
    },
    /// A key prefix in etcd, read then watched.
    Etcd(Box<EtcdWatch>),
}

impl Source {
    /// The running source for `config` (`None` for a static pool). Reads /etc/resolv.conf
    /// when a DNS source names no resolver: call it off the runtime threads.
    pub fn start(config: &PoolSource) -> Option<Result<Source, DnsSetupError>> {
        match config {
            PoolSource::Static => None,
            PoolSource::Dns(dns) => Some(DnsResolver::new(dns).map(|resolver| Source::Dns {
                resolver: Box::new(resolver),
                due: None,
                queued: VecDeque::new(),
            })),
            PoolSource::Etcd(etcd) => Some(Ok(Source::Etcd(Box::new(EtcdWatch::new(etcd))))),
        }
    }

    /// The source's kind, as in `source.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Dns { .. } => "dns",
            Source::Etcd(_) => "etcd",
        }
    }

    /// Picks up where the pool's previous source left off (a reload): the `members` in force
    /// and the SRV targets told `unresolved` (DNS; etcd starts afresh from its prefix).
    pub fn resume(&mut self, members: &[BackendConfig], unresolved: Vec<Unresolved>) {
        if let Source::Dns { resolver, .. } = self {
            resolver.resume(members, unresolved);
        }
    }

    /// A drop is held: for etcd, read the keys again after `confirm_after` unless a change
    /// comes first (DNS asks again on its TTL anyway).
    pub fn confirm_later(&mut self) {
        if let Source::Etcd(etcd) = self {
            etcd.confirm_later();
        }
    }

    /// The membership now, after a [`Answer::Changed`]: the keys skipped since last told
    /// ([`Answer::Skipped`]), then [`Answer::Members`]. A DNS source never says `Changed`
    /// (each of its answers is whole), and answers nothing here.
    pub fn members(&mut self) -> Vec<Answer> {
        match self {
            Source::Dns { .. } => Vec::new(),
            Source::Etcd(etcd) => etcd.members(),
        }
    }

    /// The next answer: for DNS, the rest of the last query's answers, else waits out the
    /// last answer's TTL (within the floor and the ceiling; the floor after a failure), then
    /// asks again; for etcd, the next change of the
    /// keys, a keepalive's confirmation, or a failure. Cancel-safe: an answer is never lost
    /// by dropping the future (a DNS query or an etcd read under way is asked again).
    pub async fn next(&mut self) -> Answer {
        match self {
            Source::Dns {
                resolver,
                due,
                queued,
            } => loop {
                if let Some(answer) = queued.pop_front() {
                    return answer;
                }
                if let Some(due) = *due {
                    tokio::time::sleep_until(due).await;
                }
                let (answers, ttl) = resolver.query().await;
                *due = Some(Instant::now() + resolver.wait_for(ttl));
                queued.extend(answers);
            },
            Source::Etcd(etcd) => etcd.next().await,
        }
    }
}
