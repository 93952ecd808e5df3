//! Tests of the pure parts (debouncing scripts, the alert JSON, backoff, command variables)
//! and of the dispatcher's timers on paused tokio time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use capataz_health::{Outcome, Reason, State, Transition};

use super::command::command_env;
use super::debounce::state;
use super::webhook::{retry_delay, MAX_BACKOFF};
use super::*;

fn transition(backend: &str, to: State) -> Notice {
    let from = match to {
        State::Up => State::Down,
        State::Down => State::Up,
    };
    Notice::Transition {
        pool: "web".into(),
        backend: backend.into(),
        transition: Transition {
            backend: 0,
            from,
            to,
            reason: Reason::ProbesFailed {
                streak: 3,
                last: Outcome::Timeout,
                mismatch: None,
            },
            at: Duration::ZERO,
            healthy_after: 1,
        },
        time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_500),
    }
}

/// Plays `script` through a debouncer with a 300 ms window and compares what it alerts
/// with `expected`.
///
/// Script lines are `<ms> <backend> UP|DOWN` (a transition), `<ms> pool down|up` (all down
/// or recovered), or `<ms> flush`. Output lines are `<ms> <backend or pool> <state>`, with
/// ` +N` for a summary that folded N events.
fn check(script: &str, expected: &str) {
    let start = Instant::now();
    let mut debouncer = Debouncer::new(Duration::from_millis(300));
    let mut out = Vec::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let ms: u64 = words[0].parse().unwrap();
        let now = start + Duration::from_millis(ms);
        let alerts = match words[1..] {
            ["flush"] => debouncer.flush_due(now),
            ["pool", what] => {
                let event = match what {
                    "down" => Notice::AllDown {
                        pool: "web".into(),
                        policy: capataz_health::AllDown::Reject,
                        time: SystemTime::UNIX_EPOCH,
                    },
                    _ => Notice::Recovered {
                        pool: "web".into(),
                        time: SystemTime::UNIX_EPOCH,
                    },
                };
                debouncer.offer(event, now).into_iter().collect()
            }
            [backend, to] => {
                let to = if to == "UP" { State::Up } else { State::Down };
                debouncer
                    .offer(transition(backend, to), now)
                    .into_iter()
                    .collect()
            }
            _ => panic!("bad script line {line:?}"),
        };
        for alert in alerts {
            let who = alert.event.backend().unwrap_or("pool");
            let mut text = format!("{ms} {who} {}", state(&alert.event));
            if alert.suppressed > 0 {
                text.push_str(&format!(" +{}", alert.suppressed));
            }
            out.push(text);
        }
    }
    let expected: Vec<&str> = expected
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(out, expected, "script:\n{script}");
}

#[test]
fn a_lone_event_alerts_at_once_and_the_window_closes_quietly() {
    check(
        "0 b1 DOWN
         300 flush
         301 b1 UP",
        "0 b1 DOWN
         301 b1 UP",
    );
}

#[test]
fn a_flapping_backend_gets_one_alert_and_one_summary_per_window() {
    check(
        "0 b1 DOWN
         10 b1 UP
         20 b1 DOWN
         30 b1 UP
         40 b1 DOWN
         50 b1 UP
         60 b1 DOWN
         70 b1 UP
         80 b1 DOWN
         90 b1 UP
         299 flush
         300 flush",
        "0 b1 DOWN
         300 b1 UP +9",
    );
}

#[test]
fn no_summary_when_the_window_ends_where_it_started() {
    check(
        "0 b1 DOWN
         10 b1 UP
         20 b1 DOWN
         300 flush
         310 b1 UP",
        "0 b1 DOWN
         310 b1 UP",
    );
}

#[test]
fn a_summary_opens_a_new_window() {
    check(
        "0 b1 DOWN
         10 b1 UP
         300 flush
         350 b1 DOWN
         400 flush
         600 flush
         601 b1 UP
         900 flush
         1200 flush
         1201 b1 DOWN",
        "0 b1 DOWN
         300 b1 UP +1
         600 b1 DOWN +1
         900 b1 UP +1
         1201 b1 DOWN",
    );
}

#[test]
fn keys_are_independent_and_pool_events_have_their_own() {
    check(
        "0 b1 DOWN
         5 b2 DOWN
         6 pool down
         7 b1 UP
         8 pool up
         300 flush
         306 flush",
        "0 b1 DOWN
         5 b2 DOWN
         6 pool all_down
         300 b1 UP +1
         306 pool recovered +1",
    );
}

#[test]
fn an_ended_window_stays_open_until_flushed() {
    check(
        "0 b1 DOWN
         400 b1 UP
         400 flush",
        "0 b1 DOWN
         400 b1 UP +1",
    );
}

#[test]
fn next_deadline_is_the_earliest_open_window() {
    let start = Instant::now();
    let ms = |n| start + Duration::from_millis(n);
    let mut debouncer = Debouncer::new(Duration::from_millis(300));
    assert_eq!(debouncer.next_deadline(), None);
    debouncer.offer(transition("b1", State::Down), ms(0));
    debouncer.offer(transition("b2", State::Down), ms(100));
    assert_eq!(debouncer.next_deadline(), Some(ms(300)));
    assert!(debouncer.flush_due(ms(300)).is_empty());
    assert_eq!(debouncer.next_deadline(), Some(ms(400)));
    assert!(debouncer.flush_due(ms(400)).is_empty());
    assert_eq!(debouncer.next_deadline(), None);
}

#[test]
fn alert_json_carries_suppressed_only_when_some_were() {
    let mut alert = Alert::new(transition("b1", State::Down));
    assert!(alert.to_json().get("suppressed").is_none());
    alert.suppressed = 4;
    assert_eq!(alert.to_json()["suppressed"], 4);
    assert_eq!(alert.to_json()["backend"], "b1");
}

#[test]
fn retry_delay_doubles_up_to_the_cap() {
    let ms = Duration::from_millis;
    assert_eq!(retry_delay(ms(500), 1), ms(500));
    assert_eq!(retry_delay(ms(500), 2), ms(1_000));
    assert_eq!(retry_delay(ms(500), 4), ms(4_000));
    assert_eq!(retry_delay(ms(500), 10), MAX_BACKOFF);
    assert_eq!(retry_delay(ms(500), u32::MAX), MAX_BACKOFF);
    assert_eq!(retry_delay(ms(60_000), 3), ms(60_000));
}

#[test]
fn command_env_names_every_field_and_leaves_missing_ones_empty() {
    let env: BTreeMap<_, _> = command_env(&Alert {
        event: transition("b1", State::Down),
        suppressed: 2,
    })
    .into_iter()
    .collect();
    assert_eq!(env["CAPATAZ_EVENT"], "transition");
    assert_eq!(env["CAPATAZ_POOL"], "web");
    assert_eq!(env["CAPATAZ_BACKEND"], "b1");
    assert_eq!(env["CAPATAZ_FROM"], "UP");
    assert_eq!(env["CAPATAZ_TO"], "DOWN");
    assert_eq!(
        env["CAPATAZ_REASON"],
        "3 consecutive failed probes, last: TIMEOUT"
    );
    assert_eq!(env["CAPATAZ_TIME"], "1970-01-01T00:00:01.500Z");
    assert_eq!(env["CAPATAZ_SUPPRESSED"], "2");
    let json: serde_json::Value = serde_json::from_str(&env["CAPATAZ_JSON"]).unwrap();
    assert_eq!(json["suppressed"], 2);

    let env: BTreeMap<_, _> = command_env(&Alert::new(Notice::Recovered {
        pool: "web".into(),
        time: SystemTime::UNIX_EPOCH,
    }))
    .into_iter()
    .collect();
    assert_eq!(env["CAPATAZ_EVENT"], "recovered");
    assert_eq!(env["CAPATAZ_BACKEND"], "");
    assert_eq!(env["CAPATAZ_FROM"], "");
    assert_eq!(env["CAPATAZ_REASON"], "");
}

// ---- The dispatcher on paused tokio time ----------------------------------------------------

/// A dispatcher debouncing with a 10 s window into one webhook queue, the sender of its
/// events, its counters, and the queue's receiving end.
fn dispatcher() -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::broadcast::Sender<Notice>,
    Arc<AlertStats>,
    tokio::sync::mpsc::Receiver<Arc<Alert>>,
) {
    let stats = Arc::new(AlertStats::default());
    let (queue, alerts) = tokio::sync::mpsc::channel(64);
    let dispatcher = dispatch::Dispatcher {
        outlets: vec![dispatch::Outlet {
            kind: Kind::Webhook,
            queue,
        }],
        debouncer: Some(Debouncer::new(Duration::from_secs(10))),
        stats: stats.clone(),
    };
    let (events, rx) = tokio::sync::broadcast::channel(64);
    let task = tokio::spawn(dispatcher.run(rx));
    (task, events, stats, alerts)
}

/// Asserts that `at` (time since the test started) is `expected`, give or take the timer
/// wheel's millisecond.
fn assert_at(at: Duration, expected: Duration) {
    assert!(
        at >= expected && at <= expected + Duration::from_millis(2),
        "at {at:?}, expected {expected:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_dispatcher_alerts_at_once_and_sends_the_summary_when_the_window_ends() {
    let (task, events, stats, mut alerts) = dispatcher();
    let start = tokio::time::Instant::now();
    for i in 0..10 {
        let to = if i % 2 == 0 { State::Down } else { State::Up };
        events.send(transition("b1", to)).unwrap();
    }

    let first = alerts.recv().await.expect("the first alert");
    assert_eq!(state(&first.event), "DOWN");
    assert_eq!(first.suppressed, 0);
    assert_at(start.elapsed(), Duration::ZERO);

    let summary = alerts.recv().await.expect("the summary");
    assert_eq!(state(&summary.event), "UP");
    assert_eq!(summary.suppressed, 9);
    assert_at(start.elapsed(), Duration::from_secs(10));
    assert_eq!(stats.webhook.suppressed(), 9);
    assert_eq!(stats.webhook.dropped(), 0);

    // The summary opened a new window; nothing changes in it, so it closes quietly and the
    // dispatcher, its sender gone, ends when it does.
    drop(events);
    task.await.unwrap();
    assert_at(start.elapsed(), Duration::from_secs(20));
    assert!(alerts.recv().await.is_none(), "no alert after the summary");
}

#[tokio::test(start_paused = true)]
async fn a_pending_summary_still_goes_out_after_the_sender_closes() {
    let (task, events, _stats, mut alerts) = dispatcher();
    let start = tokio::time::Instant::now();
    events.send(transition("b1", State::Down)).unwrap();
    events.send(transition("b1", State::Up)).unwrap();
    drop(events);

    assert_eq!(state(&alerts.recv().await.unwrap().event), "DOWN");
    let summary = alerts
        .recv()
        .await
        .expect("the summary, though the sender closed");
    assert_eq!((state(&summary.event), summary.suppressed), ("UP", 1));
    assert_at(start.elapsed(), Duration::from_secs(10));
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_debouncing_the_dispatcher_never_waits_on_a_timer() {
    let stats = Arc::new(AlertStats::default());
    let (queue, mut alerts) = tokio::sync::mpsc::channel(64);
    let dispatcher = dispatch::Dispatcher {
        outlets: vec![dispatch::Outlet {
            kind: Kind::Command,
            queue,
        }],
        debouncer: None,
        stats,
    };
    let (events, rx) = tokio::sync::broadcast::channel(64);
    let task = tokio::spawn(dispatcher.run(rx));
    let start = tokio::time::Instant::now();
    for i in 0..4 {
        let to = if i % 2 == 0 { State::Down } else { State::Up };
        events.send(transition("b1", to)).unwrap();
    }
    drop(events);
    task.await.unwrap();
    let mut seen = Vec::new();
    while let Some(alert) = alerts.recv().await {
        seen.push(state(&alert.event));
    }
    assert_eq!(seen, ["DOWN", "UP", "DOWN", "UP"]);
    assert_eq!(start.elapsed(), Duration::ZERO);
}
