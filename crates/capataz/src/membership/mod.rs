//! Backend sources: where a pool's backends come from when they are not a list in the file.
//!
//! A [`Source`] produces [`Answer`]s (a full membership, or a failure); a [`Guard`] per pool
//! decides what reaches the pool: a failure keeps the last known membership, a drop of more
//! than the configured share is held until the next answer confirms it, and an unchanged
//! answer changes nothing. What the guard lets through is applied by `shared` the way a
//! reload is (kept backends keep their health; added ones are gated; removed ones drain).
//! `dns` asks again when the answer's TTL runs out; `etcd` ([`EtcdWatch`]) reads a key prefix
//! once and then follows its watch.

mod dns;
pub(crate) mod etcd;
mod guard;
#[cfg(test)]
mod tests;

use tokio::time::Instant;

use crate::config::{BackendConfig, PoolSource};
pub use dns::DnsResolver;
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
    },
    /// A key prefix in etcd, read then watched.
    Etcd(Box<EtcdWatch>),
}

impl Source {
    /// The running source for `config` (`None` for a static pool). Reads /etc/resolv.conf
    /// when a DNS source names no resolver: call it off the runtime threads.
    pub fn start(config: &PoolSource) -> Option<Result<Source, String>> {
        match config {
            PoolSource::Static => None,
            PoolSource::Dns(dns) => Some(DnsResolver::new(dns).map(|resolver| Source::Dns {
                resolver: Box::new(resolver),
                due: None,
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

    /// The next answer: for DNS, waits out the last answer's TTL (within the floor and the
    /// ceiling; the floor after a failure), then asks again; for etcd, the next change of the
    /// keys, a keepalive's confirmation, or a failure. Cancel-safe: an answer is never lost
    /// by dropping the future (a DNS query or an etcd read under way is asked again).
    pub async fn next(&mut self) -> Answer {
        match self {
            Source::Dns { resolver, due } => {
                if let Some(due) = *due {
                    tokio::time::sleep_until(due).await;
                }
                let (answer, ttl) = resolver.query().await;
                *due = Some(Instant::now() + resolver.wait_for(ttl));
                answer
            }
            Source::Etcd(etcd) => etcd.next().await,
        }
    }
}
