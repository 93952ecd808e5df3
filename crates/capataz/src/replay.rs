//! `capataz replay`: drives the health engine with the line protocol from a file or stdin.
//!
//! It streams: a result is written as soon as its line is read whenever no further input is
//! already buffered, so it can sit in an interactive pipe, and memory stays flat however long
//! the script is.

use std::io::{self, BufRead, Write};

use capataz_health::{Replay, Settings};

const BUFFER: usize = 256 * 1024;

/// Runs the protocol over `input`, writing results to `output` and, when `explain` is given,
/// each verdict change to it. Returns the number of verdict changes seen.
pub fn run(
    settings: Settings,
    input: impl io::Read,
    output: impl Write,
    mut explain: Option<&mut dyn Write>,
) -> io::Result<u64> {
    let mut input = io::BufReader::with_capacity(BUFFER, input);
    let mut output = output;
    let mut replay = Replay::new(settings);
    let mut line = Vec::with_capacity(256);
    let mut out = Vec::with_capacity(BUFFER + 4096);
    let mut notes = Vec::new();
    loop {
        // Flush before a read that may block, so results reach an interactive reader at once.
        if input.buffer().is_empty() {
            flush(&mut output, &mut out, &mut explain, &mut notes)?;
        }
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let notes_sink = if explain.is_some() {
            Some(&mut notes)
        } else {
            None
        };
        replay.run_line(&line, &mut out, notes_sink);
        if out.len() >= BUFFER || notes.len() >= BUFFER {
            flush(&mut output, &mut out, &mut explain, &mut notes)?;
        }
    }
    flush(&mut output, &mut out, &mut explain, &mut notes)?;
    Ok(replay.transitions())
}

fn flush(
    output: &mut impl Write,
    out: &mut Vec<u8>,
    explain: &mut Option<&mut dyn Write>,
    notes: &mut Vec<u8>,
) -> io::Result<()> {
    if let Some(explain) = explain {
        if !notes.is_empty() {
            explain.write_all(notes)?;
            explain.flush()?;
            notes.clear();
        }
    }
    if !out.is_empty() {
        output.write_all(out)?;
        out.clear();
    }
    output.flush()
}
