//! The ring's unit tests: the hash's fixed values, and keys moved when a backend leaves,
//! returns and ramps up, measured on 100,000 keys over 10 backends. The figures are printed:
//! `cargo test -p capataz-upstream --lib ring -- --nocapture` (BENCHMARKS.md quotes them).

use super::*;

const KEYS: u64 = 100_000;
const FULL: u32 = 10;

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("app-{i}")).collect()
}

fn ring(names: &[String], eligible: &[usize], weights: &[u32]) -> Ring {
    Ring::build(eligible, |i| weights[i], |i| names[i].as_str())
}

/// Each key's backend (keys are `user-<n>`, as a header or cookie value would be).
fn assign(ring: &Ring) -> Vec<usize> {
    (0..KEYS)
        .map(|k| {
            let key = stable_hash(format!("user-{k}").as_bytes());
            ring.pick(key, &[], |_| false).unwrap()
        })
        .collect()
}

fn moved(before: &[usize], after: &[usize]) -> f64 {
    let n = before.iter().zip(after).filter(|(a, b)| a != b).count();
    n as f64 / before.len() as f64
}

fn share(of: &[usize], backend: usize) -> f64 {
    of.iter().filter(|&&b| b == backend).count() as f64 / of.len() as f64
}

#[test]
fn the_hash_is_fnv1a_then_fmix64_with_fixed_values() {
    // FNV-1a 64 test vectors (Fowler, Noll, Vo).
    assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    // MurmurHash3's finalizer: zero stays zero, and the fixed values below never change (a
    // change would move every key of every deployment on upgrade). They were computed apart,
    // by a few lines of Python doing the same arithmetic.
    assert_eq!(fmix64(0), 0);
    assert_eq!(stable_hash(b""), fmix64(0xcbf2_9ce4_8422_2325));
    assert_eq!(stable_hash(b"user-1"), 0x41a2_fca5_c684_01c5);
    assert_eq!(point_hash(b"app-0", 0), 0xc643_cf62_7d4e_fbc3);
}

#[test]
fn the_same_names_and_weights_make_the_same_ring() {
    let names = names(10);
    let a = ring(&names, &(0..10).collect::<Vec<_>>(), &[FULL; 10]);
    let b = ring(&names, &(0..10).collect::<Vec<_>>(), &[FULL; 10]);
    assert_eq!(a, b);
    assert_eq!(a.len(), 10 * 160);
}

/// Keys moved when one of 10 backends leaves, returns, and ramps back up by slow start's
/// steps: only the leaving backend's keys move, about 1/N of them; on return exactly those
/// come back; during the ramp, its share follows its weight.
#[test]
fn only_a_leaving_backends_keys_move_and_they_come_back() {
    let names = names(10);
    let all: Vec<usize> = (0..10).collect();
    let before = assign(&ring(&names, &all, &[FULL; 10]));
    let shares: Vec<f64> = (0..10).map(|b| share(&before, b)).collect();
    let (min, max) = shares
        .iter()
        .fold((1.0f64, 0.0f64), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    println!("shares over 10 backends (160 points each): min {min:.4}, max {max:.4}, ideal 0.1000");
    assert!(min > 0.07 && max < 0.13, "{shares:?}");

    let without: Vec<usize> = (0..10).filter(|&b| b != 3).collect();
    let after = assign(&ring(&names, &without, &[FULL; 10]));
    let gone = moved(&before, &after);
    println!(
        "backend leaves: {:.4} of keys moved (ideal 1/N = 0.1000; its share was {:.4})",
        gone, shares[3]
    );
    for (b, a) in before.iter().zip(&after) {
        assert!(
            b == a || *b == 3,
            "a key moved between two backends that stayed"
        );
    }
    assert_eq!(gone, shares[3]);

    let back = assign(&ring(&names, &all, &[FULL; 10]));
    println!(
        "backend returns: {:.4} of keys moved back",
        moved(&after, &back)
    );
    assert_eq!(back, before, "every key is back where it was");

    // Slow start: the returning backend's weight steps from 10 % to 100 %.
    let mut last = 0.0;
    for tenths in 1..=FULL {
        let mut weights = [FULL; 10];
        weights[3] = tenths;
        let during = assign(&ring(&names, &all, &weights));
        let now = share(&during, 3);
        let ideal = f64::from(tenths) / f64::from(tenths + 9 * FULL);
        println!(
            "slow start at {:>3} %: share {:.4} (weight's share {:.4}), {:.4} of keys moved back",
            tenths * 10,
            now,
            ideal,
            moved(&after, &during)
        );
        for (a, d) in after.iter().zip(&during) {
            assert!(
                a == d || *d == 3,
                "during the ramp keys move only to the returning backend"
            );
        }
        assert!(now >= last, "its share only grows while it ramps");
        assert!((now - ideal).abs() < 0.05, "{now} against {ideal}");
        last = now;
    }
}

#[test]
fn a_walk_skips_excluded_and_overloaded_backends() {
    let names = names(3);
    let r = ring(&names, &[0, 1, 2], &[FULL; 3]);
    let key = stable_hash(b"user-7");
    let first = r.pick(key, &[], |_| false).unwrap();
    let second = r.pick(key, &[first], |_| false).unwrap();
    assert_ne!(first, second);
    let third = r.pick(key, &[first, second], |_| false).unwrap();
    assert!(third != first && third != second);
    assert_eq!(r.pick(key, &[0, 1, 2], |_| false), None);
    // Overloaded: walk on; the next backend clockwise is the one a retry would get.
    assert_eq!(r.pick(key, &[], |b| b == first), Some(second));
    // Every backend overloaded: the first one clockwise still serves.
    assert_eq!(r.pick(key, &[], |_| true), Some(first));
    assert_eq!(r.pick(key, &[first], |_| true), Some(second));
}

#[test]
fn bounded_loads_follow_haproxys_rule() {
    // 10 outstanding over 4 equal backends, factor 125: ceil(11 x 1.25) = 14 slots in all,
    // ceil(14 / 4) = 4 each.
    assert!(!overloaded(3, 10, 10, 40, 125));
    assert!(overloaded(4, 10, 10, 40, 125));
    // Nothing outstanding: every backend may take one.
    assert!(!overloaded(0, 1, 0, 1000, 101));
    // A heavier backend gets more slots.
    assert!(!overloaded(7, 30, 10, 40, 125));
    // The slots exceed the requests outstanding, so not every backend is overloaded.
    for total in 0..200u64 {
        let loads = [total / 4, total / 4, total / 4, total - 3 * (total / 4)];
        assert!(loads.iter().any(|&l| !overloaded(l, 10, total, 40, 101)));
    }
}

/// Bounded loads spread a hot key: with factor 150, a key whose backend holds more than its
/// share of outstanding requests goes to the next backend clockwise.
#[test]
fn a_hot_key_spills_to_the_next_backend() {
    let names = names(4);
    let r = ring(&names, &[0, 1, 2, 3], &[FULL; 4]);
    let key = stable_hash(b"hot");
    let mut in_flight = [0u64; 4];
    for _ in 0..40 {
        let total: u64 = in_flight.iter().sum();
        let b = r
            .pick(key, &[], |b| overloaded(in_flight[b], 10, total, 40, 150))
            .unwrap();
        in_flight[b] += 1;
    }
    let max = *in_flight.iter().max().unwrap();
    assert!(max <= 16, "{in_flight:?}");
    assert!(
        in_flight.iter().filter(|&&n| n > 0).count() >= 3,
        "{in_flight:?}"
    );
}

/// 10,000 backends of weight 1000 would want 160 million points: the ring is capped, and each
/// backend keeps at least one.
#[test]
fn a_ring_of_ten_thousand_heavy_backends_is_capped() {
    let names = names(10_000);
    let all: Vec<usize> = (0..10_000).collect();
    let began = std::time::Instant::now();
    let r = Ring::build(&all, |_| 10_000, |i| names[i].as_str());
    println!(
        "ring of 10,000 backends of weight 1000: {} points, built in {:?} (this build's profile)",
        r.len(),
        began.elapsed()
    );
    assert!(r.len() as u64 <= MAX_POINTS, "{}", r.len());
    let light = Ring::build(
        &all,
        |i| if i == 0 { 1 } else { 10_000 },
        |i| names[i].as_str(),
    );
    assert!(
        light.owners.contains(&0),
        "the lightest backend keeps a point"
    );
}

#[test]
fn an_ipv4_mapped_client_hashes_as_its_ipv4_address() {
    let v4: std::net::IpAddr = "192.0.2.7".parse().unwrap();
    let mapped: std::net::IpAddr = "::ffff:192.0.2.7".parse().unwrap();
    let v6: std::net::IpAddr = "2001:db8::7".parse().unwrap();
    assert_eq!(client_key(mapped), client_key(v4));
    assert_eq!(client_key(v4), stable_hash(&[192, 0, 2, 7]));
    assert_ne!(client_key(v6), client_key(v4));
}
