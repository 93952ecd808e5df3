//! The `etcd` source: the keys under a prefix, each value a backend, read through etcd's v3
//! JSON gateway (`/v3/kv/range`, `/v3/watch`) over plain HTTP/1.1 (no gRPC stack).
//!
//! A full read of the prefix at a revision, then a watch from the next revision on. When the
//! watch fails (the endpoint gone, a stream cut, a silent watch whose keepalive check fails)
//! the source says so and reconnects, to the next endpoint, after a jittered backoff, and the
//! watch resumes from the last revision it saw, so a change made meanwhile still arrives.
//! When the store was compacted past that revision (etcd cancels the watch with
//! `compact_revision`) the source reads the whole prefix again and watches from there: the
//! new membership is the difference, nothing is missed. Answers are bounded: a read and a watch
//! line in bytes, the keys in number ([`MAX_MEMBERS`]), each value in bytes ([`keys::MAX_VALUE`]).

mod error;
pub mod http;
mod keys;
pub mod wire;

pub use error::EtcdError;

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::{Answer, MAX_MEMBERS};
use capataz_config::EtcdSource;
use http::Watch;
use keys::Keys;
use wire::{RangeResponse, WatchLine};

/// One pool's etcd source.
#[derive(Debug)]
pub struct EtcdWatch {
    config: EtcdSource,
    keys: Keys,
    /// The revision the keys are complete up to (`None`: never read).
    revision: Option<i64>,
    /// Read the whole prefix again before the next watch (a compaction, a confirmation).
    relist: bool,
    /// The endpoint in use (an index into `config.endpoints`).
    endpoint: usize,
    /// Failures in a row, for the backoff.
    failures: u32,
    watch: Option<Watch>,
    pending: VecDeque<Answer>,
    /// When to read the prefix again to confirm a held drop.
    confirm_at: Option<Instant>,
    rng: fastrand::Rng,
}

impl EtcdWatch {
    /// The source for `config`; nothing is asked before [`EtcdWatch::next`].
    pub fn new(config: &EtcdSource) -> EtcdWatch {
        EtcdWatch {
            keys: Keys::new(config.prefix.as_bytes()),
            config: config.clone(),
            revision: None,
            relist: false,
            endpoint: 0,
            failures: 0,
            watch: None,
            pending: VecDeque::new(),
            confirm_at: None,
            // Forked from the runtime's one random source (the backoff's jitter).
            rng: fastrand::Rng::with_seed(fastrand::u64(..)),
        }
    }

    /// Reads the prefix again after `confirm_after`, unless a change comes first.
    pub fn confirm_later(&mut self) {
        if self.confirm_at.is_none() {
            self.confirm_at = Some(Instant::now() + self.config.confirm_after);
        }
    }

    /// The next answer: a change of the keys ([`Answer::Changed`] for a watch response, the
    /// whole membership after a read), a skipped key, a confirmation (a keepalive check that
    /// passed, a reconnection), or a failure.
    pub async fn next(&mut self) -> Answer {
        loop {
            if let Some(answer) = self.pending.pop_front() {
                return answer;
            }
            if self.watch.is_none() {
                if self.failures > 0 {
                    tokio::time::sleep(self.backoff()).await;
                }
                if let Err(error) = self.start().await {
                    self.fail();
                    return Answer::Failed(error);
                }
                self.failures = 0;
                self.confirm_at = None;
                self.push_members();
                continue;
            }
            let keepalive = self.config.keepalive;
            let confirm_at = self.confirm_at;
            let Some(watch) = self.watch.as_mut() else {
                continue;
            };
            tokio::select! {
                line = watch.next_line() => {
                    let line = match line {
                        Ok(line) => line,
                        Err(error) => {
                            let error = self.say(&error.to_string());
                            self.fail();
                            return Answer::Failed(error);
                        }
                    };
                    if let Err(error) = self.handle_lines(line) {
                        let error = self.say(&error);
                        self.fail();
                        return Answer::Failed(error);
                    }
                }
                () = tokio::time::sleep(keepalive) => {
                    if let Err(error) = self.check().await {
                        self.fail();
                        return Answer::Failed(error);
                    }
                    self.push_members();
                }
                () = sleep_until(confirm_at), if confirm_at.is_some() => {
                    // A full read again (and a new watch from it): confirms or undoes the drop.
                    self.confirm_at = None;
                    self.relist = true;
                    self.watch = None;
                }
            }
        }
    }

    /// `error` prefixed with the endpoint in use (call it before [`EtcdWatch::fail`] moves on).
    fn say(&self, error: &str) -> String {
        format!("{}: {error}", self.config.endpoints[self.endpoint].url)
    }

    /// A failure: the watch is dropped and the next attempt goes to the next endpoint.
    fn fail(&mut self) {
        self.watch = None;
        self.failures = self.failures.saturating_add(1);
        self.endpoint = (self.endpoint + 1) % self.config.endpoints.len();
    }

    /// `reconnect_min` doubled per failure in a row, at most `reconnect_max`, then a random
    /// share of it between a half and the whole.
    fn backoff(&mut self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(20);
        let full = self
            .config
            .reconnect_min
            .saturating_mul(1 << doublings)
            .min(self.config.reconnect_max);
        let nanos = u64::try_from(full.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(nanos / 2 + self.rng.u64(0..=nanos / 2))
    }

    /// Reads the prefix when needed, then opens the watch from the next revision and waits
    /// for its creation.
    async fn start(&mut self) -> Result<(), String> {
        let endpoint = self.config.endpoints[self.endpoint].clone();
        let prefix = self.config.prefix.clone().into_bytes();
        let prefix = prefix.as_slice();
        let deadline = self.config.timeout;
        let revision = match self.revision {
            Some(revision) if !self.relist => revision,
            _ => {
                let body = http::call(
                    &endpoint,
                    "/v3/kv/range",
                    wire::range_request(prefix, MAX_MEMBERS, false),
                    deadline,
                )
                .await?;
                let range: RangeResponse = serde_json::from_slice(&body)
                    .map_err(|e| format!("{}: a range answer is not JSON ({e})", endpoint.url))?;
                if range.more {
                    tracing::warn!(
                        prefix = %self.config.prefix,
                        kept = MAX_MEMBERS,
                        "the etcd prefix has more keys than a pool takes; the rest are ignored"
                    );
                }
                let mut kvs = Vec::with_capacity(range.kvs.len());
                for kv in range.kvs {
                    let key = wire::decode(&kv.key)
                        .ok_or_else(|| format!("{}: a key is not base64", endpoint.url))?;
                    let value = wire::decode(&kv.value)
                        .ok_or_else(|| format!("{}: a value is not base64", endpoint.url))?;
                    kvs.push((key, value, kv.mod_revision));
                }
                let dropped = self.keys.replace(kvs);
                self.tell(dropped);
                self.revision = Some(range.header.revision);
                self.relist = false;
                range.header.revision
            }
        };
        let request = wire::watch_request(prefix, revision.saturating_add(1));
        let mut watch = Watch::open(&endpoint, request, deadline).await?;
        let first = tokio::time::timeout(deadline, watch.next_line())
            .await
            .map_err(|_| format!("{}: the watch was not created in time", endpoint.url))?
            .map_err(|e| format!("{}: {e}", endpoint.url))?;
        let line: WatchLine = serde_json::from_slice(&first)
            .map_err(|e| format!("{}: a watch answer is not JSON ({e})", endpoint.url))?;
        match line.result {
            Some(result) if result.created && !result.canceled => {}
            _ => {
                return Err(format!(
                    "{}: the watch was refused: {}",
                    endpoint.url,
                    String::from_utf8_lossy(&first)
                        .chars()
                        .take(200)
                        .collect::<String>()
                ))
            }
        }
        self.watch = Some(watch);
        Ok(())
    }

    /// Applies `first` and every other whole line already received, then says the
    /// membership if the keys changed.
    fn handle_lines(&mut self, first: Vec<u8>) -> Result<(), String> {
        let mut changed = self.handle_line(&first)?;
        while let Some(line) = self.watch.as_mut().and_then(Watch::buffered_line) {
            changed |= self.handle_line(&line)?;
        }
        if changed {
            // The members are built when asked for ([`EtcdWatch::members`]): once per
            // update, however many responses came meanwhile.
            self.pending.push_back(Answer::Changed);
        }
        Ok(())
    }

    /// One watch response; whether keys changed.
    fn handle_line(&mut self, line: &[u8]) -> Result<bool, String> {
        let line: WatchLine = serde_json::from_slice(line)
            .map_err(|e| format!("a watch answer is not JSON ({e})"))?;
        if let Some(error) = line.error {
            return Err(format!("the watch failed: {error}"));
        }
        let Some(result) = line.result else {
            return Err("a watch answer has no result".into());
        };
        if result.canceled {
            if result.compact_revision > 0 {
                // Compacted past our revision: read everything again, then watch from there.
                tracing::info!(
                    prefix = %self.config.prefix,
                    compact_revision = result.compact_revision,
                            "the etcd store was compacted past the watch's revision; reading the prefix again"
                );
                self.relist = true;
                self.watch = None;
                return Ok(false);
            }
            return Err(format!(
                "etcd cancelled the watch: {}",
                result.cancel_reason
            ));
        }
        let mut changed = false;
        let mut dropped = Vec::new();
        for event in result.events {
            let key = wire::decode(&event.kv.key).ok_or("a key in a watch answer is not base64")?;
            match event.kind.as_str() {
                "" | "PUT" => {
                    let value = wire::decode(&event.kv.value)
                        .ok_or("a value in a watch answer is not base64")?;
                    dropped.extend(self.keys.put(key, &value, event.kv.mod_revision));
                }
                "DELETE" => self.keys.delete(&key),
                other => return Err(format!("a watch event of unknown type {other:?}")),
            }
            changed = true;
            if let Some(revision) = &mut self.revision {
                *revision = (*revision).max(event.kv.mod_revision);
            }
        }
        self.tell(dropped);
        Ok(changed)
    }

    /// A keepalive check: etcd still answers a count of the prefix within the timeout.
    async fn check(&mut self) -> Result<(), String> {
        let endpoint = &self.config.endpoints[self.endpoint];
        let body = http::call(
            endpoint,
            "/v3/kv/range",
            wire::range_request(self.config.prefix.as_bytes(), 1, true),
            self.config.timeout,
        )
        .await?;
        serde_json::from_slice::<RangeResponse>(&body)
            .map(drop)
            .map_err(|e| format!("{}: a range answer is not JSON ({e})", endpoint.url))
    }

    /// The membership now, after the keys to tell about.
    pub fn members(&mut self) -> Vec<Answer> {
        let (members, skipped) = self.keys.members();
        let mut answers: Vec<Answer> = skipped
            .into_iter()
            .map(|skipped| Answer::Skipped {
                key: skipped.key,
                error: skipped.error,
            })
            .collect();
        answers.push(Answer::Members(members));
        answers
    }

    /// Queues the membership, after the keys to tell about.
    fn push_members(&mut self) {
        let (members, skipped) = self.keys.members();
        self.tell(skipped);
        self.pending.push_back(Answer::Members(members));
    }

    fn tell(&mut self, skipped: Vec<keys::Skipped>) {
        for skipped in skipped {
            self.pending.push_back(Answer::Skipped {
                key: skipped.key,
                error: skipped.error,
            });
        }
    }
}

/// Sleeps until `at` (forever without one; the branch is disabled then).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
