//! The seed documents' tables, replayed through the line protocol.
//!
//! Every test is a script for [`Replay::run_line`] and the lines it must print, run by one
//! helper, [`check`]. An expected line that is exactly `ERR` matches any line starting with
//! `ERR` (the reason after it is free text). Seed 000 is the active side (streaks, not totals),
//! seed 001 the passive side and the AND rule, seed 004 the thresholds and flapping; the last
//! group pins the protocol's own rules (errors change nothing, `\r`, comments).

use std::num::NonZeroU32;

use capataz_health::{Replay, Settings};

/// Runs `script` line by line in a fresh session with `settings` and compares what it prints
/// with `expected`, line by line. Returns the session so a test can look further.
///
/// Leading spaces and tabs of each script line are dropped, so scripts can be indented like the
/// code around them; everything else (trailing spaces, `\r`) reaches the engine as written.
fn check(settings: Settings, script: &str, expected: &str) -> Replay {
    let mut replay = Replay::new(settings);
    let mut out = Vec::new();
    for line in script.split_inclusive('\n') {
        let line = line.trim_start_matches([' ', '\t']);
        replay.run_line(line.as_bytes(), &mut out, None);
    }
    let out = String::from_utf8(out).expect("the replay prints UTF-8 for UTF-8 input");
    let actual: Vec<&str> = out.lines().collect();
    let wanted: Vec<&str> = expected.lines().map(str::trim).collect();
    let matches = actual.len() == wanted.len()
        && actual
            .iter()
            .zip(&wanted)
            .all(|(a, w)| a == w || (*w == "ERR" && a.starts_with("ERR")));
    assert!(
        matches,
        "script:\n{script}\nexpected:\n{}\nactual:\n{}",
        wanted.join("\n"),
        actual.join("\n"),
    );
    replay
}

/// The protocol's defaults: rise 2, fall 3, consecutive errors 3.
fn defaults() -> Settings {
    Settings::default()
}

fn thresholds(rise: u32, fall: u32) -> Settings {
    Settings {
        rise: NonZeroU32::new(rise).unwrap(),
        fall: NonZeroU32::new(fall).unwrap(),
        ..Settings::default()
    }
}

/// A script and its expected output for one backend `app-1` probed along `timeline` (true is a
/// 200, false a timeout), with `HEALTHY` after every probe, plus the in-pool trace (`O`/`x`).
fn timeline_script(timeline: &[bool], in_pool: &[bool]) -> (String, String) {
    let mut script = String::from("POOL app-1\n");
    let mut expected = String::from("OK\n");
    for (&healthy, &in_pool) in timeline.iter().zip(in_pool) {
        if healthy {
            script.push_str("PROBE app-1 HTTP/1.1 200 OK\n");
            expected.push_str("PASS\n");
        } else {
            script.push_str("PROBE app-1 TIMEOUT\n");
            expected.push_str("FAIL\n");
        }
        script.push_str("HEALTHY\n");
        expected.push_str(if in_pool { "app-1\n" } else { "none\n" });
    }
    (script, expected)
}

fn trace(text: &str) -> Vec<bool> {
    text.split(' ')
        .map(|word| match word {
            "OK" | "SI" | "O" => true,
            "FAIL" | "NO" | "x" => false,
            other => panic!("not a trace word: {other:?}"),
        })
        .collect()
}

// Seed 000: active health checks.

#[test]
fn seed_000_streak_table_fail_fail_pass_fail_fail_stays_up() {
    check(
        defaults(),
        "POOL a
         PROBE a TIMEOUT
         STATUS
         PROBE a REFUSED
         STATUS
         PROBE a HTTP/1.1 200 OK
         STATUS
         PROBE a HTTP/1.1 503 Service Unavailable
         STATUS
         PROBE a HTTP/1.1 404 Not Found
         STATUS
         HEALTHY",
        "OK
         FAIL
         a UP
         FAIL
         a UP
         PASS
         a UP
         FAIL
         a UP
         FAIL
         a UP
         a",
    );
}

#[test]
fn seed_000_two_failures_is_not_down() {
    check(
        defaults(),
        "POOL a b
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         STATUS
         HEALTHY
         PROBE a TIMEOUT
         STATUS
         HEALTHY",
        "OK
         FAIL
         FAIL
         a UP
         b UP
         a,b
         FAIL
         a DOWN
         b UP
         b",
    );
}

#[test]
fn seed_000_after_down_pass_fail_pass_stays_down() {
    check(
        defaults(),
        "POOL a
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         PROBE a HTTP/1.1 200 OK
         PROBE a REFUSED
         PROBE a HTTP/1.1 200 OK
         STATUS
         PROBE a HTTP/1.1 204 No Content
         STATUS",
        "OK
         FAIL
         FAIL
         FAIL
         PASS
         FAIL
         PASS
         a DOWN
         PASS
         a UP",
    );
}

#[test]
fn seed_000_probe_classification() {
    // The code comes from its own field; 4xx fails a probe; no reason phrase is legal.
    check(
        defaults(),
        "POOL a
         PROBE a HTTP/1.1 200 OK
         PROBE a HTTP/1.1 200
         PROBE a HTTP/1.0 301 Moved Permanently
         PROBE a HTTP/1.1 503 Backend 200 ms slow
         PROBE a HTTP/1.1 404 Not Found
         PROBE a HTTP/1.1 400 Bad Request
         PROBE a HTTP/1.1 100 Continue
         PROBE a HTTP/2 200
         PROBE a HTTP/1.1 200OK
         PROBE a garbage
         PROBE a RESET",
        "OK
         PASS
         PASS
         PASS
         FAIL
         FAIL
         FAIL
         FAIL
         FAIL
         FAIL
         FAIL
         FAIL",
    );
}

#[test]
fn seed_000_probes_per_backend_and_pool_order() {
    check(
        defaults(),
        "POOL web1 web2 web3
         PROBE web2 TIMEOUT
         PROBE web1 TIMEOUT
         PROBE web2 TIMEOUT
         PROBE web3 TIMEOUT
         PROBE web2 TIMEOUT
         STATUS
         HEALTHY",
        "OK
         FAIL
         FAIL
         FAIL
         FAIL
         FAIL
         web1 UP
         web2 DOWN
         web3 UP
         web1,web3",
    );
}

// Seed 001: passive health checks and the AND rule.

#[test]
fn seed_001_observe_table() {
    check(
        defaults(),
        "POOL a
         OBSERVE a HTTP/1.1 500 Internal Server Error
         STATUS
         OBSERVE a HTTP/1.1 503 Service Unavailable
         STATUS
         OBSERVE a HTTP/1.1 200 OK
         STATUS
         OBSERVE a HTTP/1.1 502 Bad Gateway
         STATUS
         OBSERVE a HTTP/1.1 502 Bad Gateway
         STATUS
         OBSERVE a HTTP/1.1 500 Internal Server Error
         STATUS
         OBSERVE a HTTP/1.1 301 Moved Permanently
         STATUS",
        "OK
         ERROR
         a UP
         ERROR
         a UP
         OK
         a UP
         ERROR
         a UP
         ERROR
         a UP
         ERROR
         a DOWN
         OK
         a UP",
    );
}

#[test]
fn seed_001_4xx_never_count() {
    check(
        defaults(),
        "POOL a
         OBSERVE a HTTP/1.1 404 Not Found
         OBSERVE a HTTP/1.1 401 Unauthorized
         OBSERVE a HTTP/1.1 403 Forbidden
         OBSERVE a HTTP/1.1 404 Not Found
         OBSERVE a HTTP/1.1 499 Client Closed Request
         OBSERVE a HTTP/1.1 404 Backend 500 errors
         STATUS",
        "OK
         OK
         OK
         OK
         OK
         OK
         OK
         a UP",
    );
}

#[test]
fn seed_001_500_500_200_500_500_never_reaches_three() {
    check(
        defaults(),
        "POOL a
         OBSERVE a HTTP/1.1 500 Internal Server Error
         OBSERVE a HTTP/1.1 500 Internal Server Error
         OBSERVE a HTTP/1.1 200 OK
         OBSERVE a HTTP/1.1 500 Internal Server Error
         OBSERVE a HTTP/1.1 500 Internal Server Error
         STATUS
         HEALTHY",
        "OK
         ERROR
         ERROR
         OK
         ERROR
         ERROR
         a UP
         a",
    );
}

#[test]
fn seed_001_resets_refusals_timeouts_and_malformed_lines_are_errors() {
    check(
        defaults(),
        "POOL a b
         OBSERVE a RESET
         OBSERVE a REFUSED
         OBSERVE a TIMEOUT
         OBSERVE b HTTP/1.1 599 x
         OBSERVE b garbage
         OBSERVE b HTTP/1.1 600 High
         STATUS",
        "OK
         ERROR
         ERROR
         ERROR
         ERROR
         ERROR
         ERROR
         a DOWN
         b DOWN",
    );
}

#[test]
fn seed_001_failed_probes_do_not_touch_the_passive_streak() {
    // Two traffic errors, then probes of every kind, then one more error: the third in a row.
    check(
        defaults(),
        "POOL a
         OBSERVE a HTTP/1.1 500 Internal Server Error
         OBSERVE a HTTP/1.1 500 Internal Server Error
         PROBE a TIMEOUT
         PROBE a HTTP/1.1 200 OK
         OBSERVE a HTTP/1.1 502 Bad Gateway
         STATUS",
        "OK
         ERROR
         ERROR
         FAIL
         PASS
         ERROR
         a DOWN",
    );
}

#[test]
fn seed_001_traffic_does_not_touch_the_probe_streaks() {
    // Good traffic between failed probes does not break the failure run; a bad response does
    // not break a pass run either.
    check(
        defaults(),
        "POOL a
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         OBSERVE a HTTP/1.1 200 OK
         PROBE a TIMEOUT
         STATUS
         PROBE a HTTP/1.1 200 OK
         OBSERVE a HTTP/1.1 500 Internal Server Error
         PROBE a HTTP/1.1 200 OK
         STATUS",
        "OK
         FAIL
         FAIL
         OK
         FAIL
         a DOWN
         PASS
         ERROR
         PASS
         a UP",
    );
}

#[test]
fn seed_001_clean_passive_record_is_still_down_while_active_is_down() {
    check(
        defaults(),
        "POOL a b
         OBSERVE b HTTP/1.1 404 Not Found
         OBSERVE b HTTP/1.1 401 Unauthorized
         OBSERVE b HTTP/1.1 403 Forbidden
         PROBE b TIMEOUT
         PROBE b TIMEOUT
         PROBE b TIMEOUT
         OBSERVE b HTTP/1.1 200 OK
         STATUS
         HEALTHY",
        "OK
         OK
         OK
         OK
         FAIL
         FAIL
         FAIL
         OK
         a UP
         b DOWN
         a",
    );
}

#[test]
fn seed_001_ejected_backend_stays_down_while_probes_pass() {
    // The AND rule from the other side: a perfect probe record does not override ejection.
    check(
        defaults(),
        "POOL a
         OBSERVE a TIMEOUT
         OBSERVE a TIMEOUT
         OBSERVE a TIMEOUT
         PROBE a HTTP/1.1 200 OK
         PROBE a HTTP/1.1 200 OK
         PROBE a HTTP/1.1 200 OK
         STATUS
         OBSERVE a HTTP/1.1 404 Not Found
         STATUS",
        "OK
         ERROR
         ERROR
         ERROR
         PASS
         PASS
         PASS
         a DOWN
         OK
         a UP",
    );
}

// Seed 004: thresholds and flapping.

#[test]
fn seed_004_scenario_1_outage_and_recovery_rise_2_fall_3() {
    let timeline = trace("OK OK FAIL FAIL FAIL FAIL FAIL OK OK OK");
    let in_pool = trace("SI SI SI SI NO NO NO NO SI SI");
    let (script, expected) = timeline_script(&timeline, &in_pool);
    let replay = check(thresholds(2, 3), &script, &expected);
    assert_eq!(replay.transitions(), 2);
}

#[test]
fn seed_004_scenario_2_flapping_fall_1_changes_six_times() {
    let flaky = trace("OK FAIL OK FAIL OK FAIL FAIL FAIL FAIL OK");
    let in_pool = trace("O x O x O x x x x O");
    let (script, expected) = timeline_script(&flaky, &in_pool);
    let replay = check(thresholds(1, 1), &script, &expected);
    assert_eq!(replay.transitions(), 6);
}

#[test]
fn seed_004_scenario_2_flapping_fall_3_changes_twice() {
    let flaky = trace("OK FAIL OK FAIL OK FAIL FAIL FAIL FAIL OK");
    let in_pool = trace("O O O O O O O x x O");
    let (script, expected) = timeline_script(&flaky, &in_pool);
    let replay = check(thresholds(1, 3), &script, &expected);
    assert_eq!(replay.transitions(), 2);
}

#[test]
fn seed_004_exercise_1_leaves_at_probe_3_returns_at_probe_8() {
    let timeline = trace("OK OK FAIL FAIL FAIL OK FAIL OK OK");
    let in_pool = trace("SI SI SI NO NO NO NO NO SI");
    assert_eq!(in_pool.iter().position(|&up| !up), Some(3));
    assert_eq!(in_pool.iter().rposition(|&up| !up), Some(7));
    let (script, expected) = timeline_script(&timeline, &in_pool);
    let replay = check(thresholds(2, 2), &script, &expected);
    assert_eq!(replay.transitions(), 2);
}

// The protocol itself.

#[test]
fn unknown_command_prints_err_and_changes_nothing() {
    check(
        defaults(),
        "POOL a
         BOGUS
         probe a TIMEOUT
         POOLS a b
         STATUS",
        "OK
         ERR
         ERR
         ERR
         a UP",
    );
}

#[test]
fn unknown_backend_prints_err_and_changes_nothing() {
    check(
        defaults(),
        "POOL a
         PROBE ghost TIMEOUT
         OBSERVE ghost TIMEOUT
         PROBE A TIMEOUT
         STATUS",
        "OK
         ERR
         ERR
         ERR
         a UP",
    );
}

#[test]
fn probe_and_observe_before_any_pool_print_err() {
    check(
        defaults(),
        "PROBE a TIMEOUT
         OBSERVE a TIMEOUT
         STATUS
         HEALTHY",
        "ERR
         ERR
         none",
    );
}

#[test]
fn missing_answer_prints_err_and_changes_nothing() {
    // Each line is a failure, were it counted; three would take the backend down.
    check(
        defaults(),
        "POOL a
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         PROBE a
         PROBE a \nPROBE
         OBSERVE a
         OBSERVE a \nOBSERVE
         STATUS
         PROBE a TIMEOUT
         STATUS",
        "OK
         FAIL
         FAIL
         ERR
         ERR
         ERR
         ERR
         ERR
         ERR
         a UP
         FAIL
         a DOWN",
    );
}

#[test]
fn words_after_status_or_healthy_print_err() {
    check(
        defaults(),
        "POOL a
         STATUS a
         HEALTHY a
         STATUS \nHEALTHY \nSTATUS",
        "OK
         ERR
         ERR
         ERR
         ERR
         a UP",
    );
}

#[test]
fn pool_errors_print_err_and_keep_the_old_pool() {
    check(
        defaults(),
        "POOL a b
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         POOL
         POOL \nPOOL c c
         POOL c d c
         POOL c  d
         POOL c d \nSTATUS",
        "OK
         FAIL
         FAIL
         FAIL
         ERR
         ERR
         ERR
         ERR
         ERR
         ERR
         a DOWN
         b UP",
    );
}

#[test]
fn pool_replaces_the_pool_with_fresh_backends() {
    check(
        defaults(),
        "POOL a b
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         POOL b a
         STATUS
         PROBE a TIMEOUT
         PROBE a TIMEOUT
         STATUS",
        "OK
         FAIL
         FAIL
         FAIL
         OK
         b UP
         a UP
         FAIL
         FAIL
         b UP
         a UP",
    );
}

#[test]
fn trailing_carriage_return_is_ignored() {
    check(
        defaults(),
        "POOL a b\r\nPROBE a HTTP/1.1 200 OK\r\nPROBE b TIMEOUT\r\nSTATUS\r\nHEALTHY\r\n\r\n",
        "OK
         PASS
         FAIL
         a UP
         b UP
         a,b",
    );
}

#[test]
fn blank_and_comment_lines_print_nothing() {
    check(
        defaults(),
        "# a comment before anything
         \n\n#POOL x\nPOOL a
         # PROBE a TIMEOUT
         \nSTATUS",
        "OK
         a UP",
    );
}

#[test]
fn healthy_prints_none_when_none_is_up() {
    check(
        thresholds(2, 1),
        "POOL a b
         PROBE a TIMEOUT
         HEALTHY
         OBSERVE b RESET
         OBSERVE b RESET
         OBSERVE b RESET
         HEALTHY
         STATUS",
        "OK
         FAIL
         b
         ERROR
         ERROR
         ERROR
         none
         a DOWN
         b DOWN",
    );
}

#[test]
fn lines_without_a_line_ending_run_too() {
    // `check` passes the last line without its `\n`.
    check(defaults(), "POOL a\nHEALTHY", "OK\na");
}

// The helper itself.

#[test]
#[should_panic(expected = "expected:")]
fn check_rejects_a_wrong_line() {
    check(defaults(), "POOL a\nSTATUS", "OK\na DOWN");
}

#[test]
#[should_panic(expected = "expected:")]
fn check_rejects_a_missing_line() {
    check(defaults(), "POOL a\nSTATUS", "OK");
}

#[test]
#[should_panic(expected = "expected:")]
fn check_err_matches_only_err_lines() {
    check(defaults(), "POOL a", "ERR");
}
