//! A bounded fuzz smoke test: the checks of the `engine`, `replay` and `status_line` fuzz
//! targets (`fuzz/`, run with cargo-fuzz) on a few hundred proptest inputs each, so that
//! `cargo test --workspace` runs them on every change without cargo-fuzz or a nightly compiler.
//!
//! The checks are not copied: the modules below are the fuzz crate's own files, included by path
//! (they use nothing but this crate and `std`). Each proptest input goes through the same decoder
//! as a fuzz input, so a failure here replays under cargo-fuzz from the same bytes, and the other
//! way round (`fuzz/README.md`). The whole file runs in well under five seconds.

use proptest::prelude::*;

// The fuzz crate's items are `pub` for its targets; here they sit in private modules.
#[allow(unreachable_pub, dead_code)]
#[path = "../../../fuzz/src/engine.rs"]
mod engine;
#[allow(unreachable_pub, dead_code)]
#[path = "../../../fuzz/src/replay.rs"]
mod replay;
#[allow(unreachable_pub, dead_code)]
#[path = "../../../fuzz/src/status.rs"]
mod status;

/// One line of a replay script: mostly well-formed commands on a few short names, so that
/// streaks build up, with malformed lines, comments and stray bytes among them.
fn script_line() -> impl Strategy<Value = Vec<u8>> {
    let name = prop::sample::select(vec!["a", "b", "c", "a,b", "x"]);
    let answer = prop_oneof![
        prop::sample::select(vec![
            "HTTP/1.1 200 OK",
            "HTTP/1.1 204",
            "HTTP/1.0 302 Found",
            "HTTP/1.1 404 Not Found",
            "HTTP/1.1 500 Internal Server Error",
            "HTTP/1.1 503 Service Unavailable",
            "HTTP/1.1 600 x",
            "TIMEOUT",
            "REFUSED",
            "RESET",
            "garbage",
            "",
        ])
        .prop_map(str::to_owned),
        "HTTP/[0-9][.][0-9] [0-9]{3}( [ -~]{0,8})?",
    ];
    let line = prop_oneof![
        6 => (prop::sample::select(vec!["PROBE", "OBSERVE"]), name.clone(), answer)
            .prop_map(|(command, name, answer)| format!("{command} {name} {answer}")),
        2 => prop::collection::vec(name.clone(), 0..4).prop_map(|names| format!("POOL {}", names.join(" "))),
        1 => prop::sample::select(vec!["STATUS", "HEALTHY", "STATUS x", "HEALTHY ", "", "# note", "BOGUS", "PROBE", "PROBE a"])
            .prop_map(str::to_owned),
        1 => (name, prop::sample::select(vec!["up", "down", "drain", "clear", "sideways"]), prop::option::of(prop_oneof![0..500u64, Just(u64::MAX)]))
            .prop_map(|(name, kind, ms)| match ms {
                Some(ms) => format!("OVERRIDE {name} {kind} {ms}"),
                None => format!("OVERRIDE {name} {kind}"),
            }),
        1 => prop_oneof![(0..300u64).prop_map(|ms| format!("WAIT {ms}")), Just("WAIT 18446744073709551615".to_owned()), Just("WAIT x".to_owned()), Just("ELIGIBLE".to_owned()), Just("ELIGIBLE x".to_owned())],
        1 => "[ -~]{0,12}",
    ];
    (line, prop::sample::select(vec!["\n", "\n", "\n", "\r\n"]))
        .prop_map(|(line, end)| format!("{line}{end}").into_bytes())
}

/// A script, sometimes with a `#@` header that picks small thresholds and timed ejection.
fn script() -> impl Strategy<Value = Vec<u8>> {
    let header = prop_oneof![
        Just(String::new()),
        (1u32..=3, 1u32..=3, 1u32..=3, 0u8..=100, any::<bool>()).prop_map(
            |(rise, fall, errors, percent, count_503)| format!(
                "#@ rise={rise} fall={fall} errors={errors} percent={percent} count_503={} eject=100/800\n",
                u8::from(count_503)
            )
        ),
    ];
    (header, prop::collection::vec(script_line(), 0..40)).prop_map(|(header, lines)| {
        let mut script = header.into_bytes();
        script.extend(lines.concat());
        script
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The `engine` target on arbitrary bytes: every decoded history keeps the pool's invariants.
    #[test]
    fn engine_invariants_hold_on_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..600)) {
        engine::run(&data);
    }

    /// The `replay` target on scripts close to the protocol.
    #[test]
    fn replay_follows_the_protocol_on_scripts(data in script()) {
        replay::run(&data);
    }

    /// The `replay` target on arbitrary bytes.
    #[test]
    fn replay_follows_the_protocol_on_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..200)) {
        replay::run(&data);
    }

    /// The `status_line` target on bytes near a status line.
    #[test]
    fn status_line_matches_the_grammar(
        head in prop::collection::vec(prop::sample::select(b"HTP/0123456789. \t\r\x00\x7f\x80\xff".to_vec()), 0..16),
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut line = b"HTTP/".to_vec();
        line.extend_from_slice(&head);
        line.extend_from_slice(&tail);
        status::check(&line);
        status::check(&line[5..]);
    }
}

/// Fixed inputs that reach the deeper paths every time: timed ejection, expiry, probation and a
/// cap lowered by `set_settings` while backends are ejected.
#[test]
fn engine_fixed_histories() {
    // Settings: rise 1, fall 1, errors 1, flags (timed ejection, max = base x n, count 503),
    // default expect, base 100 ms, max x4, cap 50 %; four backends.
    let mut data = vec![0, 0, 0, 0b1110, 0, 100, 0, 3, 50, 4];
    for round in 0..6u8 {
        for backend in 0..4u8 {
            // A traffic error (a timeout) 1 ms after the previous call.
            data.extend([6, 1, backend, 0]);
        }
        // A tick 1 s later ends the due ejections; then a 200 on each backend.
        data.extend([12, 0x81]);
        for backend in 0..4u8 {
            data.extend([6, 0, backend, 4, 2]);
        }
        if round == 2 {
            // New settings: an odd policy (base 100 ms, max 1 ms) and a cap of 0 % (no passive
            // ejection) while backends may still be ejected.
            data.extend([14, 0, 0, 0, 0, 0b0110, 0, 100, 0, 1, 0, 0]);
        }
    }
    engine::run(&data);
    // The boundaries random bytes rarely hit. One backend, errors 1, timed ejection with base
    // and max both 1 s (1000 = 0xe8 0x03 ms, times 1): an error at 0 ejects it until 1 s; a tick
    // at exactly 1 s must end the ejection; a 200 readmits it at 1 s; an error exactly `max`
    // later, at 2 s, must count as a first ejection again.
    engine::run(&[
        0, 0, 0, 0b1110, 0, 0xe8, 0x03, 0, 100, 1, // settings, size
        6, 0, 0, 0, // observe: timeout
        12, 0x81, // tick, 1 s later
        6, 0, 0, 4, 2, // observe: 200
        6, 0x81, 0, 0, // observe: timeout, 1 s later
    ]);
    for seed in 0..64u8 {
        let data: Vec<u8> = (0..400u32)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        engine::run(&data);
    }
}

/// The replay examples of `capataz replay`, as scripts.
#[test]
fn replay_fixed_scripts() {
    replay::run(b"POOL a b\nPROBE a TIMEOUT\nPROBE a TIMEOUT\nPROBE a TIMEOUT\nSTATUS\nHEALTHY\n");
    replay::run(b"#@ rise=1 fall=1\nPOOL a\nPROBE a RESET\nPROBE a HTTP/1.1 200 OK\nSTATUS\n");
    replay::run(
        b"#@ errors=1 eject=10/20\nPOOL a b\nOBSERVE a RESET\nOBSERVE a HTTP/1.1 200\nHEALTHY",
    );
    replay::run(
        b"STATUS\nHEALTHY\nPOOL\nPOOL a  b\nPOOL a a\nPROBE ghost RESET\n\r\n# c\nBOGUS x\n",
    );
    // Time and overrides: a timed ejection ends on WAIT; overrides change no verdict.
    replay::run(
        b"#@ errors=1 eject=10/20\nPOOL a b\nOBSERVE a RESET\nOVERRIDE b down 5\nELIGIBLE\n\
          WAIT 20\nSTATUS\nELIGIBLE\nOVERRIDE a drain\nOVERRIDE a clear 5\nWAIT 18446744073709551615\n",
    );
}
