//! The fault matrix: the ways a backend fails that a load balancer must
//! survive, each on its own and mixed, under steady keep-alive client traffic, on loopback.
//!
//! Each scenario scripts in-process backends ([`SimBackend`], plus [`Truncator`] for a reset in
//! the middle of a body), starts its own balancer with fast checks, and asserts what the health
//! rules predict:
//! - a backend goes DOWN after exactly `fall` failed probes or `consecutive_errors` traffic
//!   errors (the transition's streak says which), and comes back after `rise` passing probes or
//!   when its ejection runs out;
//! - every verdict change is one event and nothing else is one ([`Ledger::check`]), and each
//!   scenario knows how many changes it causes;
//! - no request reaches a backend while it is out, outside fail-open
//!   ([`assert_no_traffic_while_out`]);
//! - clients see no failed GET while at least one backend is UP: retries cover refusals, resets,
//!   timeouts and garbage. A 500, or a body cut after its headers went to the client, cannot be
//!   retried; those are bounded by the ejection rule instead;
//! - no task panics, and no file descriptor or task outlives the scenario ([`run`]).
//!
//! Scenarios run one at a time, each on its own runtime: open file descriptors are counted for
//! the whole process, so a neighbour's sockets would blur the count (and the few cores of a CI
//! machine would blur the timings). Waits are on events, counts or states with a generous
//! deadline, never fixed sleeps; the clients' pacing only shapes the load.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use capataz::config;
use capataz::health::{Clock, Notice, PoolRt};
use capataz::server::Balancer;
use capataz::sim::{Mode, SimBackend};
use capataz_health::{Ejection, EjectionInfo, Outcome, Reason, State, Transition};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

mod support;

use support::any;
use support::balancer::{backends as sims, pairs, ConfigText};

/// How long any wait may take before the scenario fails.
const DEADLINE: Duration = Duration::from_secs(15);
/// How often a polled condition is looked at again.
const POLL: Duration = Duration::from_millis(2);

/// Concurrent keep-alive clients per scenario.
const CLIENTS: usize = 3;
/// Each client sends at most one request per this long.
const PACE: Duration = Duration::from_millis(4);
/// Each client stops after this many requests, whatever happens.
const MAX_REQUESTS: usize = 20_000;
/// Requests per client in a window that must not reach an out backend.
const WINDOW: u64 = 5;

/// The checks' thresholds, as configured below.
const RISE: u32 = 2;
const FALL: u32 = 3;
const ERRORS: u32 = 3;
/// The first ejection where passive checks alone act.
const EJECTION: Duration = Duration::from_millis(300);
/// The first ejection where both sides see the fault: it outlasts the `fall` failed probes by
/// far, so the ejection cannot run out while the probes still say UP (which would add an UP and
/// a DOWN to the history and make the count of transitions depend on timing).
const LONG_EJECTION: Duration = Duration::from_secs(2);
/// How late a slow backend answers: longer than both timeouts below (150 ms).
const SLOW: Duration = Duration::from_millis(400);

/// How many more file descriptors than at the start are tolerated once everything is dropped.
const FD_SLACK: usize = 0;

/// The pool's passive and retry settings, which differ between scenarios.
#[derive(Clone, Copy, Debug)]
struct Knobs {
    ejection: Duration,
    max_ejected_percent: u8,
    attempts: u32,
    min_budget: u32,
}

/// A fault only traffic sees: ejection by passive checks, then probation. The retry settings
/// are the defaults (one retry per request, a burst of ten).
const PASSIVE: Knobs = Knobs {
    ejection: EJECTION,
    max_ejected_percent: 50,
    attempts: 1,
    min_budget: 10,
};

/// A fault both sides see.
const BOTH_SIDES: Knobs = Knobs {
    ejection: LONG_EJECTION,
    ..PASSIVE
};

// ---------------------------------------------------------------------------------------------
// The matrix.

/// One backend of three breaks in each way [`single_fault`] scripts.
#[test]
fn a_single_fault_is_taken_out_and_readmitted_unnoticed() {
    let cases = [
        ("crash, then restart on the same port", Fault::Crash),
        ("hang: accepts and never answers", Fault::Hang),
        ("slow: answers after the timeout", Fault::Slow),
        ("garbage status line", Fault::Garbage),
        ("empty reply", Fault::EmptyReply),
    ];
    support::cases::each_sync(cases, |fault| run(|| single_fault(fault)));
}

#[test]
fn status_500_on_traffic_while_healthz_says_200() {
    run(|| async {
        let b = sims(&["a", "liar", "c"]).await;
        unretryable_answers(Liar::Status500(&b[1]), &pairs(&b)).await;
    });
}

/// Regression: a body cut short by a reset after its headers were relayed used to count as the
/// good status of its headers, so a backend doing it to every response stayed in rotation
/// forever while a third of the GETs failed. It now counts as a reset.
#[test]
fn reset_in_the_middle_of_a_response_ejects_the_backend() {
    run(|| async {
        let a = SimBackend::start("a", any()).await.expect("start a");
        let liar = Truncator::start("liar").await;
        let c = SimBackend::start("c", any()).await.expect("start c");
        let backends = [
            ("a".to_owned(), a.addr()),
            ("liar".to_owned(), liar.addr),
            ("c".to_owned(), c.addr()),
        ];
        unretryable_answers(Liar::Truncating(&liar), &backends).await;
    });
}

/// `probes_end_ejection` (on by default): a backend ejected by its traffic whose probes then fail
/// too (a crash, say) is back on probation as soon as `rise` probes pass once it is healed, long
/// before its ejection would run out, and a good answer readmits it for good.
#[test]
fn passing_probes_end_an_ejection_after_the_probes_went_down() {
    run(|| async {
        let b = sims(&["a", "b", "c"]).await;
        let knobs = Knobs {
            ejection: Duration::from_secs(600),
            ..PASSIVE
        };
        let (balancer, pool, mut ledger) = start(&config_text(&pairs(&b), knobs)).await;
        let traffic = Traffic::start(balancer.local_addrs()[0], pool.clock());
        assert!(b[1].wait_traffic_hits(20, DEADLINE).await);

        b[1].set_traffic(Mode::Status(500));
        let down = ledger.transition(1, State::Down, 1).await;
        assert!(
            matches!(down.reason, Reason::TrafficErrors { streak: ERRORS, .. }),
            "{down}"
        );
        b[1].set_health(Mode::Status(503));
        until("active side DOWN behind the ejection", || {
            pool.health()[1].active.state == State::Down
        })
        .await;
        assert!(pool.health()[1].passive.is_ejected());

        b[1].set_traffic(Mode::Status(200));
        b[1].set_health(Mode::Status(200));
        let up = ledger.transition(1, State::Up, 1).await;
        assert_eq!(
            up.reason,
            Reason::ProbesEndedEjection {
                streak: RISE,
                last: Outcome::Status(200),
                nth: 1
            }
        );
        assert!(
            up.at - down.at < DEADLINE,
            "{down} at {:?}, {up} at {:?}",
            down.at,
            up.at
        );
        back_in_rotation(&b[1]).await;
        until("readmitted for good", || {
            pool.health()[1].passive.ejection == Ejection::None
        })
        .await;

        let records = traffic.finish().await;
        ledger.check(&pool);
        assert_eq!(ledger.changes(), [0, 2, 0], "{}", ledger.describe());
        // The only failures clients saw are the 500s that got it ejected (relayed, as 500s are
        // never retried): the ones counted, and at most one more per other client in flight.
        let failed: Vec<&Record> = records.iter().filter(|r| !r.ok()).collect();
        assert!(
            failed
                .iter()
                .all(|r| r.backend.as_deref() == Some("b") && r.status == Some(500)),
            "{failed:#?}"
        );
        assert!(failed.len() < ERRORS as usize + CLIENTS, "{failed:#?}");
    });
}

#[test]
fn healthz_503_while_traffic_is_fine() {
    run(|| async {
        let b = sims(&["a", "b", "c"]).await;
        let (balancer, pool, mut ledger) = start(&config_text(&pairs(&b), BOTH_SIDES)).await;
        let traffic = Traffic::start(balancer.local_addrs()[0], pool.clock());
        assert!(b[1].wait_traffic_hits(20, DEADLINE).await);

        b[1].set_health(Mode::Status(503));
        let down = ledger.transition(1, State::Down, 1).await;
        assert_eq!(
            down.reason,
            Reason::ProbesFailed {
                streak: FALL,
                last: Outcome::Status(503),
                mismatch: None,
            }
        );
        assert_no_traffic_while_out(&pool, &mut ledger, &traffic, 1, || b[1].traffic_hits()).await;

        b[1].set_health(Mode::Status(200));
        let up = ledger.transition(1, State::Up, 1).await;
        assert_eq!(
            up.reason,
            Reason::ProbesPassed {
                streak: RISE,
                last: Outcome::Status(200)
            }
        );
        back_in_rotation(&b[1]).await;

        let records = traffic.finish().await;
        assert_no_failures(&records, &[]);
        ledger.check(&pool);
        assert_eq!(ledger.changes(), [0, 2, 0]);
    });
}

#[test]
fn flapping_healthz_changes_no_verdict() {
    run(|| async {
        let b = sims(&["a", "b", "c"]).await;
        let flapping = || vec![Mode::Status(503), Mode::Status(200)];
        b[1].set_health_pattern(flapping());
        let (balancer, pool, mut ledger) = start(&config_text(&pairs(&b), BOTH_SIDES)).await;
        let traffic = Traffic::start(balancer.local_addrs()[0], pool.clock());

        // UP and failing one probe in two: the failure streak never reaches `fall`.
        let probes = b[1].health_hits();
        let hits = b[1].traffic_hits();
        assert!(b[1].wait_health_hits(probes + 40, DEADLINE).await);
        assert_eq!(ledger.changes(), [0, 0, 0], "{}", ledger.describe());
        assert!(
            b[1].traffic_hits() > hits,
            "the flapping backend left rotation"
        );

        // DOWN and passing one probe in two: the pass streak never reaches `rise`.
        b[1].set_health(Mode::Status(503));
        let down = ledger.transition(1, State::Down, 1).await;
        assert!(matches!(
            down.reason,
            Reason::ProbesFailed { streak: FALL, .. }
        ));
        b[1].set_health_pattern(flapping());
        let probes = b[1].health_hits();
        assert!(b[1].wait_health_hits(probes + 40, DEADLINE).await);
        assert_eq!(ledger.changes(), [0, 1, 0], "{}", ledger.describe());
        assert_no_traffic_while_out(&pool, &mut ledger, &traffic, 1, || b[1].traffic_hits()).await;

        b[1].set_health(Mode::Status(200));
        let up = ledger.transition(1, State::Up, 1).await;
        assert!(matches!(
            up.reason,
            Reason::ProbesPassed { streak: RISE, .. }
        ));

        let records = traffic.finish().await;
        assert_no_failures(&records, &[]);
        ledger.check(&pool);
        assert_eq!(ledger.changes(), [0, 2, 0]);
    });
}

#[test]
fn every_backend_failing_its_probes_fails_open_then_one_back_takes_all_traffic() {
    run(|| async {
        let b = sims(&["a", "b", "c"]).await;
        let (balancer, pool, mut ledger) = start(&config_text(&pairs(&b), BOTH_SIDES)).await;
        let traffic = Traffic::start(balancer.local_addrs()[0], pool.clock());
        assert!(b[2].wait_traffic_hits(20, DEADLINE).await);

        for backend in &b {
            backend.set_health(Mode::Status(503));
        }
        for i in 0..3 {
            let down = ledger.transition(i, State::Down, 1).await;
            assert!(matches!(
                down.reason,
                Reason::ProbesFailed { streak: FALL, .. }
            ));
        }
        ledger
            .wait("all down", |e| matches!(e, Notice::AllDown { .. }))
            .await;
        // Failing open: traffic is still served, by every backend.
        let hits: Vec<u64> = b.iter().map(SimBackend::traffic_hits).collect();
        for (backend, before) in b.iter().zip(hits) {
            assert!(backend.wait_traffic_hits(before + 5, DEADLINE).await);
        }

        b[0].set_health(Mode::Status(200));
        let up = ledger.transition(0, State::Up, 1).await;
        assert!(matches!(
            up.reason,
            Reason::ProbesPassed { streak: RISE, .. }
        ));
        ledger
            .wait("recovered", |e| matches!(e, Notice::Recovered { .. }))
            .await;
        for i in [1, 2] {
            let hits = || b[i].traffic_hits();
            assert_no_traffic_while_out(&pool, &mut ledger, &traffic, i, hits).await;
        }

        let records = traffic.finish().await;
        assert_no_failures(&records, &[]);
        ledger.check(&pool);
        assert_eq!(ledger.changes(), [2, 1, 1]);
        assert_eq!(
            (ledger.count("all_down"), ledger.count("recovered")),
            (1, 1)
        );
    });
}

#[test]
fn every_backend_crashed_then_one_restarted() {
    run(|| async {
        let b = sims(&["a", "b", "c"]).await;
        let (balancer, pool, mut ledger) = start(&config_text(&pairs(&b), BOTH_SIDES)).await;
        let clock = pool.clock();
        let traffic = Traffic::start(balancer.local_addrs()[0], clock);
        assert!(b[2].wait_traffic_hits(20, DEADLINE).await);

        let outage_start = clock.now();
        for backend in &b {
            backend.crash();
        }
        for i in 0..3 {
            let down = ledger.transition(i, State::Down, 1).await;
            check_fault_reason(&down, Outcome::Refused, &[Outcome::Refused, Outcome::Reset]);
        }
        ledger
            .wait("all down", |e| matches!(e, Notice::AllDown { .. }))
            .await;
        until("every active side DOWN", || {
            pool.health().iter().all(|h| h.active.state == State::Down)
        })
        .await;

        b[0].restart().await.expect("restart a");
        let up = ledger.transition(0, State::Up, 1).await;
        // Its probes bring it back; if traffic ejected it first, those same probes end the
        // ejection (probes_end_ejection), long before the ejection would have run out.
        assert!(
            matches!(
                up.reason,
                Reason::ProbesPassed { streak: RISE, .. }
                    | Reason::ProbesEndedEjection {
                        streak: RISE,
                        nth: 1,
                        ..
                    }
            ),
            "{up}"
        );
        ledger
            .wait("recovered", |e| matches!(e, Notice::Recovered { .. }))
            .await;
        let outage_end = clock.now();
        back_in_rotation(&b[0]).await;

        let records = traffic.finish().await;
        let during = records
            .iter()
            .filter(|r| r.overlaps(outage_start, outage_end));
        assert!(
            during.filter(|r| !r.ok()).count() > 0,
            "an outage no client noticed"
        );
        assert_no_failures(&records, &[(outage_start, outage_end)]);
        ledger.check(&pool);
        assert_eq!(ledger.changes(), [2, 1, 1]);
        assert_eq!(
            (ledger.count("all_down"), ledger.count("recovered")),
            (1, 1)
        );
    });
}

#[test]
fn mixed_faults_at_once_cost_clients_nothing_while_one_backend_stays_up() {
    run(|| async {
        let names = ["ok", "crash", "hang", "garbage", "empty", "flapping"];
        let b = sims(&names).await;
        // Up to four broken backends may be met before a good one, and every ejection may hold.
        let knobs = Knobs {
            ejection: LONG_EJECTION,
            max_ejected_percent: 100,
            attempts: 5,
            min_budget: 50,
        };
        let (balancer, pool, mut ledger) = start(&config_text(&pairs(&b), knobs)).await;
        let traffic = Traffic::start(balancer.local_addrs()[0], pool.clock());
        for backend in &b {
            assert!(backend.wait_traffic_hits(10, DEADLINE).await);
        }

        Fault::Crash.apply(&b[1]);
        Fault::Hang.apply(&b[2]);
        Fault::Garbage.apply(&b[3]);
        b[4].set_traffic(Mode::Close);
        b[5].set_health_pattern(vec![Mode::Status(503), Mode::Status(200)]);

        for (i, fault) in [(1, Fault::Crash), (2, Fault::Hang), (3, Fault::Garbage)] {
            let down = ledger.transition(i, State::Down, 1).await;
            let (probe, traffic) = fault.outcomes();
            check_fault_reason(&down, probe, traffic);
        }
        let down = ledger.transition(4, State::Down, 1).await;
        assert!(
            matches!(
                down.reason,
                Reason::TrafficErrors {
                    streak: ERRORS,
                    last: Outcome::Reset,
                    ejection: Some(EjectionInfo { nth: 1, .. })
                }
            ),
            "{down}"
        );
        for i in 1..=3 {
            settled_down(&pool, i).await;
        }
        for i in [2, 3, 4] {
            let hits = || b[i].traffic_hits();
            assert_no_traffic_while_out(&pool, &mut ledger, &traffic, i, hits).await;
        }

        Fault::Crash.heal(&b[1]).await;
        Fault::Hang.heal(&b[2]).await;
        Fault::Garbage.heal(&b[3]).await;
        b[4].set_traffic(Mode::Status(200));
        for i in 1..=3 {
            let up = ledger.transition(i, State::Up, 1).await;
            assert!(matches!(
                up.reason,
                Reason::ProbesPassed { streak: RISE, .. }
            ));
        }
        until("empty readmitted", || {
            pool.verdict(4) == State::Up && pool.health()[4].passive.ejection == Ejection::None
        })
        .await;
        for backend in &b[1..5] {
            back_in_rotation(backend).await;
        }

        let records = traffic.finish().await;
        assert_no_failures(&records, &[]);
        ledger.check(&pool);
        let changes = ledger.changes();
        assert_eq!(changes[..4], [0, 2, 2, 2]);
        assert_eq!(changes[4] % 2, 0, "empty ends UP");
        assert_eq!(
            changes[5], 0,
            "one failed probe in two is no reason to go DOWN"
        );
        assert_eq!(ledger.count("all_down"), 0);
    });
}

// ---------------------------------------------------------------------------------------------
// Scenarios shared by several faults.

/// A fault scripted on one [`SimBackend`], seen by both probes and traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The listener closes and open connections are reset; later it listens on the same port.
    Crash,
    /// Accepts and reads, never answers.
    Hang,
    /// Answers after longer than the timeouts.
    Slow,
    /// Answers a garbage status line.
    Garbage,
    /// Closes without a byte.
    EmptyReply,
}

impl Fault {
    fn apply(self, b: &SimBackend) {
        let both = |mode| {
            b.set_health(mode);
            b.set_traffic(mode);
        };
        match self {
            Fault::Crash => b.crash(),
            Fault::Hang => both(Mode::Hang),
            Fault::Slow => both(Mode::Delay(SLOW, 200)),
            Fault::Garbage => both(Mode::Garbage),
            Fault::EmptyReply => both(Mode::Close),
        }
    }

    async fn heal(self, b: &SimBackend) {
        b.set_health(Mode::Status(200));
        b.set_traffic(Mode::Status(200));
        if self == Fault::Crash {
            b.restart().await.expect("restart on the same port");
        }
    }

    /// What a failed probe meets, and what a failed relayed request may meet.
    fn outcomes(self) -> (Outcome, &'static [Outcome]) {
        match self {
            // A request on a pooled connection when the crash resets it meets a reset.
            Fault::Crash => (Outcome::Refused, &[Outcome::Refused, Outcome::Reset]),
            Fault::Hang | Fault::Slow => (Outcome::Timeout, &[Outcome::Timeout]),
            Fault::Garbage => (Outcome::Malformed, &[Outcome::Malformed]),
            Fault::EmptyReply => (Outcome::Reset, &[Outcome::Reset]),
        }
    }
}

/// One backend of three breaks, is taken out by whichever side sees it first, stays out, and
/// is readmitted by `rise` passing probes once healed; clients never notice.
async fn single_fault(fault: Fault) {
    let b = sims(&["a", "b", "c"]).await;
    let (balancer, pool, mut ledger) = start(&config_text(&pairs(&b), BOTH_SIDES)).await;
    let traffic = Traffic::start(balancer.local_addrs()[0], pool.clock());
    // Warm: the balancer holds keep-alive connections to it.
    assert!(b[1].wait_traffic_hits(20, DEADLINE).await);

    fault.apply(&b[1]);
    let down = ledger.transition(1, State::Down, 1).await;
    let (probe, traffic_outcomes) = fault.outcomes();
    check_fault_reason(&down, probe, traffic_outcomes);
    settled_down(&pool, 1).await;

    if fault == Fault::Crash {
        // Back on the same port but still failing its probes: listening is not being UP.
        let addr = b[1].addr();
        b[1].set_health(Mode::Status(503));
        b[1].restart().await.expect("restart on the same port");
        assert_eq!(b[1].addr(), addr);
        let probes = b[1].health_hits();
        assert!(
            b[1].wait_health_hits(probes + u64::from(FALL), DEADLINE)
                .await
        );
    }
    assert_no_traffic_while_out(&pool, &mut ledger, &traffic, 1, || b[1].traffic_hits()).await;

    fault.heal(&b[1]).await;
    let up = ledger.transition(1, State::Up, 1).await;
    assert_eq!(
        up.reason,
        Reason::ProbesPassed {
            streak: RISE,
            last: Outcome::Status(200)
        }
    );
    back_in_rotation(&b[1]).await;

    let records = traffic.finish().await;
    assert_no_failures(&records, &[]);
    ledger.check(&pool);
    assert_eq!(ledger.changes(), [0, 2, 0], "{}", ledger.describe());
    assert_eq!(ledger.count("all_down"), 0);
}

/// A backend whose probes pass and whose answers are bad in a way no retry can hide.
enum Liar<'a> {
    /// Answers 500 (not retried by design: only 502-504 and connection failures are).
    Status500(&'a SimBackend),
    /// Sends the headers and part of the body, then resets the connection.
    Truncating(&'a Truncator),
}

impl Liar<'_> {
    fn set_broken(&self, broken: bool) {
        match self {
            Liar::Status500(b) => b.set_traffic(Mode::Status(if broken { 500 } else { 200 })),
            Liar::Truncating(t) => t.truncate.store(broken, Ordering::SeqCst),
        }
    }

    fn traffic_hits(&self) -> u64 {
        match self {
            Liar::Status500(b) => b.traffic_hits(),
            Liar::Truncating(t) => t.hits.load(Ordering::SeqCst),
        }
    }

    /// The outcome passive checks see.
    fn outcome(&self) -> Outcome {
        match self {
            Liar::Status500(_) => Outcome::Status(500),
            Liar::Truncating(_) => Outcome::Reset,
        }
    }

    /// Whether a client's record shows one of its bad answers.
    fn is_symptom(&self, record: &Record) -> bool {
        let from_liar = record.backend.as_deref() == Some("liar");
        match self {
            Liar::Status500(_) => from_liar && record.status == Some(500),
            Liar::Truncating(_) => {
                from_liar && record.status == Some(200) && record.failure.is_some()
            }
        }
    }

    async fn wait_traffic_hits(&self, n: u64) {
        until("traffic to the liar", || self.traffic_hits() >= n).await;
    }
}

/// The middle backend of `backends` (named `liar`) answers badly while its probes pass: passive
/// checks eject it after exactly `consecutive_errors` bad answers, each ejection runs out and
/// its first answer on probation, still bad, ejects it again for longer; healed during an
/// ejection, it is back for good once that ejection is over. Clients see its bad answers only
/// while it is eligible.
async fn unretryable_answers(liar: Liar<'_>, backends: &[(String, SocketAddr)]) {
    let (balancer, pool, mut ledger) = start(&config_text(backends, PASSIVE)).await;
    let traffic = Traffic::start(balancer.local_addrs()[0], pool.clock());
    liar.wait_traffic_hits(20).await;

    liar.set_broken(true);
    ledger.transition(1, State::Down, 1).await;
    assert_no_traffic_while_out(&pool, &mut ledger, &traffic, 1, || liar.traffic_hits()).await;
    // Usually still in its first ejection; a window that had to be tried again saw more.
    let ejections = ledger.downs(1);
    ledger.transition(1, State::Up, ejections).await;
    ledger.transition(1, State::Down, ejections + 1).await;
    // Healed while ejected: the ejection still runs its course, then one good answer on
    // probation readmits it.
    liar.set_broken(false);
    until("readmission", || {
        pool.verdict(1) == State::Up && pool.health()[1].passive.ejection == Ejection::None
    })
    .await;
    let hits = liar.traffic_hits();
    liar.wait_traffic_hits(hits + 10).await;

    let records = traffic.finish().await;
    ledger.check(&pool);
    // Every ejection is one DOWN and its end one UP, and nothing else moved.
    let history = ledger.transitions(1);
    let ejections = pool.health()[1].passive.times_ejected as usize;
    assert!(ejections >= 2, "{}", ledger.describe());
    assert_eq!(history.len(), 2 * ejections, "{}", ledger.describe());
    assert_eq!(ledger.changes(), [0, history.len(), 0]);
    for (i, pair) in history.chunks(2).enumerate() {
        let nth = i as u32 + 1;
        let duration = (EJECTION * nth).min(EJECTION * 2);
        let ejection = match pair[0].reason {
            Reason::TrafficErrors {
                streak,
                last,
                ejection: Some(ejection),
            } if nth == 1 => {
                assert_eq!((streak, last), (ERRORS, liar.outcome()));
                ejection
            }
            Reason::ProbationFailed { last, ejection } if nth > 1 => {
                assert_eq!(last, liar.outcome());
                ejection
            }
            _ => panic!("ejection #{nth}: {}", pair[0]),
        };
        assert_eq!((ejection.nth, ejection.duration), (nth, duration));
        assert_eq!(pair[1].reason, Reason::EjectionExpired { nth, duration });
    }

    let (symptoms, others): (Vec<&Record>, Vec<&Record>) = records
        .iter()
        .filter(|r| !r.ok())
        .partition(|r| liar.is_symptom(r));
    assert!(others.is_empty(), "clients saw other failures: {others:#?}");
    // Each ejection comes with the bad answers that caused it (the third in a row, then one on
    // each probation); requests already sent to it when it was ejected may add one per other
    // client.
    let most = ERRORS as usize + (ejections - 1) + ejections * (CLIENTS - 1);
    assert!(
        symptoms.len() <= most,
        "{} bad answers reached clients, more than {most}: {symptoms:#?}",
        symptoms.len()
    );
    let least = match liar {
        // A 500 is relayed, never retried: each one the engine counted reached a client.
        Liar::Status500(_) => ERRORS as usize + 1,
        // A reset that beats the headers is retried unseen; but some cuts reached clients, or
        // this scenario tested nothing.
        Liar::Truncating(_) => 1,
    };
    assert!(symptoms.len() >= least, "{symptoms:#?}");
}

// ---------------------------------------------------------------------------------------------
// Assertions.

/// A DOWN caused by a fault seen by both sides: either `fall` failed probes meeting `probe`, or
/// `consecutive_errors` relayed requests meeting one of `traffic` (first ejection).
fn check_fault_reason(down: &Transition, probe: Outcome, traffic: &[Outcome]) {
    match down.reason {
        Reason::ProbesFailed { streak, last, .. } => {
            assert_eq!((streak, last), (FALL, probe), "{down}");
        }
        Reason::TrafficErrors {
            streak,
            last,
            ejection: Some(ejection),
        } => {
            assert_eq!(streak, ERRORS, "{down}");
            assert!(traffic.contains(&last), "{down}");
            assert_eq!(ejection.nth, 1, "{down}");
        }
        _ => panic!("unexpected reason: {down}"),
    }
}

/// Proves that no request reaches backend `index` while it is out: once it is out (outside
/// fail-open), every client finishes the request it may have had in progress, then `WINDOW`
/// requests per client go by and the backend's hit count must not move. A window during which
/// the backend came back proves nothing and is tried again.
async fn assert_no_traffic_while_out(
    pool: &PoolRt,
    ledger: &mut Ledger,
    traffic: &Traffic,
    index: usize,
    hits: impl Fn() -> u64,
) {
    let end = Instant::now() + DEADLINE;
    loop {
        assert!(
            Instant::now() < end,
            "backend #{index} was never out for a whole window"
        );
        until("backend out", || {
            pool.verdict(index) == State::Down && !pool.snapshot().all_down
        })
        .await;
        let marks = ledger.marks(index);
        // Each client's next-but-one completion started after this point, so every request
        // picked before it went out has been answered, and counted by the backend.
        traffic.wait_each(2).await;
        let before = hits();
        traffic.wait_each(WINDOW).await;
        let after = hits();
        let out = pool.verdict(index) == State::Down && !pool.snapshot().all_down;
        if out && ledger.marks(index) == marks {
            assert_eq!(after, before, "backend #{index} got traffic while out");
            return;
        }
    }
}

/// Every GET that did not overlap a `tolerated` window got a whole 200.
fn assert_no_failures(records: &[Record], tolerated: &[(Duration, Duration)]) {
    assert!(
        records.len() >= 30 * CLIENTS,
        "too little traffic to prove anything: {} requests",
        records.len()
    );
    let failed: Vec<&Record> = records
        .iter()
        .filter(|r| !r.ok())
        .filter(|r| !tolerated.iter().any(|&(from, to)| r.overlaps(from, to)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} GETs failed while a backend was UP: {failed:#?}",
        failed.len(),
        records.len()
    );
}

/// Waits until backend `index` is DOWN on its probes and no longer ejected, so that healing it
/// makes exactly one transition, by `rise` passing probes.
async fn settled_down(pool: &PoolRt, index: usize) {
    until("active DOWN and no ejection", || {
        let health = pool.health()[index];
        health.active.state == State::Down && !health.passive.is_ejected()
    })
    .await;
}

/// Waits until `b` serves traffic again.
async fn back_in_rotation(b: &SimBackend) {
    let hits = b.traffic_hits();
    assert!(
        b.wait_traffic_hits(hits + 10, DEADLINE).await,
        "{} got no traffic back",
        b.name()
    );
}

/// Waits until `done` holds, polling.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < end, "{what}: not within {DEADLINE:?}");
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The events.

/// Every event the balancer published, in order, and the waits on them.
struct Ledger {
    rx: broadcast::Receiver<Notice>,
    events: Vec<Notice>,
    size: usize,
}

impl Ledger {
    /// Takes the events already published.
    fn pull(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(event) => self.events.push(event),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    panic!("{n} events lost: the ledger cannot vouch for them")
                }
                Err(_) => return,
            }
        }
    }

    /// Waits until `found` finds what it looks for in the events so far.
    async fn wait_until<T>(&mut self, what: &str, found: impl Fn(&[Notice]) -> Option<T>) -> T {
        let end = Instant::now() + DEADLINE;
        loop {
            self.pull();
            if let Some(found) = found(&self.events) {
                return found;
            }
            match tokio::time::timeout_at(end, self.rx.recv()).await {
                Ok(Ok(event)) => self.events.push(event),
                Ok(Err(broadcast::error::RecvError::Lagged(n))) => {
                    panic!("{n} events lost: the ledger cannot vouch for them")
                }
                Ok(Err(error)) => panic!("event stream ended waiting for {what}: {error}"),
                Err(_) => panic!(
                    "no {what} within {DEADLINE:?}; so far:\n{}",
                    self.describe()
                ),
            }
        }
    }

    /// Waits for the first event, from the start, matching `want`.
    async fn wait(&mut self, what: &str, want: impl Fn(&Notice) -> bool) -> Notice {
        self.wait_until(what, |events| events.iter().find(|e| want(e)).cloned())
            .await
    }

    /// Waits for the `nth` (from 1) transition of backend `index` to `to`.
    async fn transition(&mut self, index: usize, to: State, nth: usize) -> Transition {
        let what = format!("transition #{nth} of backend #{index} to {to}");
        self.wait_until(&what, |events| {
            events
                .iter()
                .filter_map(|e| match e {
                    Notice::Transition { transition, .. }
                        if transition.backend == index && transition.to == to =>
                    {
                        Some(*transition)
                    }
                    _ => None,
                })
                .nth(nth - 1)
        })
        .await
    }

    /// The transitions of backend `index`, and of the pool's all-down state, so far.
    fn marks(&mut self, index: usize) -> (usize, usize) {
        self.pull();
        let all_down = self.count("all_down") + self.count("recovered");
        (self.transitions(index).len(), all_down)
    }

    fn transitions(&mut self, index: usize) -> Vec<Transition> {
        self.pull();
        self.events
            .iter()
            .filter_map(|e| match e {
                Notice::Transition { transition, .. } if transition.backend == index => {
                    Some(*transition)
                }
                _ => None,
            })
            .collect()
    }

    /// The number of DOWN transitions of backend `index` so far.
    fn downs(&mut self, index: usize) -> usize {
        self.transitions(index)
            .iter()
            .filter(|t| t.to == State::Down)
            .count()
    }

    /// The number of transitions of each backend so far.
    fn changes(&mut self) -> Vec<usize> {
        (0..self.size).map(|i| self.transitions(i).len()).collect()
    }

    /// The number of events of a kind (`transition`, `all_down`, ...) so far.
    fn count(&mut self, kind: &str) -> usize {
        self.pull();
        self.events.iter().filter(|e| e.kind() == kind).count()
    }

    fn describe(&self) -> String {
        let lines: Vec<String> = self.events.iter().map(Notice::sentence).collect();
        lines.join("\n")
    }

    /// One event per verdict change, and none for anything else: per backend the transitions
    /// chain (each starts from where the previous one ended, from UP), the pool's count of UP
    /// backends moves by exactly one per transition, the pool empties and refills exactly when
    /// it says so, each reason fits the rules, and the last transition of each backend is its
    /// verdict now.
    fn check(&mut self, pool: &PoolRt) {
        self.pull();
        let mut state = vec![State::Up; self.size];
        let mut healthy = self.size;
        let (mut emptied, mut refilled) = (0, 0);
        for event in &self.events {
            match event {
                Notice::Transition { transition: t, .. } => {
                    assert_eq!(t.from, state[t.backend], "no change, or one missed: {t:?}");
                    assert_ne!(t.from, t.to, "{t:?}");
                    state[t.backend] = t.to;
                    healthy = match t.to {
                        State::Up => healthy + 1,
                        State::Down => healthy - 1,
                    };
                    assert_eq!(t.healthy_after, healthy, "{t:?}");
                    emptied += usize::from(t.emptied_pool());
                    refilled += usize::from(t.refilled_pool());
                    check_rules(t);
                }
                Notice::AllDown { .. } | Notice::Recovered { .. } => {}
                Notice::Override { .. }
                | Notice::Eligibility { .. }
                | Notice::Backups { .. }
                | Notice::Membership { .. }
                | Notice::Fleet { .. } => {
                    panic!("nobody overrode anything, no backup, no drain, no source, no fleet: {event:?}")
                }
                Notice::Agent { .. } => panic!("no agent checks here: {event:?}"),
                Notice::Shedding { .. } => panic!("no load shedding here: {event:?}"),
            }
        }
        assert_eq!(self.count("all_down"), emptied, "{}", self.describe());
        assert_eq!(self.count("recovered"), refilled, "{}", self.describe());
        for (i, state) in state.iter().enumerate() {
            assert_eq!(pool.verdict(i), *state, "backend #{i}: {}", self.describe());
        }
    }
}

/// The reason of any transition fits the rules: DOWN after exactly `fall` failed probes, after
/// `consecutive_errors` traffic errors (more only while the cap on ejections held it in), or
/// after one error on probation; UP after exactly `rise` passing probes or at the end of an
/// ejection.
fn check_rules(t: &Transition) {
    match (t.to, t.reason) {
        (State::Down, Reason::ProbesFailed { streak, .. }) => assert_eq!(streak, FALL, "{t}"),
        (
            State::Down,
            Reason::TrafficErrors {
                streak,
                ejection: Some(_),
                ..
            },
        ) => assert!(streak >= ERRORS, "{t}"),
        (State::Down, Reason::ProbationFailed { .. })
        | (State::Up, Reason::EjectionExpired { .. }) => {}
        (State::Up, Reason::ProbesPassed { streak, .. })
        | (State::Up, Reason::ProbesEndedEjection { streak, .. }) => {
            assert_eq!(streak, RISE, "{t}")
        }
        _ => panic!("a transition the rules do not allow: {t:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The clients.

/// What one client saw of one GET, on the balancer's clock.
#[derive(Debug)]
struct Record {
    start: Duration,
    end: Duration,
    status: Option<u16>,
    backend: Option<String>,
    /// Why the GET failed short of a whole response, if it did.
    failure: Option<String>,
}

impl Record {
    fn ok(&self) -> bool {
        self.status == Some(200) && self.failure.is_none()
    }

    fn overlaps(&self, from: Duration, to: Duration) -> bool {
        self.start <= to && self.end >= from
    }
}

/// A few keep-alive clients, each looping over GETs until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    done: Arc<Vec<AtomicU64>>,
    clients: Vec<JoinHandle<Vec<Record>>>,
}

impl Traffic {
    fn start(addr: SocketAddr, clock: Clock) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let done: Arc<Vec<AtomicU64>> = Arc::new((0..CLIENTS).map(|_| AtomicU64::new(0)).collect());
        let clients = (0..CLIENTS)
            .map(|i| {
                let (stop, done) = (stop.clone(), done.clone());
                tokio::spawn(async move {
                    let mut conn = None;
                    let mut records = Vec::new();
                    let mut pace = tokio::time::interval(PACE);
                    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    while records.len() < MAX_REQUESTS && !stop.load(Ordering::SeqCst) {
                        pace.tick().await;
                        records.push(get(&mut conn, addr, clock).await);
                        done[i].fetch_add(1, Ordering::SeqCst);
                    }
                    records
                })
            })
            .collect();
        Traffic {
            stop,
            done,
            clients,
        }
    }

    /// Waits until every client has completed `more` requests beyond what it had now.
    async fn wait_each(&self, more: u64) {
        let targets: Vec<u64> = self
            .done
            .iter()
            .map(|d| d.load(Ordering::SeqCst) + more)
            .collect();
        until("client progress", || {
            self.done
                .iter()
                .zip(&targets)
                .all(|(d, &t)| d.load(Ordering::SeqCst) >= t)
        })
        .await;
    }

    /// Stops the clients and returns what they saw.
    async fn finish(self) -> Vec<Record> {
        self.stop.store(true, Ordering::SeqCst);
        let mut records = Vec::new();
        for client in self.clients {
            records.extend(client.await.expect("a client panicked"));
        }
        records
    }
}

type Sender = http1::SendRequest<Empty<Bytes>>;

/// One GET of `/` on the client's keep-alive connection (opened again when the balancer closed
/// it). A request the connection never sent is sent again on a new one, as any client does.
async fn get(conn: &mut Option<Sender>, addr: SocketAddr, clock: Clock) -> Record {
    let start = clock.now();
    let record = |status, backend, failure: Option<String>| Record {
        start,
        end: clock.now(),
        status,
        backend,
        failure,
    };
    for _ in 0..3 {
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            *conn = match connect(addr).await {
                Ok(sender) => Some(sender),
                Err(error) => return record(None, None, Some(error)),
            };
        }
        let Some(sender) = conn.as_mut() else {
            unreachable!("connected above")
        };
        if sender.ready().await.is_err() {
            *conn = None;
            continue;
        }
        let request = http::Request::get("/")
            .header("host", "app.test")
            .body(Empty::new())
            .expect("a valid request");
        match tokio::time::timeout(DEADLINE, sender.try_send_request(request)).await {
            Err(_) => return record(None, None, Some(format!("no answer in {DEADLINE:?}"))),
            Ok(Err(mut error)) => {
                *conn = None;
                if error.take_message().is_none() {
                    return record(None, None, Some(format!("request: {}", error.error())));
                }
            }
            Ok(Ok(response)) => {
                let status = response.status().as_u16();
                let backend = response
                    .headers()
                    .get("x-backend")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let body = tokio::time::timeout(DEADLINE, response.into_body().collect()).await;
                let failure = match body {
                    Ok(Ok(_)) => None,
                    Ok(Err(error)) => Some(format!("body: {error}")),
                    Err(_) => Some(format!("no whole body in {DEADLINE:?}")),
                };
                return record(Some(status), backend, failure);
            }
        }
    }
    record(
        None,
        None,
        Some("no connection would take the request".into()),
    )
}

async fn connect(addr: SocketAddr) -> Result<Sender, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

// ---------------------------------------------------------------------------------------------
// Backends and the balancer.

/// One listener on a free port and one pool `web` over `backends`, with fast checks.
fn config_text(backends: &[(String, SocketAddr)], knobs: Knobs) -> String {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let checks = format!(
        r#"
[pools.web.active]
interval = "30ms"
timeout = "150ms"
jitter = "10%"
rise = {RISE}
fall = {FALL}

[pools.web.passive]
consecutive_errors = {ERRORS}
ejection_time = "{ejection}"
max_ejection_time = "{max_ejection}"
max_ejected_percent = {percent}

[pools.web.retries]
attempts = {attempts}
min_budget = {min_budget}

[pools.web.timeouts]
connect = "150ms"
response_header = "150ms"
"#,
        ejection = ms(knobs.ejection),
        max_ejection = ms(knobs.ejection * 2),
        percent = knobs.max_ejected_percent,
        attempts = knobs.attempts,
        min_budget = knobs.min_budget,
    );
    ConfigText::new(backends).extra(&checks).build()
}

async fn start(text: &str) -> (Balancer, Arc<PoolRt>, Ledger) {
    let config = config::parse_str(text, "<faults>").expect("valid test config");
    let size = config.pools[0].backends.len();
    let (events, rx) = broadcast::channel(4096);
    let balancer = Balancer::start(&config, events)
        .await
        .expect("balancer starts");
    let pool = balancer.pool("web").expect("pool web");
    let ledger = Ledger {
        rx,
        events: Vec::new(),
        size,
    };
    (balancer, pool, ledger)
}

/// A backend that answers `/healthz` with 200 and, while `truncate` is set, answers traffic
/// with the headers and part of a sized body, then resets the connection (`SO_LINGER` 0): the
/// one fault [`SimBackend`] cannot script. Otherwise it answers 200 whole. Dropping it closes
/// the listener and every connection.
struct Truncator {
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
    truncate: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl Truncator {
    async fn start(name: &'static str) -> Truncator {
        let listener = TcpListener::bind(any()).await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let hits = Arc::new(AtomicU64::new(0));
        let truncate = Arc::new(AtomicBool::new(false));
        let (h, t) = (hits.clone(), truncate.clone());
        let accept = tokio::spawn(async move {
            // Owned by this task, so aborting it ends every connection too.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        if let Ok((stream, _)) = accepted {
                            connections.spawn(truncator_connection(stream, name, h.clone(), t.clone()));
                        }
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Truncator {
            addr,
            hits,
            truncate,
            accept,
        }
    }
}

impl Drop for Truncator {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn truncator_connection(
    mut stream: TcpStream,
    name: &str,
    hits: Arc<AtomicU64>,
    truncate: Arc<AtomicBool>,
) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        // GETs only: a request is its head.
        let end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head: Vec<u8> = buf.drain(..end).collect();
        let health = head.starts_with(b"GET /healthz ");
        if health {
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
            if stream.write_all(answer).await.is_err() {
                return;
            }
            continue;
        }
        hits.fetch_add(1, Ordering::SeqCst);
        if truncate.load(Ordering::SeqCst) {
            let part = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: 64\r\nX-Backend: {name}\r\n\r\n{}",
                "x".repeat(16)
            );
            let _ = stream.write_all(part.as_bytes()).await;
            let _ = stream.set_zero_linger();
            return;
        }
        let whole = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Backend: {name}\r\n\r\n{name}\n",
            name.len() + 1
        );
        if stream.write_all(whole.as_bytes()).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One scenario at a time, with its leaks and panics counted.

/// Scenarios hold this while they run; see the module documentation.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Panics anywhere in the process, counted by a hook installed once.
static PANICS: AtomicUsize = AtomicUsize::new(0);
static PANIC_HOOK: Once = Once::new();

/// Runs `scenario` alone, on a fresh two-worker runtime, and fails if a task panicked during it
/// or if, once it has dropped everything, more file descriptors are open or more tasks alive
/// than before it started.
fn run<F, Fut>(scenario: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    PANIC_HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let panics = PANICS.load(Ordering::SeqCst);
        let metrics = tokio::runtime::Handle::current().metrics();
        let (fds, tasks) = (open_fds(), metrics.num_alive_tasks());
        scenario().await;
        let end = Instant::now() + DEADLINE;
        loop {
            let (fds_now, tasks_now) = (open_fds(), metrics.num_alive_tasks());
            if fds_now <= fds + FD_SLACK && tasks_now <= tasks {
                break;
            }
            assert!(
                Instant::now() < end,
                "leaked: {fds_now} file descriptors open (were {fds}), {tasks_now} tasks alive \
                 (were {tasks}); open: {:?}",
                fd_targets()
            );
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(
            PANICS.load(Ordering::SeqCst),
            panics,
            "something panicked during the scenario"
        );
    });
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

fn fd_targets() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .map(|e| match std::fs::read_link(e.path()) {
            Ok(target) => format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            ),
            Err(_) => e.file_name().to_string_lossy().into_owned(),
        })
        .collect()
}
