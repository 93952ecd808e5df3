//! A route's local rate limit ([`RateLimiter`]): a token bucket per key, in memory bounded
//! against hostile keys.
//!
//! Each bucket is kept as one number, the time it will be full again (GCRA, the "generic cell
//! rate algorithm" that is a token bucket written as a time): a request at `now` takes a
//! token if `max(full_at, now) + interval - now <= burst * interval`, and moves `full_at`
//! on by one interval. A bucket whose `full_at` is past is full: forgetting it changes
//! nothing. Refused requests change nothing either.
//!
//! Keys are never stored: each is hashed with a per-limiter random key (SipHash, as std's
//! `HashMap` does against flooding), so a long header value costs its hashing only, and two
//! keys collide with odds of 2^-64 an attacker cannot steer. The table is split in shards,
//! each behind its own mutex held only for a lookup and an update (no await, no allocation
//! once a shard has grown). A shard holds at most its share of `max_keys`; when a new key
//! finds it full, the idlest of a few sampled buckets (the one full soonest, so a full one
//! first) is forgotten: memory never grows past the bound, whatever keys arrive. A forgotten
//! key that comes back starts with a full bucket, as in nginx's `limit_req` zone.
//!
//! The clock is the caller's: [`RateLimiter::check`] takes `now`, so tests run on made-up
//! time.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use capataz_config::RateLimitConfig;

/// The most shards a limiter splits its table into.
const SHARDS: usize = 16;

/// How many buckets are sampled to find the idlest when a shard is full.
const SAMPLES: usize = 8;

/// A route's token buckets.
#[derive(Debug)]
pub struct RateLimiter {
    /// Time for one token to come back, in nanoseconds (at least 1).
    interval: u64,
    /// How far ahead of now a bucket's `full_at` may be: `burst * interval`.
    tolerance: u64,
    epoch: Instant,
    keys: std::hash::RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// The most buckets one shard holds.
    shard_capacity: usize,
}

/// One shard: its buckets as `(key hash, full_at)`, and where each key's is.
#[derive(Debug, Default)]
struct Shard {
    buckets: Vec<(u64, u64)>,
    index: HashMap<u64, usize, BuildHasherDefault<Prehashed>>,
}

/// What a check decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A token was taken: the request goes on.
    Allowed,
    /// No token: the next one comes after this long.
    Limited(Duration),
}

impl RateLimiter {
    /// A limiter as `config` says, its clock starting at `epoch`.
    pub fn new(config: &RateLimitConfig, epoch: Instant) -> RateLimiter {
        let interval = u64::try_from(config.interval().as_nanos()).unwrap_or(u64::MAX);
        let shards = SHARDS.min(config.max_keys.max(1));
        RateLimiter {
            interval,
            tolerance: interval.saturating_mul(u64::from(config.burst.max(1))),
            epoch,
            keys: std::hash::RandomState::new(),
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            shard_capacity: (config.max_keys / shards).max(1),
        }
    }

    /// Takes a token from the bucket of `key` (hashed, never kept) at `now`.
    pub fn check(&self, key: impl Hash, now: Instant) -> Verdict {
        let hash = self.keys.hash_one(key);
        let now =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        let shard = &self.shards[(hash % self.shards.len() as u64) as usize];
        let mut shard = crate::lockstat::lock(shard, crate::lockstat::Site::RateLimit);
        let at = shard.index.get(&hash).copied();
        let full_at = at.map_or(0, |i| shard.buckets[i].1);
        let next = full_at.max(now).saturating_add(self.interval);
        let ahead = next - now;
        if ahead > self.tolerance {
            return Verdict::Limited(Duration::from_nanos(ahead - self.tolerance));
        }
        match at {
            Some(i) => shard.buckets[i].1 = next,
            None => {
                if shard.buckets.len() >= self.shard_capacity {
                    shard.forget_idlest();
                }
                let i = shard.buckets.len();
                shard.buckets.push((hash, next));
                shard.index.insert(hash, i);
            }
        }
        Verdict::Allowed
    }

    /// The keys remembered now.
    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .buckets
                    .len()
            })
            .sum()
    }
}

impl Shard {
    /// Forgets the bucket that is full soonest among a few sampled (a full one changes
    /// nothing when forgotten).
    fn forget_idlest(&mut self) {
        let len = self.buckets.len();
        if len == 0 {
            return;
        }
        let victim = (0..SAMPLES.min(len))
            .map(|_| fastrand::usize(..len))
            .min_by_key(|&i| self.buckets[i].1)
            .unwrap_or(0);
        let (hash, _) = self.buckets.swap_remove(victim);
        self.index.remove(&hash);
        if let Some(&(moved, _)) = self.buckets.get(victim) {
            self.index.insert(moved, victim);
        }
    }
}

/// The hasher of a shard's index, whose keys are already SipHash outputs: it passes them
/// through.
#[derive(Debug, Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in rather than panic.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use capataz_config::RateLimitKey;

    use super::*;

    fn make(rate: u32, per: Duration, burst: u32, max_keys: usize) -> (RateLimiter, Instant) {
        let epoch = Instant::now();
        let config = RateLimitConfig {
            key: RateLimitKey::ClientIp,
            rate,
            per,
            burst,
            max_keys,
        };
        (RateLimiter::new(&config, epoch), epoch)
    }

    fn allowed(limiter: &RateLimiter, key: &[u8], at: Instant, n: usize) -> usize {
        (0..n)
            .filter(|_| limiter.check(key, at) == Verdict::Allowed)
            .count()
    }

    #[test]
    fn a_burst_then_one_token_per_interval() {
        // 10 per second, burst 5: 5 at once, then one every 100 ms.
        let (limiter, t0) = make(10, Duration::from_secs(1), 5, 100);
        assert_eq!(allowed(&limiter, b"a", t0, 20), 5);
        match limiter.check(b"a", t0) {
            Verdict::Limited(wait) => assert_eq!(wait, Duration::from_millis(100)),
            other => panic!("{other:?}"),
        }
        let later = t0 + Duration::from_millis(99);
        assert!(
            matches!(limiter.check(b"a", later), Verdict::Limited(w) if w == Duration::from_millis(1))
        );
        assert_eq!(
            allowed(&limiter, b"a", t0 + Duration::from_millis(100), 5),
            1
        );
        // After a quiet second the bucket is full again: 5 more, no more.
        assert_eq!(allowed(&limiter, b"a", t0 + Duration::from_secs(2), 20), 5);
        // Another key has its own bucket.
        assert_eq!(allowed(&limiter, b"b", t0, 20), 5);
    }

    #[test]
    fn a_steady_client_at_the_rate_is_never_limited() {
        let (limiter, t0) = make(100, Duration::from_secs(1), 1, 10);
        for i in 0..1000 {
            let at = t0 + Duration::from_millis(10 * i);
            assert_eq!(
                limiter.check(b"steady", at),
                Verdict::Allowed,
                "request {i}"
            );
        }
        // Twice the rate: every other request is refused.
        let start = t0 + Duration::from_secs(20);
        let ok = (0..1000)
            .filter(|&i| {
                limiter.check(b"steady", start + Duration::from_millis(5 * i)) == Verdict::Allowed
            })
            .count();
        assert!((499..=501).contains(&ok), "{ok}");
    }

    #[test]
    fn the_table_never_grows_past_max_keys_and_forgets_idle_keys_first() {
        let (limiter, t0) = make(1, Duration::from_secs(60), 1, 1000);
        // A hostile flood of distinct keys, long ones among them.
        for i in 0..100_000u32 {
            let key = format!("{i}-{}", "x".repeat((i % 7) as usize * 1000));
            limiter.check(key.as_bytes(), t0 + Duration::from_micros(u64::from(i)));
            if i % 10_000 == 0 {
                assert!(limiter.keys() <= 1000, "{}", limiter.keys());
            }
        }
        assert!(limiter.keys() <= 1000, "{}", limiter.keys());
        // A key whose bucket is empty is kept over keys idle since: 8 buckets per shard, and
        // the one forgotten is the one full soonest among those sampled.
        let (limiter, t0) = make(1, Duration::from_secs(3600), 1, 128);
        let busy = t0 + Duration::from_secs(1);
        assert_eq!(limiter.check(b"busy", busy), Verdict::Allowed);
        for i in 0..1000u32 {
            limiter.check(i.to_be_bytes(), t0);
        }
        assert!(limiter.keys() <= 128);
        assert!(matches!(limiter.check(b"busy", busy), Verdict::Limited(_)));
    }

    #[test]
    fn a_refused_request_takes_nothing() {
        let (limiter, t0) = make(1, Duration::from_secs(1), 1, 10);
        assert_eq!(limiter.check(b"k", t0), Verdict::Allowed);
        for _ in 0..100 {
            assert!(matches!(limiter.check(b"k", t0), Verdict::Limited(_)));
        }
        assert_eq!(
            limiter.check(b"k", t0 + Duration::from_secs(1)),
            Verdict::Allowed
        );
    }

    #[test]
    fn huge_periods_and_rates_do_not_overflow() {
        let (limiter, t0) = make(1, Duration::from_secs(365 * 86_400), 1_000_000, 1);
        assert_eq!(limiter.check(b"k", t0), Verdict::Allowed);
        let (limiter, t0) = make(1_000_000, Duration::from_millis(1), 1_000_000, 1);
        assert_eq!(allowed(&limiter, b"k", t0, 100), 100);
        let far = t0 + Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(limiter.check(b"k", far), Verdict::Allowed);
    }
}
