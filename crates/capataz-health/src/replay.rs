//! The replay line protocol: a script format that drives one [`Pool`] command by command.
//!
//! It is what `capataz replay` speaks, what the seed exercises are written in, and how the engine
//! is tested. It is pure: a line goes in, bytes come out, nothing else happens.
//!
//! ```text
//! POOL <b1> <b2> ...       replace the pool (every backend UP, streaks 0)  -> OK
//! PROBE <b> <answer>       a probe outcome                                 -> PASS | FAIL
//! OBSERVE <b> <answer>     a traffic outcome                               -> OK | ERROR
//! STATUS                   one `<b> UP|DOWN` line per backend, pool order
//! HEALTHY                  the UP backends comma-separated, or `none`
//! WAIT <ms>                let time pass, running due timers               -> OK
//! OVERRIDE <b> <kind> [<ms>]  up, down, drain, maintenance or clear, for ms or until cleared
//!                          -> the effective state: UP, DOWN, FORCED_UP, FORCED_DOWN, DRAINING,
//!                          MAINTENANCE, REQUALIFYING (after maintenance, until `rise` probes
//!                          in a row pass; probes during maintenance print their judgement
//!                          and change nothing)
//! ELIGIBLE                 the backends new requests go to (overrides and the all-down
//!                          policy applied), comma-separated, or `none`
//! AGENT <b> <line>         an agent check's answer (`up`, `down`, `drain`, `maint`, `ready`,
//!                          `75%`, comma or space separated; see `rotation::agent`)
//!                          -> what the agent says now (`up`, `drain, weight 50%`), or
//!                          `IGNORED` for garbage (which changes nothing)
//! ```
//!
//! An answer is `TIMEOUT`, `REFUSED`, `RESET`, `TLS`, `CONNECTED` (a TCP probe's connection
//! opened: it passes whatever the rule expects), `GRPC <code>` (a gRPC status, 0-255) or
//! a status line as received. Words are separated by one space; a trailing carriage return is
//! ignored; blank lines and `#` comments print nothing. Any other line prints one `ERR <reason>` line and changes nothing.
//!
//! Time: the session clock counts milliseconds, one per command line plus those `WAIT` adds,
//! saturating at `u64::MAX`. `WAIT`, `OVERRIDE`, `ELIGIBLE` and (issue 14) `AGENT` came later; scripts without
//! them print exactly what they always did. Overrides never change verdicts (`STATUS`,
//! `HEALTHY`), only who gets traffic (`ELIGIBLE`), as in the balancer, whose all-down policy
//! here is `fail_open` over backends proven healthy (every backend of a `POOL` starts UP).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write as _;
use std::time::Duration;

use crate::pool::{Pool, Settings, State, Transition};
use crate::rotation::{AgentReport, Event, Join, OverrideKind, Policy, Rotation};
use crate::status::Outcome;

/// A fast, non-cryptographic hasher for backend names (FxHash). The names come from a script,
/// not from the network, so flooding is not a concern.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut hash = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            hash = (hash.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            hash = (hash.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
        self.0 = hash;
    }

    fn finish(&self) -> u64 {
        // The multiply leaves the low bits depending on the input's low bytes only (names that
        // share a prefix would share buckets); fold the high bits down.
        let hash = self.0;
        (hash ^ (hash >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (hash >> 32)
    }
}

type Index = HashMap<Box<[u8]>, usize, BuildHasherDefault<FxHasher>>;

/// A replay session: the pool, its backend names, and the settings every `POOL` starts from.
#[derive(Debug)]
pub struct Replay {
    settings: Settings,
    rotation: Rotation,
    names: Vec<Box<[u8]>>,
    index: Index,
    step: u64,
    /// Milliseconds added by `WAIT`.
    waited: u64,
    transitions: u64,
}

impl Replay {
    /// An empty session; `POOL` creates backends with these settings (their initial state is
    /// always UP, as the protocol says).
    pub fn new(settings: Settings) -> Replay {
        let settings = Settings {
            initial: State::Up,
            ..settings
        };
        Replay {
            settings,
            rotation: rotation(settings, 0, Duration::ZERO),
            names: Vec::new(),
            index: Index::default(),
            step: 0,
            waited: 0,
            transitions: 0,
        }
    }

    /// The pool's verdicts as they stand.
    pub fn pool(&self) -> &Pool {
        self.rotation.pool()
    }

    /// The pool with its overrides and eligibility.
    pub fn rotation(&self) -> &Rotation {
        &self.rotation
    }

    /// The backends' names, in pool order.
    pub fn names(&self) -> &[Box<[u8]>] {
        &self.names
    }

    /// How many verdict changes the session has seen.
    pub fn transitions(&self) -> u64 {
        self.transitions
    }

    /// Runs one line (with or without its line ending) and appends what it prints to `out`.
    /// Each verdict change is appended to `explain`, when given, as one line:
    /// `web2 UP -> DOWN: 3 consecutive failed probes, last: TIMEOUT`.
    pub fn run_line(&mut self, line: &[u8], out: &mut Vec<u8>, explain: Option<&mut Vec<u8>>) {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() || line[0] == b'#' {
            return;
        }
        self.step += 1;
        let now = Duration::from_millis(self.step.saturating_add(self.waited));
        let (command, rest) = split_word(line);
        match command {
            b"PROBE" | b"OBSERVE" => {
                let Some(rest) = rest else {
                    return err(
                        out,
                        format_args!("{} needs a backend and an answer", show(command)),
                    );
                };
                let (name, answer) = split_word(rest);
                let Some(&backend) = self.index.get(name) else {
                    return err(out, format_args!("unknown backend {:?}", show(name)));
                };
                let answer = match answer {
                    Some(answer) if !answer.is_empty() => answer,
                    _ => {
                        return err(
                            out,
                            format_args!("{} {} needs an answer", show(command), show(name)),
                        )
                    }
                };
                let outcome = Outcome::parse(answer);
                let result = if command == b"PROBE" {
                    self.rotation.handle_probe(backend, outcome, now).as_str()
                } else {
                    self.rotation.handle_traffic(backend, outcome, now).as_str()
                };
                push_line(out, result.as_bytes());
            }
            b"STATUS" | b"HEALTHY" | b"ELIGIBLE" if rest.is_some() => {
                return err(out, format_args!("{} takes no arguments", show(command)));
            }
            b"STATUS" => {
                for (name, health) in self.names.iter().zip(self.pool().backends()) {
                    out.extend_from_slice(name);
                    out.push(b' ');
                    push_line(out, health.verdict().as_str().as_bytes());
                }
            }
            b"HEALTHY" => {
                let up = self.pool().backends().iter().enumerate();
                let up = up.filter(|(_, health)| health.verdict() == State::Up);
                self.list(up.map(|(i, _)| i), out);
            }
            b"ELIGIBLE" => {
                let eligible = self.rotation.eligible(now).backends;
                self.list(eligible.into_iter(), out);
            }
            b"WAIT" => {
                let Some(ms) = rest.and_then(number) else {
                    return err(out, format_args!("WAIT needs a number of milliseconds"));
                };
                self.waited = self.waited.saturating_add(ms);
                let now = Duration::from_millis(self.step.saturating_add(self.waited));
                self.rotation.handle_timeout(now);
                push_line(out, b"OK");
            }
            b"OVERRIDE" => {
                let Some((backend, kind, ttl)) = rest.and_then(|rest| self.parse_override(rest))
                else {
                    return err(
                        out,
                        format_args!(
                            "OVERRIDE needs a backend, up|down|drain|clear, and optionally milliseconds"
                        ),
                    );
                };
                let state = self.rotation.set_override(backend, kind, ttl, now);
                push_line(out, state.as_str().as_bytes());
            }
            b"AGENT" => {
                let Some(rest) = rest else {
                    return err(out, format_args!("AGENT needs a backend and an answer"));
                };
                let (name, answer) = split_word(rest);
                let Some(&backend) = self.index.get(name) else {
                    return err(out, format_args!("unknown backend {:?}", show(name)));
                };
                match AgentReport::parse(answer.unwrap_or_default()) {
                    Some(report) => {
                        let state = self.rotation.handle_agent(backend, report, now);
                        push_line(out, state.to_string().as_bytes());
                    }
                    None => push_line(out, b"IGNORED"),
                }
            }
            b"POOL" => {
                return match rest {
                    Some(names) => self.replace_pool(names, now, out),
                    None => err(out, format_args!("POOL needs at least one backend name")),
                };
            }
            _ => return err(out, format_args!("unknown command {:?}", show(command))),
        };
        if self.rotation.has_events() {
            self.drain_events(explain);
        }
    }

    /// Counts the verdict changes the last command caused and explains them.
    fn drain_events(&mut self, mut explain: Option<&mut Vec<u8>>) {
        while let Some(event) = self.rotation.poll_event() {
            if let Event::Transition(transition) = event {
                self.transitions += 1;
                if let Some(explain) = explain.as_deref_mut() {
                    self.explain(&transition, explain);
                }
            }
        }
    }

    /// Writes the names of `backends` comma-separated, or `none`, as one line.
    fn list(&self, backends: impl Iterator<Item = usize>, out: &mut Vec<u8>) {
        let mut any = false;
        for i in backends {
            if any {
                out.push(b',');
            }
            out.extend_from_slice(&self.names[i]);
            any = true;
        }
        if !any {
            out.extend_from_slice(b"none");
        }
        out.push(b'\n');
    }

    /// `<backend> up|down|drain|maintenance|clear [<ms>]`.
    fn parse_override(
        &self,
        rest: &[u8],
    ) -> Option<(usize, Option<OverrideKind>, Option<Duration>)> {
        let (name, rest) = split_word(rest);
        let backend = *self.index.get(name)?;
        let (kind, ttl) = split_word(rest?);
        let kind = match kind {
            b"up" => Some(OverrideKind::Up),
            b"down" => Some(OverrideKind::Down),
            b"drain" => Some(OverrideKind::Drain),
            b"maintenance" => Some(OverrideKind::Maintenance),
            b"clear" => None,
            _ => return None,
        };
        let ttl = match ttl {
            None => None,
            Some(ms) if kind.is_some() => Some(Duration::from_millis(number(ms)?)),
            Some(_) => return None,
        };
        Some((backend, kind, ttl))
    }

    fn replace_pool(&mut self, names: &[u8], now: Duration, out: &mut Vec<u8>) {
        let mut index = Index::default();
        let mut list = Vec::new();
        for name in names.split(|&b| b == b' ') {
            if name.is_empty() {
                return err(
                    out,
                    format_args!("empty backend name (words are separated by one space)"),
                );
            }
            if index.insert(Box::from(name), list.len()).is_some() {
                return err(out, format_args!("backend {:?} is named twice", show(name)));
            }
            list.push(Box::from(name));
        }
        self.rotation = rotation(self.settings, list.len(), now);
        self.names = list;
        self.index = index;
        push_line(out, b"OK");
    }

    fn explain(&self, transition: &Transition, explain: &mut Vec<u8>) {
        explain.extend_from_slice(&self.names[transition.backend]);
        // Writing to a Vec cannot fail.
        let _ = writeln!(explain, " {transition}");
    }
}

/// A rotation of `n` backends, all UP, under the balancer's default policy.
fn rotation(settings: Settings, n: usize, now: Duration) -> Rotation {
    let join = Join::New {
        initial: State::Up,
        warm_up: false,
    };
    Rotation::new(settings, Policy::default(), (0..n).map(|_| (1, join)), now)
}

/// A decimal number that fits a u64, and nothing else.
fn number(word: &[u8]) -> Option<u64> {
    if word.is_empty() || word.len() > 20 || !word.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(word).ok()?.parse().ok()
}

fn split_word(line: &[u8]) -> (&[u8], Option<&[u8]>) {
    match line.iter().position(|&b| b == b' ') {
        Some(at) => (&line[..at], Some(&line[at + 1..])),
        None => (line, None),
    }
}

fn push_line(out: &mut Vec<u8>, text: &[u8]) {
    out.extend_from_slice(text);
    out.push(b'\n');
}

fn show(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

fn err(out: &mut Vec<u8>, reason: std::fmt::Arguments<'_>) {
    // Writing to a Vec cannot fail.
    let _ = writeln!(out, "ERR {reason}");
}
