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
//! ```
//!
//! An answer is `TIMEOUT`, `REFUSED`, `RESET` or a status line as received. Words are separated
//! by one space; a trailing carriage return is ignored; blank lines and `#` comments print
//! nothing. Any other line prints one `ERR <reason>` line and changes nothing.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write as _;
use std::time::Duration;

use crate::pool::{Pool, Settings, State, Transition};
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
    pool: Pool,
    names: Vec<Box<[u8]>>,
    index: Index,
    step: u64,
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
            pool: Pool::new(settings, 0),
            names: Vec::new(),
            index: Index::default(),
            step: 0,
            transitions: 0,
        }
    }

    /// The pool as it stands.
    pub fn pool(&self) -> &Pool {
        &self.pool
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
        let now = Duration::from_millis(self.step);
        let (command, rest) = split_word(line);
        let transition = match command {
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
                if command == b"PROBE" {
                    let (result, transition) = self.pool.probe(backend, outcome, now);
                    push_line(out, result.as_str().as_bytes());
                    transition
                } else {
                    let (result, transition) = self.pool.observe(backend, outcome, now);
                    push_line(out, result.as_str().as_bytes());
                    transition
                }
            }
            b"STATUS" | b"HEALTHY" if rest.is_some() => {
                return err(out, format_args!("{} takes no arguments", show(command)));
            }
            b"STATUS" => {
                for (name, health) in self.names.iter().zip(self.pool.backends()) {
                    out.extend_from_slice(name);
                    out.push(b' ');
                    push_line(out, health.verdict().as_str().as_bytes());
                }
                None
            }
            b"HEALTHY" => {
                let mut any = false;
                for (name, health) in self.names.iter().zip(self.pool.backends()) {
                    if health.verdict() == State::Up {
                        if any {
                            out.push(b',');
                        }
                        out.extend_from_slice(name);
                        any = true;
                    }
                }
                if !any {
                    out.extend_from_slice(b"none");
                }
                out.push(b'\n');
                None
            }
            b"POOL" => {
                return match rest {
                    Some(names) => self.replace_pool(names, out),
                    None => err(out, format_args!("POOL needs at least one backend name")),
                };
            }
            _ => return err(out, format_args!("unknown command {:?}", show(command))),
        };
        if let Some(transition) = transition {
            self.transitions += 1;
            if let Some(explain) = explain {
                self.explain(&transition, explain);
            }
        }
    }

    fn replace_pool(&mut self, names: &[u8], out: &mut Vec<u8>) {
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
        self.pool = Pool::new(self.settings, list.len());
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
