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
//! AT <ms>                  set the clock (never back); from then on lines do not move it -> OK
//! TRAFFIC <b> <lat> <answer>  a traffic outcome that took <lat> milliseconds (decimal, up
//!                          to 3 fraction digits; `-` for none: no answer came) -> OK | ERROR
//! SHED <b> <lat> <status> <ms>  an answer asking for <ms> of relief (a `429`, or a `503` with
//!                          `Retry-After`) -> SHED with load shedding on, else judged as
//!                          traffic: OK | ERROR
//! ```
//!
//! An answer is `TIMEOUT`, `REFUSED`, `RESET`, `TLS`, `CONNECTED` (a TCP probe's connection
//! opened: it passes whatever the rule expects), `GRPC <code>` (a gRPC status, 0-255) or
//! a status line as received. Words are separated by one space; a trailing carriage return is
//! ignored; blank lines and `#` comments print nothing. Any other line prints one `ERR <reason>` line and changes nothing.
//!
//! Time: the session clock counts milliseconds, one per command line plus those `WAIT` adds,
//! saturating at `u64::MAX`, until the first `AT`; from then on only `AT` and `WAIT` move it
//! (a recorded log says when each line happened). With a latency-outlier or success-rate
//! detector in the settings, its windows end at every multiple of its window length
//! ([`ReplayOptions`]) on that clock: before a line runs at a later time, each window that
//! ended is judged at its end (windows in which no backend had traffic are skipped: judging
//! them changes nothing). `TRAFFIC` and `SHED` lines with a latency count in the latency
//! window, `OBSERVE` and `TRAFFIC` lines (and `SHED` lines judged as traffic) in the success
//! window. Once `AT` is used, each explained verdict change starts with `@<ms> `, its time.
//! `WAIT`, `OVERRIDE`, `ELIGIBLE`, `AGENT`, `AT`, `TRAFFIC` and `SHED` came
//! later; scripts without them print exactly what they always did. Overrides never change verdicts (`STATUS`,
//! `HEALTHY`), only who gets traffic (`ELIGIBLE`), as in the balancer, whose all-down policy
//! here is `fail_open` over backends proven healthy (every backend of a `POOL` starts UP).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write as _;
use std::time::Duration;

use crate::outliers::{latency_bucket, LatencyWindow, SuccessWindow, LATENCY_BUCKETS};
use crate::pool::{Pool, Settings, State, Transition};
use crate::rotation::{AgentReport, Event, Join, LoadShedding, OverrideKind, Policy, Rotation};
use crate::rules::TrafficResult;
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

/// What a replay needs beyond the engine's [`Settings`]: the detectors' window lengths and
/// load shedding (the balancer's `[pools.NAME.passive]` tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// How long a latency-outlier window lasts (default 10 s, as in the balancer).
    pub latency_window: Duration,
    /// How long a success-rate window lasts (default 10 s).
    pub success_window: Duration,
    /// Load shedding awareness, or `None` (default): `SHED` lines are then judged as traffic.
    pub load_shedding: Option<LoadShedding>,
}

impl Default for ReplayOptions {
    fn default() -> ReplayOptions {
        ReplayOptions {
            latency_window: Duration::from_secs(10),
            success_window: Duration::from_secs(10),
            load_shedding: None,
        }
    }
}

/// The windows being filled: per backend, latency bucket counts and judged outcomes, and when
/// each kind ends next (milliseconds on the session clock).
#[derive(Debug)]
struct Windows {
    latency: Vec<[u64; LATENCY_BUCKETS]>,
    success: Vec<SuccessWindow>,
    /// Whether any backend had traffic in the current latency / success window.
    latency_used: bool,
    success_used: bool,
    next_latency: u64,
    next_success: u64,
}

/// A replay session: the pool, its backend names, and the settings every `POOL` starts from.
#[derive(Debug)]
pub struct Replay {
    settings: Settings,
    options: ReplayOptions,
    rotation: Rotation,
    names: Vec<Box<[u8]>>,
    index: Index,
    /// The session clock, in milliseconds.
    clock: u64,
    /// Whether `AT` set the clock (lines no longer move it).
    timed: bool,
    windows: Windows,
    transitions: u64,
}

impl Replay {
    /// An empty session; `POOL` creates backends with these settings (their initial state is
    /// always UP, as the protocol says).
    pub fn new(settings: Settings) -> Replay {
        Replay::with_options(settings, ReplayOptions::default())
    }

    /// An empty session with the detectors' windows and load shedding of `options`.
    pub fn with_options(settings: Settings, options: ReplayOptions) -> Replay {
        let settings = Settings {
            initial: State::Up,
            ..settings
        };
        let latency_window = millis(options.latency_window);
        let success_window = millis(options.success_window);
        Replay {
            settings,
            options,
            rotation: rotation(settings, options, 0, Duration::ZERO),
            names: Vec::new(),
            index: Index::default(),
            clock: 0,
            timed: false,
            windows: Windows {
                latency: Vec::new(),
                success: Vec::new(),
                latency_used: false,
                success_used: false,
                next_latency: latency_window,
                next_success: success_window,
            },
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
        let (command, rest) = split_word(line);
        let mut explain = explain;
        // `AT` sets the clock itself: it may name the time the clock already shows.
        if !self.timed && command != b"AT" {
            self.clock = self.clock.saturating_add(1);
        }
        if command == b"AT" {
            return match rest.and_then(number) {
                Some(ms) if ms >= self.clock => {
                    self.clock = ms;
                    self.timed = true;
                    self.advance_to(ms, explain.as_deref_mut());
                    push_line(out, b"OK");
                }
                Some(_) => err(
                    out,
                    format_args!(
                        "AT cannot go back in time (the clock is at {} ms)",
                        self.clock
                    ),
                ),
                None => err(out, format_args!("AT needs a number of milliseconds")),
            };
        }
        self.close_windows(self.clock, explain.as_deref_mut());
        let now = Duration::from_millis(self.clock);
        let ran = match command {
            b"PROBE" | b"OBSERVE" => self.run_answer(command, rest, now, out),
            b"TRAFFIC" => self.run_traffic(rest, now, out),
            b"SHED" => self.run_shed(rest, now, out),
            b"STATUS" | b"HEALTHY" | b"ELIGIBLE" if rest.is_some() => {
                return err(out, format_args!("{} takes no arguments", show(command)));
            }
            b"STATUS" => {
                for (name, health) in self.names.iter().zip(self.pool().backends()) {
                    out.extend_from_slice(name);
                    out.push(b' ');
                    push_line(out, health.verdict().as_str().as_bytes());
                }
                Ok(())
            }
            b"HEALTHY" => {
                let up = self.pool().backends().iter().enumerate();
                let up = up.filter(|(_, health)| health.verdict() == State::Up);
                self.list(up.map(|(i, _)| i), out);
                Ok(())
            }
            b"ELIGIBLE" => {
                let eligible = self.rotation.eligible(now).backends;
                self.list(eligible.into_iter(), out);
                Ok(())
            }
            b"WAIT" => match rest.and_then(number) {
                Some(ms) => {
                    self.clock = self.clock.saturating_add(ms);
                    self.advance_to(self.clock, explain.as_deref_mut());
                    push_line(out, b"OK");
                    Ok(())
                }
                None => refuse(out, format_args!("WAIT needs a number of milliseconds")),
            },
            b"OVERRIDE" => match rest.and_then(|rest| self.parse_override(rest)) {
                Some((backend, kind, ttl)) => {
                    let state = self.rotation.set_override(backend, kind, ttl, now);
                    push_line(out, state.as_str().as_bytes());
                    Ok(())
                }
                None => refuse(
                    out,
                    format_args!(
                        "OVERRIDE needs a backend, up|down|drain|clear, and optionally milliseconds"
                    ),
                ),
            },
            b"AGENT" => self.run_agent(rest, now, out),
            b"POOL" => {
                return match rest {
                    Some(names) => self.replace_pool(names, now, out),
                    None => err(out, format_args!("POOL needs at least one backend name")),
                };
            }
            _ => return err(out, format_args!("unknown command {:?}", show(command))),
        };
        // A refused line changed nothing: what earlier lines left is drained by the next.
        if ran.is_ok() && self.rotation.has_events() {
            self.drain_events(explain);
        }
    }

    /// `PROBE name answer` or `OBSERVE name answer`.
    fn run_answer(
        &mut self,
        command: &[u8],
        rest: Option<&[u8]>,
        now: Duration,
        out: &mut Vec<u8>,
    ) -> Ran {
        let Some(rest) = rest else {
            return refuse(
                out,
                format_args!("{} needs a backend and an answer", show(command)),
            );
        };
        let (name, answer) = split_word(rest);
        let Some(&backend) = self.index.get(name) else {
            return refuse(out, format_args!("unknown backend {:?}", show(name)));
        };
        let answer = match answer {
            Some(answer) if !answer.is_empty() => answer,
            _ => {
                return refuse(
                    out,
                    format_args!("{} {} needs an answer", show(command), show(name)),
                )
            }
        };
        let outcome = Outcome::parse(answer);
        let result = if command == b"PROBE" {
            self.rotation.handle_probe(backend, outcome, now).as_str()
        } else {
            self.traffic(backend, outcome, now).as_str()
        };
        push_line(out, result.as_bytes());
        Ok(())
    }

    /// `TRAFFIC name latency answer`.
    fn run_traffic(&mut self, rest: Option<&[u8]>, now: Duration, out: &mut Vec<u8>) -> Ran {
        let parsed = rest.and_then(|rest| {
            let (name, rest) = split_word(rest);
            let (latency, answer) = split_word(rest?);
            let answer = answer.filter(|a| !a.is_empty())?;
            Some((name, latency_us(latency)?, answer))
        });
        let Some((name, latency, answer)) = parsed else {
            return refuse(
                out,
                format_args!(
                    "TRAFFIC needs a backend, a latency in milliseconds (or -) and an answer"
                ),
            );
        };
        let Some(&backend) = self.index.get(name) else {
            return refuse(out, format_args!("unknown backend {:?}", show(name)));
        };
        if let Some(us) = latency {
            self.count_latency(backend, us);
        }
        let result = self.traffic(backend, Outcome::parse(answer), now);
        push_line(out, result.as_str().as_bytes());
        Ok(())
    }

    /// `SHED name latency status relief`.
    fn run_shed(&mut self, rest: Option<&[u8]>, now: Duration, out: &mut Vec<u8>) -> Ran {
        let Some((backend, latency, status, relief)) = rest.and_then(|rest| self.parse_shed(rest))
        else {
            return refuse(
                out,
                format_args!(
                    "SHED needs a backend, a latency in milliseconds (or -), a status code 100-599 and milliseconds of relief"
                ),
            );
        };
        if let Some(us) = latency {
            self.count_latency(backend, us);
        }
        if self.rotation.handle_shed(backend, status, relief, now) {
            push_line(out, b"SHED");
        } else {
            let result = self.traffic(backend, Outcome::Status(status), now);
            push_line(out, result.as_str().as_bytes());
        }
        Ok(())
    }

    /// `AGENT name answer`.
    fn run_agent(&mut self, rest: Option<&[u8]>, now: Duration, out: &mut Vec<u8>) -> Ran {
        let Some(rest) = rest else {
            return refuse(out, format_args!("AGENT needs a backend and an answer"));
        };
        let (name, answer) = split_word(rest);
        let Some(&backend) = self.index.get(name) else {
            return refuse(out, format_args!("unknown backend {:?}", show(name)));
        };
        match AgentReport::parse(answer.unwrap_or_default()) {
            Some(report) => {
                let state = self.rotation.handle_agent(backend, report, now);
                push_line(out, state.to_string().as_bytes());
            }
            None => push_line(out, b"IGNORED"),
        }
        Ok(())
    }

    /// Judges a traffic outcome, counting it in the success window.
    fn traffic(&mut self, backend: usize, outcome: Outcome, now: Duration) -> TrafficResult {
        if self.settings.success_rate.is_some() {
            let error = self.settings.traffic_rule.judge(outcome) == TrafficResult::Error;
            let window = &mut self.windows.success[backend];
            window.requests = window.requests.saturating_add(1);
            window.errors = window.errors.saturating_add(u64::from(error));
            self.windows.success_used = true;
        }
        self.rotation.handle_traffic(backend, outcome, now)
    }

    /// Counts an answer that took `us` microseconds in the latency window.
    fn count_latency(&mut self, backend: usize, us: u64) {
        if self.settings.latency_outliers.is_some() {
            let count = &mut self.windows.latency[backend][latency_bucket(us)];
            *count = count.saturating_add(1);
            self.windows.latency_used = true;
        }
    }

    /// Moves the session to `ms`: judges the windows that ended by then, runs the timers due.
    fn advance_to(&mut self, ms: u64, mut explain: Option<&mut Vec<u8>>) {
        self.close_windows(ms, explain.as_deref_mut());
        self.rotation.handle_timeout(Duration::from_millis(ms));
        if self.rotation.has_events() {
            self.drain_events(explain);
        }
    }

    /// Judges, in time order, every window that ended by `ms`, each at its end, and explains
    /// what that changed. A window without traffic is skipped to the last one due (judging it
    /// would change nothing), so a jump of any length takes a few steps. Once `AT` set the
    /// clock, the engine's timers due by `ms` (ejections ending, override TTLs) run at their
    /// own times too, in order with the windows, so each change is explained with its time.
    fn close_windows(&mut self, ms: u64, explain: Option<&mut Vec<u8>>) {
        let latency_on = self.settings.latency_outliers.is_some();
        let success_on = self.settings.success_rate.is_some();
        let latency_window = millis(self.options.latency_window);
        let success_window = millis(self.options.success_window);
        // A timer still due after it ran would loop forever: it runs once, then waits for `ms`.
        let mut last_timer = None;
        loop {
            let timer = if self.timed {
                self.rotation
                    .poll_timeout()
                    .map(|due| u64::try_from(due.as_millis()).unwrap_or(u64::MAX))
                    .filter(|&due| due <= ms && Some(due) != last_timer)
            } else {
                None
            };
            let w = &mut self.windows;
            // A window ending at the clock's end never ends (the clock saturates there).
            let due = |on: bool, end: u64| on && end <= ms && end < u64::MAX;
            let latency = Some(w.next_latency).filter(|&end| due(latency_on, end));
            let success = Some(w.next_success).filter(|&end| due(success_on, end));
            // The earliest first; at the same time timers, then latency, then success.
            let Some(first) = [timer, latency, success].into_iter().flatten().min() else {
                break;
            };
            if timer == Some(first) {
                last_timer = timer;
                self.rotation.handle_timeout(Duration::from_millis(first));
            } else if latency == Some(first) {
                w.next_latency = next_end(first, ms, latency_window, w.latency_used);
                if w.latency_used {
                    w.latency_used = false;
                    let windows: Vec<LatencyWindow> = w
                        .latency
                        .iter_mut()
                        .map(|counts| {
                            let window = LatencyWindow::from_buckets(counts);
                            *counts = [0; LATENCY_BUCKETS];
                            window
                        })
                        .collect();
                    self.rotation
                        .handle_latency_window(&windows, Duration::from_millis(first));
                }
            } else {
                w.next_success = next_end(first, ms, success_window, w.success_used);
                if w.success_used {
                    w.success_used = false;
                    let windows = std::mem::replace(
                        &mut w.success,
                        vec![SuccessWindow::default(); self.names.len()],
                    );
                    self.rotation
                        .handle_success_window(&windows, Duration::from_millis(first));
                }
            }
        }
        if self.rotation.has_events() {
            self.drain_events(explain);
        }
    }

    /// `<backend> <latency> <status> <ms>` of a `SHED` line.
    fn parse_shed(&self, rest: &[u8]) -> Option<(usize, Option<u64>, u16, Duration)> {
        let (name, rest) = split_word(rest);
        let backend = *self.index.get(name)?;
        let (latency, rest) = split_word(rest?);
        let (status, relief) = split_word(rest?);
        let status = u16::try_from(number(status)?)
            .ok()
            .filter(|s| (100..=599).contains(s))?;
        let relief = Duration::from_millis(number(relief?)?);
        Some((backend, latency_us(latency)?, status, relief))
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
        self.rotation = rotation(self.settings, self.options, list.len(), now);
        if self.settings.latency_outliers.is_some() {
            self.windows.latency = vec![[0; LATENCY_BUCKETS]; list.len()];
        }
        if self.settings.success_rate.is_some() {
            self.windows.success = vec![SuccessWindow::default(); list.len()];
        }
        self.windows.latency_used = false;
        self.windows.success_used = false;
        self.names = list;
        self.index = index;
        push_line(out, b"OK");
    }

    fn explain(&self, transition: &Transition, explain: &mut Vec<u8>) {
        if self.timed {
            // Writing to a Vec cannot fail.
            let _ = write!(explain, "@{} ", transition.at.as_millis());
        }
        explain.extend_from_slice(&self.names[transition.backend]);
        // Writing to a Vec cannot fail.
        let _ = writeln!(explain, " {transition}");
    }
}

/// How an outcome is written in a script so that the protocol reads it back as the same
/// outcome (`HTTP/1.1 503`, `TIMEOUT`, `GRPC 14`, `MALFORMED`, ...): what a recorder writes.
pub fn answer(outcome: Outcome) -> std::borrow::Cow<'static, str> {
    match outcome {
        Outcome::Status(code) => format!("HTTP/1.1 {code}").into(),
        Outcome::Grpc(code) => format!("GRPC {code}").into(),
        Outcome::Timeout => "TIMEOUT".into(),
        Outcome::Refused => "REFUSED".into(),
        Outcome::Reset => "RESET".into(),
        Outcome::Tls => "TLS".into(),
        Outcome::Connected => "CONNECTED".into(),
        // Any word the protocol does not know reads as malformed.
        Outcome::Malformed => "MALFORMED".into(),
    }
}

/// A rotation of `n` backends, all UP, under the balancer's default policy (with the load
/// shedding of `options`).
fn rotation(settings: Settings, options: ReplayOptions, n: usize, now: Duration) -> Rotation {
    let join = Join::New {
        initial: State::Up,
        warm_up: false,
    };
    let policy = Policy {
        load_shedding: options.load_shedding,
        ..Policy::default()
    };
    Rotation::new(settings, policy, (0..n).map(|_| (1, join)), now)
}

/// A window length in milliseconds, at least one.
fn millis(window: Duration) -> u64 {
    u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// When the window after the one ending at `end` ends: the next multiple of `window`, or,
/// after an empty window, the first multiple of `window` after `ms` (the empty windows between
/// change nothing).
fn next_end(end: u64, ms: u64, window: u64, used: bool) -> u64 {
    let from = if used { end } else { end.max(ms) };
    (from / window).saturating_add(1).saturating_mul(window)
}

/// A latency: `-` (none: `Some(None)`), or decimal milliseconds with at most three fraction
/// digits, as microseconds (`Some(Some(us))`); `None` for anything else.
fn latency_us(word: &[u8]) -> Option<Option<u64>> {
    if word == b"-" {
        return Some(None);
    }
    let (whole, fraction) = match word.iter().position(|&b| b == b'.') {
        Some(at) => (&word[..at], &word[at + 1..]),
        None => (word, &b"0"[..]),
    };
    if whole.len() > 12 || fraction.is_empty() || fraction.len() > 3 {
        return None;
    }
    if !fraction.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms = number(whole)?;
    let mut us = 0;
    for i in 0..3 {
        us = us * 10 + fraction.get(i).map_or(0, |d| u64::from(d - b'0'));
    }
    Some(Some(ms * 1000 + us))
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

/// Whether a line ran (`Err`: it was refused, with an `ERR` line written).
type Ran = Result<(), Refused>;

/// A line refused.
struct Refused;

/// Writes the `ERR` line of a refused line.
fn refuse(out: &mut Vec<u8>, reason: std::fmt::Arguments<'_>) -> Ran {
    err(out, reason);
    Err(Refused)
}

fn err(out: &mut Vec<u8>, reason: std::fmt::Arguments<'_>) {
    // Writing to a Vec cannot fail.
    let _ = writeln!(out, "ERR {reason}");
}
