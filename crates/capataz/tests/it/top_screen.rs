//! `capataz top` on a real terminal: tmux runs it in a window of 80x24 against a balancer with
//! thirty backends and over a hundred events, and what the window shows (`capture-pane`) must
//! be the header, the table's first rows and every backend not UP, a `+N more` line, and the
//! latest events cut to the width, nothing wrapped; resized to 120x40 it redraws at the new
//! size; `q` stops it and gives the terminal its line wrapping and cursor back.
//!
//! tmux is required: a missing one fails the test saying how to install it
//! (`.ci/deps/tmux.sh`, which CI runs). Each run has a tmux server of its own (`-L`, no config
//! file), killed when the test ends.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use capataz::sim::Mode;
use capataz_health::State;

use crate::support::balancer::{self, backends, pairs, ConfigText, FAST_CHECKS};
use crate::support::events::{is_transition, wait_for};
use crate::support::tools::require_tool;
use crate::support::DEADLINE;

/// A tmux server of this test's own with one session, `top`, running a command in a window
/// of a given size; the server (and the command) killed when dropped.
struct Tmux {
    binary: PathBuf,
    socket: String,
}

impl Tmux {
    fn start(command: &str, columns: u16, rows: u16) -> Tmux {
        let tmux = Tmux {
            binary: require_tool("tmux", "tmux"),
            socket: format!("capataz-top-{}-{}", std::process::id(), fastrand::u64(..)),
        };
        let (columns, rows) = (columns.to_string(), rows.to_string());
        tmux.ok(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &columns,
            "-y",
            &rows,
            command,
            ";",
            // The window stays when the command ends, to read how it left the terminal.
            "set-option",
            "-gw",
            "remain-on-exit",
            "on",
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.binary)
            // UTF-8 (`-u`): capataz cuts lines with `…`.
            .args(["-u", "-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.binary.display()))
    }

    /// Runs a tmux command that must succeed, and returns what it printed.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The window's lines as shown, a line the terminal wrapped joined again (`-J`).
    fn screen(&self) -> Vec<String> {
        let text = self.ok(&["capture-pane", "-p", "-J", "-t", "top"]);
        text.lines().map(str::to_owned).collect()
    }

    /// A tmux format of the pane (`#{wrap_flag}`, `#{cursor_flag}`).
    fn pane(&self, format: &str) -> String {
        self.ok(&["display-message", "-p", "-t", "top", format])
            .trim()
            .to_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Reads the window (off the runtime threads) until `done` holds for it, failing with the last
/// reading after the deadline.
async fn wait_for_screen(
    tmux: &std::sync::Arc<Tmux>,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let reader = tmux.clone();
        let screen = tokio::task::spawn_blocking(move || reader.screen())
            .await
            .expect("the capture's task");
        if done(&screen) {
            return screen;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the terminal did not show {what} within {DEADLINE:?}; it shows:\n{}",
            screen.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The columns a captured line takes (capataz's lines here are ASCII and `…`).
fn columns(line: &str) -> usize {
    line.chars().count()
}

fn rows_shown(screen: &[String]) -> usize {
    screen
        .iter()
        .filter(|l| l.starts_with("  app-server-"))
        .count()
}

/// Drains and clears every backend through the admin API: two override events and two
/// transitions each.
async fn make_events(admin: SocketAddr, names: &[String]) {
    for name in names {
        for verb in ["drain", "clear"] {
            let path = capataz::ctl::override_path("web", name, verb, None);
            capataz::ctl::request(admin, http::Method::POST, &path, None)
                .await
                .unwrap_or_else(|e| panic!("{verb} {name}: {e}"));
        }
    }
}

/// Regression: `capataz top` drew every backend and every event whatever the
/// terminal's size, so in 80x24 the header and the table scrolled away and only wrapped event
/// lines remained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_fits_an_80x24_terminal_with_many_backends_and_events() {
    let names: Vec<String> = (0..30).map(|i| format!("app-server-{i:02}")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let sims = backends(&name_refs).await;
    let text = ConfigText::new(&pairs(&sims))
        .admin("")
        .extra(FAST_CHECKS)
        .build();
    let (balancer, mut events) = balancer::start(&text).await;
    let admin = balancer.admin_addr().expect("the admin API runs");
    balancer::wait_probed_up(admin, None, 30).await;
    make_events(admin, &names).await;
    // The last three go DOWN: far down the table, they must be among the rows shown.
    for sim in &sims[27..] {
        sim.set_health(Mode::Status(503));
    }
    let mut down = std::collections::BTreeSet::new();
    while down.len() < 3 {
        let event = wait_for(&mut events, "the last three DOWN", |e| {
            names[27..]
                .iter()
                .any(|name| is_transition(e, name, State::Down))
        })
        .await;
        down.insert(event.backend().map(str::to_owned));
    }

    // The shell stays when top ends, to say how and to show how top left the terminal.
    let command = format!(
        "'{}' top --admin {admin} --interval 0.2 --events 50; echo \"top exited $?\"; exec sleep 600",
        env!("CARGO_BIN_EXE_capataz")
    );
    let tmux = std::sync::Arc::new(Tmux::start(&command, 80, 24));
    // A whole frame: tmux may be read while top is still drawing one, its events not all
    // there yet.
    let screen = wait_for_screen(&tmux, "a frame with every backend DOWN", |screen| {
        let events_at = screen.iter().position(|l| l.starts_with("recent events ("));
        screen
            .iter()
            .any(|l| l.contains("pool web: 27 of 30 eligible"))
            && events_at.is_some_and(|at| screen.len() - at > 5)
    })
    .await;
    let all = screen.join("\n");
    assert!(screen.len() <= 24, "{all}");
    for line in &screen {
        assert!(
            columns(line) <= 80,
            "a line wider than 80 columns: {line:?}\n{all}"
        );
    }
    assert!(
        screen[0].starts_with(&format!("capataz top: {admin} at ")),
        "the header on the first line: {all}"
    );
    assert!(
        screen[1].starts_with("pool web: 27 of 30 eligible; "),
        "{all}"
    );
    assert!(
        screen[2].starts_with("  BACKEND")
            && screen[2].contains("STATE")
            && screen[2].contains("P99"),
        "{all}"
    );
    assert!(
        screen[3].starts_with("  app-server-00  UP"),
        "the table's first row: {all}"
    );
    for name in &names[27..] {
        assert!(
            screen
                .iter()
                .any(|l| l.starts_with(&format!("  {name}  DOWN"))),
            "{name}, DOWN, is shown: {all}"
        );
    }
    let shown = rows_shown(&screen);
    let hidden = 30 - shown;
    assert!(
        screen.contains(&format!("  +{hidden} more: {hidden} UP")),
        "the rows left out are counted: {all}"
    );
    let events_at = screen
        .iter()
        .position(|l| l.starts_with("recent events ("))
        .expect("the events header");
    let event_lines = &screen[events_at + 1..];
    assert!(
        event_lines.len() >= 5
            && event_lines
                .iter()
                .all(|l| l.starts_with("  ") && l.contains(" UTC  ")),
        "the latest events fill the rest: {all}"
    );
    assert!(
        event_lines
            .iter()
            .any(|l| l.ends_with('…') && columns(l) == 80),
        "long event lines are cut at the edge: {screen:#?}"
    );
    assert_eq!(
        tmux.pane("#{wrap_flag} #{cursor_flag}"),
        "0 0",
        "wrapping and cursor off"
    );

    // A bigger terminal: the frame is redrawn at its size, with more rows and wider lines.
    tmux.ok(&["resize-window", "-t", "top", "-x", "120", "-y", "40"]);
    let screen = wait_for_screen(&tmux, "the frame at 120x40", |screen| {
        screen.len() == 40
            && !screen[39].is_empty()
            && rows_shown(screen) > shown
            && screen.iter().any(|l| columns(l) > 80)
    })
    .await;
    assert!(
        screen[0].starts_with("capataz top: "),
        "{}",
        screen.join("\n")
    );
    for line in &screen {
        assert!(columns(line) <= 120, "{line:?}");
    }

    // `q` stops it, and the terminal wraps lines and shows its cursor again.
    tmux.ok(&["send-keys", "-t", "top", "q"]);
    wait_for_screen(&tmux, "top stopped by q", |screen| {
        screen.iter().any(|l| l == "top exited 0")
    })
    .await;
    assert_eq!(tmux.pane("#{wrap_flag} #{cursor_flag}"), "1 1", "restored");
    drop(tmux);
    balancer.shutdown(Duration::from_secs(1)).await;
}
