//! The `replay` target: arbitrary bytes fed line by line to `capataz_health::Replay::run_line`,
//! as `capataz replay` feeds a script (each line with its `\n`, the last one perhaps without).
//!
//! Each line is checked against a second reading of the protocol in `capataz_health::replay`,
//! kept here as a small model (the names, and a `Pool` of its own driven with the same answers):
//!
//! - a blank line or a `#` comment prints nothing and changes nothing;
//! - `STATUS` prints exactly one `<name> UP|DOWN` line per backend (so nothing for an empty
//!   pool), `HEALTHY` one line (`none` when no backend is UP), `POOL` one `OK` line, `PROBE` one
//!   `PASS`/`FAIL` line and `OBSERVE` one `OK`/`ERROR` line, as the rules judge the answer;
//! - `WAIT <ms>` prints `OK` and ends the timed ejections due by then (the model ticks its own
//!   pool); `OVERRIDE <name> up|down|drain|clear [<ms>]` and `ELIGIBLE` print one line that is
//!   not `ERR` and change no verdict (overrides are not modelled beyond that);
//! - every other line prints exactly one line, `ERR <reason>`, and changes nothing;
//! - after each line the session's pool and names equal the model's, and the explanation holds
//!   one `<name> FROM -> TO: <reason>` line per verdict change, as `transitions()` counts them.
//!
//! A first line of the form `#@ rise=1 fall=2 errors=3 percent=50 count_503=0 eject=100/800`
//! (any subset, any order) picks the session's settings; it is a comment to the protocol, so the
//! script plays the same either way. Without it the settings are the defaults, as in
//! `capataz replay` without flags.
//!
//! This file uses nothing but `capataz_health` and `std`: the proptest smoke test
//! (`crates/capataz-health/tests/fuzz_smoke.rs`) includes it by path.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::{EjectionPolicy, Outcome, Pool, Replay, Settings, State};

/// Plays `script` and checks every line; panics on the first violation.
pub fn run(script: &[u8]) {
    let settings = header_settings(script);
    let mut replay = Replay::new(settings);
    let mut model = Model::new(settings);
    for line in script.split_inclusive(|&b| b == b'\n') {
        check_line(&mut replay, &mut model, line);
    }
}

/// The settings a `#@` first line asks for, or the defaults.
pub fn header_settings(script: &[u8]) -> Settings {
    let mut settings = Settings::default();
    let first = script.split(|&b| b == b'\n').next().unwrap_or_default();
    let Some(words) = first.strip_prefix(b"#@") else {
        return settings;
    };
    let text = String::from_utf8_lossy(words);
    for word in text.split_ascii_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        let threshold = || value.parse().ok().and_then(NonZeroU32::new);
        match key {
            "rise" => settings.rise = threshold().unwrap_or(settings.rise),
            "fall" => settings.fall = threshold().unwrap_or(settings.fall),
            "errors" => {
                settings.consecutive_errors = threshold().unwrap_or(settings.consecutive_errors)
            }
            "percent" => {
                settings.max_ejected_percent = value.parse().unwrap_or(settings.max_ejected_percent)
            }
            "count_503" => settings.traffic_rule.count_503 = value != "0",
            "eject" => {
                let ms = |text: &str| text.parse().ok().map(Duration::from_millis);
                if let Some((base, max)) = value.split_once('/') {
                    if let (Some(base), Some(max)) = (ms(base), ms(max)) {
                        settings.ejection = Some(EjectionPolicy { base, max });
                    }
                }
            }
            _ => {}
        }
    }
    settings
}

/// What the protocol says a line prints.
#[derive(Debug)]
enum Expect {
    /// Nothing (a blank line or a comment).
    Nothing,
    /// Exactly these bytes.
    Exactly(Vec<u8>),
    /// One line, not `ERR`, and no verdict change.
    OneLine,
    /// One `ERR <reason>` line, and no change.
    Err,
}

/// The protocol as documented, on a pool of its own.
struct Model {
    settings: Settings,
    pool: Pool,
    names: Vec<Vec<u8>>,
    step: u64,
    /// Milliseconds added by `WAIT`.
    waited: u64,
    /// Whether the last line replaced the pool.
    replaced: bool,
}

impl Model {
    fn new(settings: Settings) -> Model {
        let settings = Settings {
            initial: State::Up,
            ..settings
        };
        Model {
            settings,
            pool: Pool::new(settings, 0),
            names: Vec::new(),
            step: 0,
            waited: 0,
            replaced: false,
        }
    }

    fn run(&mut self, line: &[u8]) -> Expect {
        self.replaced = false;
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() || line.starts_with(b"#") {
            return Expect::Nothing;
        }
        self.step += 1;
        let now = Duration::from_millis(self.step.saturating_add(self.waited));
        let (command, rest) = word(line);
        match (command, rest) {
            (b"PROBE" | b"OBSERVE", Some(rest)) => {
                let (name, answer) = word(rest);
                let Some(backend) = self.names.iter().position(|n| n == name) else {
                    return Expect::Err;
                };
                let answer = match answer {
                    Some(answer) if !answer.is_empty() => answer,
                    _ => return Expect::Err,
                };
                let outcome = Outcome::parse(answer);
                let word = if command == b"PROBE" {
                    let word = self.settings.probe_rule.judge(outcome).as_str();
                    self.pool.probe(backend, outcome, now);
                    word
                } else {
                    let word = self.settings.traffic_rule.judge(outcome).as_str();
                    self.pool.observe(backend, outcome, now);
                    word
                };
                Expect::Exactly(format!("{word}\n").into_bytes())
            }
            (b"STATUS", None) => {
                let mut out = Vec::new();
                for (name, health) in self.names.iter().zip(self.pool.backends()) {
                    out.extend_from_slice(name);
                    out.extend_from_slice(format!(" {}\n", health.verdict()).as_bytes());
                }
                Expect::Exactly(out)
            }
            (b"HEALTHY", None) => {
                let up: Vec<&[u8]> = self
                    .names
                    .iter()
                    .zip(self.pool.backends())
                    .filter(|(_, health)| health.verdict() == State::Up)
                    .map(|(name, _)| &name[..])
                    .collect();
                let mut out = if up.is_empty() {
                    b"none".to_vec()
                } else {
                    up.join(&b","[..])
                };
                out.push(b'\n');
                Expect::Exactly(out)
            }
            (b"WAIT", Some(ms)) => {
                let Some(ms) = number(ms) else {
                    return Expect::Err;
                };
                self.waited = self.waited.saturating_add(ms);
                let now = Duration::from_millis(self.step.saturating_add(self.waited));
                let mut transitions = Vec::new();
                self.pool.tick(now, &mut transitions);
                Expect::Exactly(b"OK\n".to_vec())
            }
            (b"OVERRIDE", Some(rest)) => {
                let (name, rest) = word(rest);
                let known = self.names.iter().any(|n| n == name);
                let valid = match rest.map(word) {
                    Some((b"up" | b"down" | b"drain", None)) => true,
                    Some((b"up" | b"down" | b"drain", Some(ms))) => number(ms).is_some(),
                    Some((b"clear", None)) => true,
                    _ => false,
                };
                if known && valid {
                    Expect::OneLine
                } else {
                    Expect::Err
                }
            }
            (b"ELIGIBLE", None) => Expect::OneLine,
            (b"POOL", Some(rest)) => {
                let names: Vec<Vec<u8>> = rest.split(|&b| b == b' ').map(<[u8]>::to_vec).collect();
                let empty = names.iter().any(Vec::is_empty);
                let twice = (1..names.len()).any(|i| names[..i].contains(&names[i]));
                if empty || twice {
                    return Expect::Err;
                }
                self.pool = Pool::new(self.settings, names.len());
                self.names = names;
                self.replaced = true;
                Expect::Exactly(b"OK\n".to_vec())
            }
            _ => Expect::Err,
        }
    }
}

/// A decimal number that fits a u64, as the protocol reads milliseconds.
fn number(word: &[u8]) -> Option<u64> {
    if word.is_empty() || word.len() > 20 || !word.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// Splits off the first word at the first space.
fn word(line: &[u8]) -> (&[u8], Option<&[u8]>) {
    match line.iter().position(|&b| b == b' ') {
        Some(at) => (&line[..at], Some(&line[at + 1..])),
        None => (line, None),
    }
}

fn check_line(replay: &mut Replay, model: &mut Model, line: &[u8]) {
    let transitions_before = replay.transitions();
    let verdicts_before = verdicts(replay.pool());
    let names_before = replay.names().to_vec();
    let mut out = Vec::new();
    let mut explain = Vec::new();
    replay.run_line(line, &mut out, Some(&mut explain));
    let expect = model.run(line);

    let lines = out.iter().filter(|&&b| b == b'\n').count();
    let blank_or_comment = matches!(expect, Expect::Nothing);
    let status = line.strip_suffix(b"\n").unwrap_or(line);
    let status = matches!(status.strip_suffix(b"\r").unwrap_or(status), b"STATUS");
    if blank_or_comment {
        assert_eq!(lines, 0, "{line:?}");
    } else if status {
        assert_eq!(lines, replay.pool().len(), "{line:?}: one line per backend");
    } else {
        assert_eq!(lines, 1, "{line:?} printed {out:?}");
    }
    assert!(
        out.is_empty() || out.ends_with(b"\n"),
        "{line:?} printed an unfinished line {out:?}"
    );
    match expect {
        Expect::Nothing => {
            assert!(out.is_empty(), "{line:?} printed {out:?}");
            assert!(explain.is_empty());
        }
        Expect::OneLine => {
            assert!(!out.starts_with(b"ERR"), "{line:?} printed {out:?}");
            assert_eq!(
                verdicts(replay.pool()),
                verdicts_before,
                "{line:?} changed a verdict"
            );
        }
        Expect::Exactly(expected) => assert_eq!(
            out,
            expected,
            "{line:?} printed {:?}, the protocol says {:?}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        ),
        Expect::Err => {
            assert!(
                out.starts_with(b"ERR "),
                "{line:?} printed {out:?}, not ERR"
            );
            assert_eq!(lines, 1, "{line:?} printed {out:?}, not one ERR line");
            assert!(explain.is_empty());
            assert_eq!(
                verdicts(replay.pool()),
                verdicts_before,
                "ERR changed a verdict"
            );
            assert_eq!(replay.names(), &names_before[..], "ERR changed the pool");
        }
    }

    let names: Vec<&[u8]> = replay.names().iter().map(|n| &n[..]).collect();
    let model_names: Vec<&[u8]> = model.names.iter().map(|n| &n[..]).collect();
    assert_eq!(names, model_names, "after {line:?}");
    assert_eq!(
        replay.pool().backends(),
        model.pool.backends(),
        "after {line:?}"
    );
    let pool = replay.pool();
    let up = pool
        .backends()
        .iter()
        .filter(|b| b.verdict() == State::Up)
        .count();
    assert_eq!(pool.healthy(), up);

    // One explanation line per verdict change, and `transitions()` counts the same.
    let explained = explain.iter().filter(|&&b| b == b'\n').count();
    let counted = replay.transitions() - transitions_before;
    assert_eq!(explained as u64, counted, "{line:?} explained {explain:?}");
    if !model.replaced {
        let changed = verdicts_before
            .iter()
            .zip(verdicts(pool))
            .filter(|(a, b)| *a != b)
            .count();
        assert_eq!(counted, changed as u64, "after {line:?}");
    } else {
        assert_eq!(counted, 0, "POOL reported a transition");
    }
    for note in explain.split_inclusive(|&b| b == b'\n') {
        let known = replay.names().iter().any(|name| {
            note.strip_prefix(&name[..]).is_some_and(|rest| {
                rest.starts_with(b" UP -> DOWN: ") || rest.starts_with(b" DOWN -> UP: ")
            })
        });
        assert!(known, "explanation {note:?}");
    }
}

fn verdicts(pool: &Pool) -> Vec<State> {
    pool.backends().iter().map(|b| b.verdict()).collect()
}
