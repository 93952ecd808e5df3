//! `capataz top`: a live terminal view of pools, backends and events, redrawn every interval
//! from the admin API (`/status`, `/history/series`, `/history/events`).
//!
//! On a terminal each frame is fitted to the terminal's size ([`frame`] says how) and drawn
//! over the last one from the top left corner, states coloured with plain ANSI escapes; the
//! size is read with `stty size` (else `COLUMNS` and `LINES`, else 80x24) at the start and again
//! on each `SIGWINCH`, which redraws the frame at once. While it runs the terminal's line
//! wrapping and cursor are off, and both are restored when it stops. Anywhere else (a pipe, a
//! file, a test) it prints whole frames one after another, uncoloured, each under a line of its
//! own. It stops on `q` (read from standard input: on a terminal without waiting for Enter,
//! through `stty`), on Ctrl-C or `SIGTERM`, or after `iterations` frames.

mod fit;
mod frame;

use std::io::{IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::{printable, request, CtlError};
pub use frame::Screen;

/// How `capataz top` runs.
#[derive(Clone, Debug)]
pub struct TopOptions {
    /// The admin API.
    pub admin: SocketAddr,
    /// Its bearer token, if it needs one.
    pub token: Option<String>,
    /// Time between frames.
    pub interval: Duration,
    /// Stop after this many frames (run until `q` or Ctrl-C when `None`).
    pub iterations: Option<u64>,
    /// The most recent events shown.
    pub events: usize,
}

/// What one frame is drawn from.
struct Reading {
    status: Value,
    series: Value,
    events: Value,
}

async fn read(options: &TopOptions) -> Result<Reading, CtlError> {
    let token = options.token.as_deref();
    let get = |path| request(options.admin, http::Method::GET, path, token);
    Ok(Reading {
        status: get("/status").await?,
        series: get("/history/series").await?,
        events: get("/history/events").await?,
    })
}

/// What the screen shows: a reading, or why the last one failed.
enum Shown {
    Reading(Reading),
    Failure(String),
}

impl Shown {
    /// The lines of its frame, fitted to `screen` when there is one.
    fn lines(&self, options: &TopOptions, screen: Option<Screen>) -> Vec<String> {
        match self {
            Shown::Reading(reading) => frame::frame(
                reading,
                options.admin,
                options.events,
                screen,
                screen.is_some(),
            ),
            Shown::Failure(text) => {
                let line = fit::Line::plain(text.as_str());
                vec![line.render(screen.map(|s| s.columns), false)]
            }
        }
    }
}

/// The terminal's size: `stty size` on the controlling terminal, else `COLUMNS` and `LINES`
/// (each on its own), else 80x24.
async fn screen_size() -> Screen {
    let from_stty = async {
        let tty = std::fs::File::open("/dev/tty").ok()?;
        let output = tokio::process::Command::new("stty")
            .arg("size")
            .stdin(Stdio::from(tty))
            .stderr(Stdio::null())
            .output()
            .await
            .ok()
            .filter(|o| o.status.success())?;
        let text = String::from_utf8(output.stdout).ok()?;
        let mut numbers = text.split_whitespace().map(|n| n.parse::<usize>().ok());
        let (rows, columns) = (numbers.next()??, numbers.next()??);
        // A terminal that does not know its size says 0 0.
        (rows > 0 && columns > 0).then_some(Screen { columns, rows })
    };
    if let Some(screen) = from_stty.await {
        return screen;
    }
    let size = |value: Result<String, std::env::VarError>, default: usize| {
        value
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(default)
    };
    Screen {
        columns: size(std::env::var("COLUMNS"), 80),
        rows: size(std::env::var("LINES"), 24),
    }
}

/// Puts the terminal on standard input in a mode where `q` arrives without Enter (and is not
/// echoed), and restores it when dropped. Does nothing when standard input is not a terminal
/// or `stty` is missing.
struct RawInput {
    saved: Option<String>,
}

impl RawInput {
    fn start() -> RawInput {
        if !std::io::stdin().is_terminal() {
            return RawInput { saved: None };
        }
        let saved = std::process::Command::new("stty")
            .arg("-g")
            .stdin(std::process::Stdio::inherit())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned());
        if saved.is_some() {
            let _ = std::process::Command::new("stty")
                .args(["-icanon", "-echo", "min", "1"])
                .stdin(std::process::Stdio::inherit())
                .status();
        }
        RawInput { saved }
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = std::process::Command::new("stty")
                .arg(saved)
                .stdin(std::process::Stdio::inherit())
                .status();
        }
    }
}

/// Watches standard input on a thread of its own (a blocking read; the process may end while
/// it waits) and says when a `q` arrives.
fn quit_key() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut byte = [0u8; 1];
        loop {
            match stdin.read(&mut byte) {
                Ok(1) if matches!(byte[0], b'q' | b'Q') => {
                    let _ = tx.send(());
                    return;
                }
                Ok(1) => {}
                // End of input (or an error): no key will come; keep running.
                _ => return,
            }
        }
    });
    rx
}

/// Runs `capataz top` until `q`, Ctrl-C, `SIGTERM` or `options.iterations` frames, writing
/// frames to `out`. Fails only if the first reading fails (the admin API is not there); later
/// failures are shown in place of a frame, and reading goes on.
pub async fn run(options: TopOptions, out: &mut dyn Write) -> Result<(), CtlError> {
    let terminal = std::io::stdout().is_terminal();
    let _raw = RawInput::start();
    if !terminal {
        return frames(&options, out, None).await;
    }
    let mut terminal = Terminal {
        size: screen_size().await,
        resized: signal(SignalKind::window_change()).ok(),
    };
    // No line wrapping (a line the terminal finds too wide is clipped, not wrapped) and no
    // cursor while the frames are drawn; both back on the way out.
    let _ = write!(out, "\x1b[?7l\x1b[?25l");
    let result = frames(&options, out, Some(&mut terminal)).await;
    let _ = write!(out, "\x1b[?7h\x1b[?25h\r\n");
    let _ = out.flush();
    result
}

/// The terminal drawn on: its size, and the `SIGWINCH`es that change it.
struct Terminal {
    size: Screen,
    resized: Option<Signal>,
}

/// Writes the lines of a frame: on a terminal of `rows` lines over the last frame (each line
/// cleared before it is written, the screen below the last one cleared), else whole under
/// `--- frame N ---`. A line is cleared first, not after: the cursor stays on the last column
/// after a line as wide as the screen, and clearing from there would erase that column.
fn draw(
    out: &mut dyn Write,
    lines: &[String],
    rows: Option<usize>,
    shown: u64,
) -> std::io::Result<()> {
    let text = match rows {
        Some(rows) => {
            let mut text = String::from("\x1b[H");
            for (i, line) in lines.iter().enumerate() {
                if i > 0 {
                    text.push_str("\r\n");
                }
                text.push_str("\x1b[K");
                text.push_str(line);
            }
            if lines.len() < rows {
                text.push_str("\r\n\x1b[J");
            }
            text
        }
        None => {
            let mut text = format!(
                "{}--- frame {} ---\n",
                if shown > 0 { "\n" } else { "" },
                shown + 1
            );
            for line in lines {
                text.push_str(line);
                text.push('\n');
            }
            text
        }
    };
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// The next of a signal's deliveries, or never without the signal.
async fn recv(signal: Option<&mut Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// Reads and draws a frame every interval (on `terminal`, fitted to its size, and again at
/// once when it is resized) until a way to stop comes.
async fn frames(
    options: &TopOptions,
    out: &mut dyn Write,
    mut terminal: Option<&mut Terminal>,
) -> Result<(), CtlError> {
    let mut quit = quit_key();
    let mut input_open = true;
    let mut shown = 0u64;
    let interval = options.interval.max(Duration::from_millis(100));
    let mut term = signal(SignalKind::terminate()).ok();
    loop {
        let now = match read(options).await {
            Ok(reading) => Shown::Reading(reading),
            Err(error) if shown == 0 => return Err(error),
            Err(error) => Shown::Failure(format!(
                "capataz top: {}: {} (retrying every {})",
                options.admin,
                printable(&error.to_string()),
                capataz_health::pool::human_duration(interval)
            )),
        };
        let size = terminal.as_ref().map(|t| t.size);
        // A reader that went away (`capataz top | head`) is a way to stop.
        if draw(out, &now.lines(options, size), size.map(|s| s.rows), shown).is_err() {
            return Ok(());
        }
        shown += 1;
        if options.iterations.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        let pause = tokio::time::sleep(interval);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = &mut pause => break,
                key = &mut quit, if input_open => match key {
                    Ok(()) => return Ok(()),
                    // Standard input ended (or is not there): only Ctrl-C or the count stop it.
                    Err(_) => input_open = false,
                },
                _ = tokio::signal::ctrl_c() => return Ok(()),
                _ = recv(term.as_mut()) => return Ok(()),
                Some(()) = recv(terminal.as_mut().and_then(|t| t.resized.as_mut())) => {
                    // Redrawn at once at the new size, from the reading shown.
                    if let Some(t) = terminal.as_mut() {
                        t.size = screen_size().await;
                        let lines = now.lines(options, Some(t.size));
                        if draw(out, &lines, Some(t.size.rows), shown).is_err() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}
