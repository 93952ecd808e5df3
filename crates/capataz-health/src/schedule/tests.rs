//! The schedule on simulated time: phases, the slot grid, cadences, gating, tracking, agents,
//! carrying timers to a pool's next build, and the spread of many backends.

use std::time::Duration;

use super::*;
use crate::rotation::{Join, OverrideKind, Policy};
use crate::{Outcome, Settings, State};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn timing(interval: Duration) -> Timing {
    Timing {
        intervals: ProbeIntervals::uniform(interval),
        jitter: 0.1,
        agent: None,
    }
}

fn rotation(n: usize) -> Rotation {
    let join = Join::New {
        initial: State::Up,
        warm_up: false,
    };
    Rotation::new(
        Settings::default(),
        Policy::default(),
        (0..n).map(|_| (1, join)),
        Duration::ZERO,
    )
}

/// A schedule of `n` probed backends at time zero.
fn probed(n: usize, timing: Timing, seed: u64) -> Schedule {
    let mut schedule = Schedule::new(timing, seed);
    for _ in 0..n {
        schedule.push(Active::Probe, Cadence::Steady, Duration::ZERO);
    }
    schedule
}

/// Every check due by `now`, with probes treated as owned.
fn due(schedule: &mut Schedule, rotation: &Rotation, now: Duration) -> Vec<Due> {
    std::iter::from_fn(|| schedule.poll_due(now, rotation, |_| true)).collect()
}

#[test]
fn first_probes_fall_at_random_phases_on_the_slot_grid_and_repeat_from_a_seed() {
    let first = |seed| {
        let schedule = probed(1000, timing(S), seed);
        (0..1000)
            .map(|b| schedule.next_probe(b).expect("scheduled"))
            .collect::<Vec<_>>()
    };
    let phases = first(42);
    assert!(phases
        .iter()
        .all(|&d| d <= S && d.as_nanos() % 10_000_000 == 0));
    let early = phases.iter().filter(|&&d| d < S / 2).count();
    assert!(
        (400..600).contains(&early),
        "{early} of 1000 in the first half"
    );
    assert_eq!(phases, first(42));
    assert_ne!(phases, first(43));
}

#[test]
fn the_next_probe_comes_one_jittered_interval_of_its_cadence_after_the_last_ends() {
    let mut r = rotation(1);
    let mut timing = timing(S);
    timing.intervals.fast = S / 5;
    let mut schedule = probed(1, timing, 1);
    let first = schedule.poll_timeout().expect("a first probe");
    assert_eq!(schedule.next_probe(0), Some(first));
    assert!(due(&mut schedule, &r, first - MS).is_empty());
    let now = first;
    assert_eq!(
        due(&mut schedule, &r, now),
        [Due {
            backend: 0,
            check: Check::Probe
        }]
    );
    // Under way: nothing more is due, whatever the time, until it ends.
    assert_eq!(schedule.poll_timeout(), None);
    assert!(due(&mut schedule, &r, now + 10 * S).is_empty());
    let end = now + 30 * MS;
    let result = schedule.handle_probe(&mut r, 0, Outcome::Status(500), 30 * MS, end);
    assert_eq!(result, ProbeResult::Fail);
    // A failure starts a streak: the fast interval, jittered, after the end.
    let next = schedule.next_probe(0).expect("scheduled");
    assert!(next >= end + S / 5 * 9 / 10 - 2 * MS && next <= end + S / 5 * 11 / 10 + 2 * MS);
    assert_eq!(next.as_nanos() % 2_000_000, 0, "{next:?} off the 2 ms grid");
    assert_eq!(
        schedule.poll_probed(),
        Some(Probed {
            backend: 0,
            outcome: Outcome::Status(500).into(),
            result: ProbeResult::Fail,
            latency: 30 * MS,
            at: end,
        })
    );
    assert_eq!(schedule.poll_probed(), None);
}

#[test]
fn a_probe_handed_in_without_being_due_moves_no_timer() {
    let mut r = rotation(1);
    let mut schedule = probed(1, timing(S), 2);
    let before = schedule.next_probe(0);
    schedule.handle_probe(&mut r, 0, Outcome::Refused, MS, MS);
    assert_eq!(schedule.next_probe(0), before);
    assert_eq!(r.pool().backend(0).active.fail_streak, 1);
}

#[test]
fn maintenance_and_other_owners_skip_probes_which_are_asked_for_one_interval_later() {
    let mut r = rotation(2);
    let mut schedule = probed(2, timing(S), 3);
    r.set_override(0, Some(OverrideKind::Maintenance), None, Duration::ZERO);
    let mut now = Duration::ZERO;
    let mut ran = Vec::new();
    while now < 10 * S {
        now = schedule.poll_timeout().expect("always something due");
        let due: Vec<Due> = std::iter::from_fn(|| schedule.poll_due(now, &r, |b| b != 1)).collect();
        ran.extend(due.iter().map(|d| d.backend));
        assert!(schedule.next_probe(0).is_some_and(|t| t > now));
    }
    assert!(ran.is_empty(), "{ran:?}");
    // Out of maintenance and owned again: probed at the next ask.
    r.set_override(0, None, None, now);
    let next = schedule.poll_timeout().expect("asked again");
    assert!(next <= now + S * 11 / 10 + 10 * MS);
    let due: Vec<Due> =
        std::iter::from_fn(|| schedule.poll_due(now + 2 * S, &r, |_| true)).collect();
    assert_eq!(due.len(), 2, "{due:?}");
}

#[test]
fn a_tracking_backend_reads_at_once_then_every_interval_and_is_never_probed() {
    let r = rotation(1);
    let mut schedule = Schedule::new(timing(S), 4);
    schedule.push(Active::Track, Cadence::Steady, 5 * S);
    assert_eq!(schedule.next_probe(0), None);
    assert_eq!(schedule.poll_timeout(), Some(5 * S));
    let mut now = 5 * S;
    for _ in 0..20 {
        assert_eq!(
            due(&mut schedule, &r, now),
            [Due {
                backend: 0,
                check: Check::Track
            }]
        );
        let next = schedule.poll_timeout().expect("the next reading");
        assert!(
            next >= now + S * 9 / 10 && next <= now + S * 11 / 10,
            "{next:?}"
        );
        now = next;
    }
}

#[test]
fn agents_are_asked_at_a_random_phase_then_after_each_exchange_even_in_maintenance() {
    let mut r = rotation(2);
    let mut timing = timing(S);
    timing.agent = Some(2 * S);
    let mut schedule = Schedule::new(timing, 5);
    schedule.push(Active::None, Cadence::Steady, Duration::ZERO);
    schedule.push(Active::Probe, Cadence::Steady, Duration::ZERO);
    r.set_override(0, Some(OverrideKind::Maintenance), None, Duration::ZERO);
    let mut asked = [0; 2];
    let mut now = Duration::ZERO;
    while now < 60 * S {
        now = schedule.poll_timeout().expect("always something due");
        for due in due(&mut schedule, &r, now) {
            match due.check {
                Check::Agent => {
                    asked[due.backend] += 1;
                    let report = AgentReport::parse(b"up 50%");
                    schedule.handle_agent(&mut r, due.backend, report, now + 5 * MS);
                }
                Check::Probe => {
                    schedule.handle_probe(&mut r, due.backend, Outcome::Status(200), MS, now);
                }
                Check::Track => unreachable!("nothing tracks"),
            }
        }
    }
    // One exchange about every 2 s from a phase within the first 2 s.
    assert!(asked.iter().all(|&n| (27..=31).contains(&n)), "{asked:?}");
    assert_eq!(r.agent(0).weight_percent, 50);
    // A failed exchange is no input, and the next one is still scheduled.
    let next = std::iter::from_fn(|| schedule.poll_due(120 * S, &r, |_| true))
        .find(|d| d.check == Check::Agent)
        .expect("an exchange due");
    schedule.handle_agent(&mut r, next.backend, None, 120 * S);
    assert_eq!(r.agent(next.backend).weight_percent, 50);
    assert!(schedule.poll_timeout().is_some());
}

#[test]
fn a_successor_keeps_the_due_times_of_kept_backends_and_hands_a_running_probe_its_end() {
    let r = rotation(3);
    let mut old = probed(3, timing(S), 6);
    let first = old.poll_timeout().expect("due");
    let started = due(&mut old, &r, first);
    assert_eq!(started.len(), 1);
    let running = started[0].backend;
    // Backend 1 leaves; 0 and 2 stay (2 becomes 1), and one joins.
    let kept: Vec<usize> = (0..3).filter(|&b| b != 1).collect();
    let mut next = old.successor();
    for &b in &kept {
        next.push_kept(old.timers(b).expect("a backend"));
    }
    next.push(Active::Probe, Cadence::Steady, first);
    for (i, &b) in kept.iter().enumerate() {
        assert_eq!(next.next_probe(i), old.next_probe(b));
    }
    assert!(next.next_probe(2).is_some());
    if let Some(i) = kept.iter().position(|&b| b == running) {
        // Its end, handed to the successor, schedules its next probe there.
        let mut r = rotation(3);
        assert!(due(&mut next, &r, first).is_empty());
        next.handle_probe(&mut r, i, Outcome::Status(200), MS, first + MS);
        assert!(next.next_probe(i).is_some_and(|t| t > first + S / 2));
    }
    // The successor's draws continue the old schedule's, not a fresh seed's.
    let mut again = old.successor();
    again.push(Active::Probe, Cadence::Steady, first);
    assert_eq!(again.next_probe(0), next.next_probe(2));
}

#[test]
fn ten_thousand_backends_are_probed_evenly_every_interval() {
    let n = 10_000;
    let mut r = rotation(n);
    let mut schedule = probed(n, timing(S), 7);
    // Each probe takes 2 ms; count starts per 100 ms over 20 simulated seconds after 5 s.
    let mut buckets = vec![0u32; 200];
    let mut running: VecDeque<(Duration, usize)> = VecDeque::new();
    let mut now = Duration::ZERO;
    while now < 25 * S {
        let next_end = running.front().map(|&(end, _)| end);
        now = match (schedule.poll_timeout(), next_end) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).expect("something pending"),
        };
        while let Some(&(end, backend)) = running.front().filter(|(end, _)| *end <= now) {
            running.pop_front();
            schedule.handle_probe(&mut r, backend, Outcome::Status(200), 2 * MS, end);
            while schedule.poll_probed().is_some() {}
        }
        for due in due(&mut schedule, &r, now) {
            if now >= 5 * S {
                let bucket = ((now - 5 * S).as_millis() / 100) as usize;
                if let Some(count) = buckets.get_mut(bucket) {
                    *count += 1;
                }
            }
            running.push_back((now + 2 * MS, due.backend));
        }
    }
    let total: u32 = buckets.iter().sum();
    let average = f64::from(total) / buckets.len() as f64;
    let max = f64::from(*buckets.iter().max().expect("buckets"));
    // Each backend about once per interval plus its probe's length, evenly.
    assert!((9_000.0..10_000.0).contains(&(average * 10.0)), "{average}");
    assert!(
        max / average < 1.3,
        "max {max} against an average of {average}"
    );
}
