//! Consistent hashing with bounded loads: a Ketama-style ring of points, each owned by an
//! eligible backend, built with the snapshot (never per request), and the walk that picks a
//! key's backend.
//!
//! Each backend owns points in proportion to its weight in the snapshot:
//! [`POINTS_PER_TENTH`] per tenth of weight (160 for a weight-1 backend at full weight). Point
//! `j` of a backend is [`stable_hash`] of its name and `j`, so a backend's points are the
//! first `n` of one fixed sequence: while its weight ramps up (slow start) it gains points
//! one step at a time and takes back its keys gradually; when it leaves, only the keys on its
//! points move, each to the next point clockwise. Nothing depends on the process: the same
//! names and weights give the same ring in every instance and after every restart.
//!
//! Why a ring and not Maglev: a ring's points follow a ramping weight exactly (Maglev's table
//! permutes every backend's preferences and reshuffles some keys among the backends that
//! stay), and the bounded-load walk (HAProxy's `hash-balance-factor`) is a walk clockwise,
//! which a ring gives for free.
//!
//! Cost: building hashes every point and sorts them, O(P log P) for P points; P is capped at
//! [`MAX_POINTS`] (weights are scaled down beyond it, each backend keeping at least one
//! point), so 10,000 backends cost at most 2^20 hashes and one sort of 2^20 `u64`s (12 MiB).
//! A lookup is one binary search, then a walk past excluded or overloaded backends.

/// Ring points per tenth of weight (a weight-1 backend at full weight: 160, Ketama's count).
pub const POINTS_PER_TENTH: u64 = 16;

/// The most points a ring holds; larger weight sums are scaled down.
pub const MAX_POINTS: u64 = 1 << 20;

/// A hash ring over a snapshot's eligible backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    /// The points' positions, ascending.
    points: Vec<u64>,
    /// The backend (index into the pool) owning each point.
    owners: Vec<u32>,
}

impl Ring {
    /// The ring of the `eligible` backends (indexes into the pool), each with `weight(i)`
    /// tenths (at least one point each), named `name(i)`.
    pub fn build<'a>(
        eligible: &[usize],
        weight: impl Fn(usize) -> u32,
        name: impl Fn(usize) -> &'a str,
    ) -> Ring {
        let wanted: u64 = eligible
            .iter()
            .map(|&i| u64::from(weight(i).max(1)) * POINTS_PER_TENTH)
            .sum();
        let count = |i: usize| {
            let n = u64::from(weight(i).max(1)) * POINTS_PER_TENTH;
            if wanted > MAX_POINTS {
                (n * MAX_POINTS / wanted).max(1)
            } else {
                n
            }
        };
        let capacity = wanted.min(MAX_POINTS + eligible.len() as u64) as usize;
        let mut pairs: Vec<(u64, u32)> = Vec::with_capacity(capacity);
        for &i in eligible {
            let prefix = point_prefix(name(i).as_bytes());
            for j in 0..count(i) {
                pairs.push((point_at(prefix, j), i as u32));
            }
        }
        // Ties (a collision of two positions) are broken by the owner's index: the same for
        // everyone.
        pairs.sort_unstable();
        let (points, owners) = pairs.into_iter().unzip();
        Ring { points, owners }
    }

    /// How many points the ring holds.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether the ring has no point (no backend is eligible).
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The backend for a key hashing to `key`: the owner of the first point at or after it
    /// (clockwise, wrapping), walking on past backends in `exclude` (tried already) and past
    /// those `overloaded` says are over their bound. If every backend left is overloaded, the
    /// first one not excluded; `None` only when every backend is excluded. The walk visits
    /// each point at most once.
    pub fn pick(
        &self,
        key: u64,
        exclude: &[usize],
        overloaded: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let len = self.points.len();
        if len == 0 {
            return None;
        }
        let start = self.points.partition_point(|&p| p < key) % len;
        let mut fallback = None;
        for step in 0..len {
            let owner = self.owners[(start + step) % len] as usize;
            if exclude.contains(&owner) {
                continue;
            }
            if fallback == Some(owner) {
                continue;
            }
            if !overloaded(owner) {
                return Some(owner);
            }
            fallback.get_or_insert(owner);
        }
        fallback
    }
}

/// HAProxy's bounded-load rule (`hash-balance-factor`): with `total` requests outstanding on
/// the eligible backends and `factor` percent (> 100), a backend of `weight` out of
/// `total_weight` may hold `ceil(ceil((total + 1) x factor / 100) x weight / total_weight)`
/// requests, at least 1; it is overloaded when it holds that many already. The slots sum to
/// more than the requests outstanding, so some backend is always under its bound.
pub fn overloaded(in_flight: u64, weight: u64, total: u64, total_weight: u64, factor: u32) -> bool {
    let slots_total = ((total + 1) * u64::from(factor)).div_ceil(100);
    let slots = (slots_total * weight).div_ceil(total_weight.max(1)).max(1);
    in_flight >= slots
}

/// The ring key of a client at `ip` (`hash_key = "client_ip"`, and a tcp pool's sessions): the
/// hash of its address's octets, an IPv4-mapped IPv6 address taken as its IPv4 address (a
/// dual-stack listener sees IPv4 clients so), so every instance hashes a client alike.
pub fn client_key(ip: std::net::IpAddr) -> u64 {
    match ip.to_canonical() {
        std::net::IpAddr::V4(ip) => stable_hash(&ip.octets()),
        std::net::IpAddr::V6(ip) => stable_hash(&ip.octets()),
    }
}

/// A fixed 64-bit hash of `bytes`: FNV-1a, then MurmurHash3's 64-bit finalizer so that
/// nearby inputs land far apart on the ring. Not keyed and not seeded: the same bytes hash
/// the same in every process (it is not meant to resist an attacker choosing keys; a client
/// that picks its own key can only pick its own backend).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    fmix64(fnv1a(FNV_OFFSET, bytes))
}

/// The position of point `j` of the backend named `name`: FNV-1a over the name, a `0xff`
/// separator and `j`'s 8 bytes (little-endian), then the finalizer.
#[cfg(test)]
fn point_hash(name: &[u8], j: u64) -> u64 {
    point_at(point_prefix(name), j)
}

/// The FNV-1a state after a backend's name and the separator, shared by all its points.
fn point_prefix(name: &[u8]) -> u64 {
    fnv1a(fnv1a(FNV_OFFSET, name), &[0xff])
}

/// Point `j`'s position from its backend's [`point_prefix`].
fn point_at(prefix: u64, j: u64) -> u64 {
    fmix64(fnv1a(prefix, &j.to_le_bytes()))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, from state `h`.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// MurmurHash3's `fmix64`.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
