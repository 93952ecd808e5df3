//! The replay protocol's time and latency commands: `AT` sets the clock, `TRAFFIC`
//! carries a latency, `SHED` a request for relief; the detectors' windows end on the clock at
//! every multiple of their length, and explained changes carry their time once `AT` is used.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::replay::answer;
use capataz_health::{
    EjectionPolicy, LatencyOutliers, LoadShedding, Outcome, Percentile, Replay, ReplayOptions,
    Settings, SuccessRate,
};

const SECOND: Duration = Duration::from_secs(1);

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// The balancer's timed ejection (30 s, up to 300 s) with a latency-outlier detector of
/// `factor` over 3 windows of 20 requests.
fn latency(factor: u32) -> Settings {
    Settings {
        ejection: Some(EjectionPolicy {
            base: 30 * SECOND,
            max: 300 * SECOND,
        }),
        max_ejected_percent: 50,
        latency_outliers: Some(LatencyOutliers {
            percentile: Percentile::P99,
            factor: nz(factor),
            windows: nz(3),
            min_requests: 20,
            min_latency: Duration::from_millis(5),
        }),
        ..Settings::default()
    }
}

/// Runs `script` and returns (stdout, explain).
fn run(replay: &mut Replay, script: &str) -> (String, String) {
    let (mut out, mut explain) = (Vec::new(), Vec::new());
    for line in script.lines() {
        replay.run_line(line.as_bytes(), &mut out, Some(&mut explain));
    }
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(explain).unwrap(),
    )
}

/// A log of `seconds` seconds: every 250 ms, one request to each of a, b, c (10 ms) and d
/// (`slow_ms`), then `STATUS`.
fn slow_log(seconds: u64, slow_ms: &str) -> String {
    let mut script = String::from("AT 0\nPOOL a b c d\n");
    for step in 1..=seconds * 4 {
        script.push_str(&format!("AT {}\n", step * 250));
        for b in ["a", "b", "c"] {
            script.push_str(&format!("TRAFFIC {b} 10 HTTP/1.1 200 OK\n"));
        }
        script.push_str(&format!("TRAFFIC d {slow_ms} HTTP/1.1 200 OK\n"));
    }
    script.push_str("STATUS\n");
    script
}

#[test]
fn a_slow_backend_in_a_timed_log_is_ejected_at_the_end_of_its_third_window() {
    let mut replay = Replay::new(latency(3));
    let (out, explain) = run(&mut replay, &slow_log(40, "100.5"));
    assert!(out.ends_with("a UP\nb UP\nc UP\nd DOWN\n"), "{out}");
    // Windows end at 10 s, 20 s, 30 s: the third slow one ejects, at its end.
    assert_eq!(
        explain,
        "@30000 d UP -> DOWN: p99 106 ms against a pool median of 9 ms over the last 3 \
         windows; ejected for 30 s (ejection #1)\n"
    );
}

#[test]
fn the_same_log_under_a_looser_factor_ejects_nobody() {
    let mut replay = Replay::new(latency(20));
    let (out, explain) = run(&mut replay, &slow_log(40, "100.5"));
    assert!(out.ends_with("a UP\nb UP\nc UP\nd UP\n"), "{out}");
    assert_eq!(explain, "");
}

#[test]
fn an_ejection_ends_at_its_own_time_when_the_clock_jumps_past_it() {
    let mut replay = Replay::new(latency(3));
    let mut script = slow_log(30, "100");
    script.push_str("AT 100000\nSTATUS\n");
    let (out, explain) = run(&mut replay, &script);
    assert!(out.ends_with("OK\na UP\nb UP\nc UP\nd UP\n"), "{out}");
    let last = explain.lines().last().unwrap();
    assert_eq!(
        last,
        "@60000 d DOWN -> UP: ejection #1 (30 s) is over, back on probation"
    );
}

#[test]
fn latencies_without_a_detector_and_untimed_scripts_change_nothing() {
    // No detector: TRAFFIC is OBSERVE, whatever the latency.
    let mut replay = Replay::new(Settings::default());
    let (out, explain) = run(&mut replay, &slow_log(40, "1000"));
    assert!(out.ends_with("d UP\n"), "{out}");
    assert_eq!(explain, "");
    // Without AT, explained changes carry no time, as before.
    let mut replay = Replay::new(Settings::default());
    let (_, explain) = run(
        &mut replay,
        "POOL a\nTRAFFIC a - TIMEOUT\nTRAFFIC a 3 HTTP/1.1 502\nOBSERVE a RESET\n",
    );
    assert_eq!(
        explain,
        "a UP -> DOWN: 3 consecutive traffic errors, last: RESET\n"
    );
}

#[test]
fn at_never_goes_back_and_bad_lines_say_err() {
    let mut replay = Replay::new(latency(3));
    let (out, _) = run(
        &mut replay,
        "AT 5000\nPOOL a\nAT 4999\nAT 5000\nAT x\nAT\n\
         TRAFFIC a\nTRAFFIC a 10\nTRAFFIC a 1.2345 HTTP/1.1 200\nTRAFFIC a 1e3 HTTP/1.1 200\n\
         TRAFFIC z 1 HTTP/1.1 200\nTRAFFIC a .5 HTTP/1.1 200\nTRAFFIC a 1.5 HTTP/1.1 200\n\
         SHED a 1 429\nSHED a 1 99 10\nSHED a 1 600 10\nSHED a x 429 10\nSHED a - 429 10\n",
    );
    let lines: Vec<&str> = out.lines().collect();
    let expected = [
        "OK", "OK", "ERR", "OK", "ERR", "ERR", "ERR", "ERR", "ERR", "ERR", "ERR", "ERR", "OK",
        "ERR", "ERR", "ERR", "ERR", "OK",
    ];
    assert_eq!(lines.len(), expected.len(), "{out}");
    for (line, want) in lines.iter().zip(expected) {
        assert!(line.starts_with(want), "{line:?} is not {want}: {out}");
    }
}

#[test]
fn shed_lines_reduce_weight_with_load_shedding_and_are_judged_without() {
    let options = ReplayOptions {
        load_shedding: Some(LoadShedding {
            weight_percent: 10,
            max: 300 * SECOND,
            default_relief: 5 * SECOND,
        }),
        ..ReplayOptions::default()
    };
    let mut replay = Replay::with_options(Settings::default(), options);
    let (out, explain) = run(
        &mut replay,
        "POOL a b\nSHED a 2 503 5000\nSHED a 2 503 5000\nSHED a 2 503 5000\nSTATUS\n",
    );
    assert_eq!(out, "OK\nSHED\nSHED\nSHED\na UP\nb UP\n");
    assert_eq!(explain, "");
    // Without it, a 503 is a traffic error like any other.
    let mut replay = Replay::new(Settings::default());
    let (out, _) = run(
        &mut replay,
        "POOL a b\nSHED a 2 503 5000\nSHED a 2 503 5000\nSHED a 2 503 5000\nSTATUS\n",
    );
    assert_eq!(out, "OK\nERROR\nERROR\nERROR\na DOWN\nb UP\n");
}

#[test]
fn the_success_rate_window_catches_intermittent_errors() {
    let settings = Settings {
        ejection: Some(EjectionPolicy {
            base: 30 * SECOND,
            max: 300 * SECOND,
        }),
        max_ejected_percent: 50,
        success_rate: Some(SuccessRate {
            min_requests: 20,
            min_backends: 3,
            stdev_factor_milli: 1900,
        }),
        ..Settings::default()
    };
    let options = ReplayOptions {
        success_window: 5 * SECOND,
        ..ReplayOptions::default()
    };
    let mut script = String::from("AT 0\nPOOL a b c d e\n");
    for step in 1..=40u64 {
        script.push_str(&format!("AT {}\n", step * 100));
        for b in ["a", "b", "c", "d"] {
            script.push_str(&format!("OBSERVE {b} HTTP/1.1 200\n"));
        }
        // One error in five: never three in a row.
        let answer = if step % 5 == 0 { "500" } else { "200" };
        script.push_str(&format!("TRAFFIC e 3 HTTP/1.1 {answer}\n"));
    }
    script.push_str("AT 5000\nSTATUS\n");
    let mut replay = Replay::with_options(settings, options);
    let (out, explain) = run(&mut replay, &script);
    assert!(out.ends_with("e DOWN\n"), "{out}");
    assert!(
        explain.starts_with("@5000 e UP -> DOWN: success rate 80.0 % against a pool mean of"),
        "{explain}"
    );
}

#[test]
fn a_jump_of_a_lifetime_takes_a_few_steps() {
    let mut settings = latency(3);
    settings.success_rate = Some(SuccessRate {
        min_requests: 1,
        min_backends: 2,
        stdev_factor_milli: 1900,
    });
    let options = ReplayOptions {
        latency_window: Duration::from_millis(1),
        success_window: Duration::from_millis(1),
        load_shedding: None,
    };
    let mut replay = Replay::with_options(settings, options);
    let (out, _) = run(
        &mut replay,
        &format!(
            "AT 0\nPOOL a b\nTRAFFIC a 1 HTTP/1.1 200\nAT {}\nWAIT {}\nSTATUS\n",
            u64::MAX / 2,
            u64::MAX
        ),
    );
    assert_eq!(out, "OK\nOK\nOK\nOK\nOK\na UP\nb UP\n");
}

#[test]
fn a_written_answer_reads_back_as_the_same_outcome() {
    let mut outcomes = vec![
        Outcome::Timeout,
        Outcome::Refused,
        Outcome::Reset,
        Outcome::Tls,
        Outcome::Connected,
        Outcome::Malformed,
    ];
    outcomes.extend((100..=599).map(Outcome::Status));
    outcomes.extend((0..=255).map(Outcome::Grpc));
    for outcome in outcomes {
        assert_eq!(Outcome::parse(answer(outcome).as_bytes()), outcome);
    }
}
