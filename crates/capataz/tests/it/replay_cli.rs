//! End-to-end tests of `capataz replay`: the built binary, its flags, exit codes and streaming.
//!
//! The examples in `tests/replay-examples/` (copies of `shared/examples/replay/`) run on every
//! build: each `NAME.in` with the flags in `NAME.args`, if present, must print `NAME.out`, where
//! an expected line that is just `ERR` matches any line starting with `ERR`. When `shared/` sits
//! beside the checkout (as in CI), its examples run too. Nothing here sleeps to synchronise: a
//! reader thread hands lines over a channel, and the test waits for them with a generous deadline.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// How long a test waits for a line from the binary before it gives up.
const DEADLINE: Duration = Duration::from_secs(10);

fn capataz() -> Command {
    Command::new(env!("CARGO_BIN_EXE_capataz"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether `actual` is what `expected` asks for, line by line, with the `ERR` rule.
fn lines_match(expected: &str, actual: &str) -> bool {
    let expected: Vec<&str> = expected.lines().collect();
    let actual: Vec<&str> = actual.lines().collect();
    expected.len() == actual.len()
        && expected
            .iter()
            .zip(&actual)
            .all(|(e, a)| e == a || (*e == "ERR" && a.starts_with("ERR")))
}

/// Runs `capataz replay` with `args`, feeding it `stdin`.
fn replay(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = capataz()
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the capataz binary runs");
    let mut input = child.stdin.take().expect("stdin is piped");
    let stdin = stdin.to_vec();
    // Write from another thread, so a large script cannot deadlock against a full stdout pipe.
    let writer = thread::spawn(move || input.write_all(&stdin));
    let output = child.wait_with_output().expect("capataz replay finishes");
    match writer.join().expect("the writer thread does not panic") {
        // A binary that stops early (a usage error) need not read its input.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("writing stdin: {e}"),
        _ => output,
    }
}

/// Runs every `NAME.in` in `dir` and returns how many ran; panics listing every mismatch.
fn run_examples(dir: &Path) -> usize {
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "in"))
        .collect();
    scripts.sort();
    let mut failures = Vec::new();
    for script in &scripts {
        let expected = std::fs::read_to_string(script.with_extension("out"))
            .unwrap_or_else(|e| panic!("{} has no readable .out: {e}", script.display()));
        let args = std::fs::read_to_string(script.with_extension("args")).unwrap_or_default();
        let mut command = capataz();
        command
            .arg("replay")
            .args(args.split_whitespace())
            .arg(script);
        let output = command.output().expect("the capataz binary runs");
        let stdout = text(&output.stdout);
        let stderr = text(&output.stderr);
        if !output.status.success() || !lines_match(&expected, &stdout) || !stderr.is_empty() {
            failures.push(format!(
                "{} (flags {:?}): {}\n--- expected\n{expected}--- stdout\n{stdout}--- stderr\n{stderr}",
                script.display(),
                args.trim(),
                output.status,
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    scripts.len()
}

/// Kills the child if the test panics before it ends, so no process outlives a failed test.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Hands every line of `output` over a channel, from a thread of its own.
fn lines_of(output: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

fn next_line(lines: &mpsc::Receiver<String>, after: &str) -> String {
    lines
        .recv_timeout(DEADLINE)
        .unwrap_or_else(|e| panic!("no output line within {DEADLINE:?} after {after:?}: {e}"))
}

#[test]
fn bundled_examples() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replay-examples");
    assert!(run_examples(&dir) >= 4, "the bundled examples went missing");
}

/// The examples of the steering repository's `shared/`, laid beside the repository (as CI and
/// the main checkout have it): a test of the `peers` tier, since it reads outside the repository.
#[test]
fn shared_examples() {
    let dir = crate::support::tools::require_path(
        &crate::support::tools::repo().join("../shared/examples/replay"),
        "the shared replay examples, from the `shared/` directory laid beside the repository \
         (CI's checkout has it)",
    );
    assert!(run_examples(&dir) > 0, "no example in {}", dir.display());
}

#[test]
fn lines_match_applies_the_err_rule() {
    assert!(lines_match(
        "OK\nERR\na UP\n",
        "OK\nERR unknown backend \"x\"\na UP\n"
    ));
    assert!(lines_match("ERR\n", "ERR\n"));
    assert!(!lines_match("ERR\n", "OK\n"));
    assert!(!lines_match("ERR unknown\n", "ERR other\n"));
    assert!(!lines_match("OK\n", "OK\nOK\n"));
    assert!(!lines_match("OK\nOK\n", "OK\n"));
}

#[test]
fn reads_the_script_from_stdin() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replay-examples");
    let script = std::fs::read(dir.join("passive-and-rule.in")).unwrap();
    let expected = std::fs::read_to_string(dir.join("passive-and-rule.out")).unwrap();
    let output = replay(&[], &script);
    assert!(output.status.success(), "{output:?}");
    assert!(lines_match(&expected, &text(&output.stdout)), "{output:?}");
    assert_eq!(text(&output.stderr), "");
}

#[test]
fn explain_writes_each_verdict_change_to_stderr() {
    let script = b"POOL a b\nPROBE a TIMEOUT\nPROBE a TIMEOUT\nPROBE a TIMEOUT\n\
        PROBE a HTTP/1.1 200 OK\nPROBE a HTTP/1.1 204\n\
        OBSERVE b RESET\nOBSERVE b HTTP/1.1 502 Bad Gateway\nOBSERVE b garbage\n\
        OBSERVE b HTTP/1.1 404 Not Found\nSTATUS\n";
    let output = replay(&["--explain"], script);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        text(&output.stdout),
        "OK\nFAIL\nFAIL\nFAIL\nPASS\nPASS\nERROR\nERROR\nERROR\nOK\na UP\nb UP\n"
    );
    assert_eq!(
        text(&output.stderr),
        "a UP -> DOWN: 3 consecutive failed probes, last: TIMEOUT\n\
         a DOWN -> UP: 2 consecutive passing probes, last: HTTP 204\n\
         b UP -> DOWN: 3 consecutive traffic errors, last: malformed status line\n\
         b DOWN -> UP: a good response ended the error streak, last: HTTP 404\n"
    );
    // Without the flag, the same script says nothing on stderr.
    let quiet = replay(&[], script);
    assert_eq!(quiet.stdout, output.stdout);
    assert_eq!(text(&quiet.stderr), "");
}

#[test]
fn explain_follows_the_thresholds() {
    let output = replay(
        &["--explain", "--fall", "1", "--rise", "1"],
        b"POOL a\nPROBE a REFUSED\nPROBE a HTTP/1.1 200 OK\n",
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        text(&output.stderr),
        "a UP -> DOWN: 1 failed probe, last: REFUSED\n\
         a DOWN -> UP: 1 passing probe, last: HTTP 200\n"
    );
}

#[test]
fn consecutive_errors_flag_sets_the_ejection_streak() {
    let script = b"POOL a\nOBSERVE a TIMEOUT\nSTATUS\nOBSERVE a TIMEOUT\nSTATUS\n";
    let output = replay(&["--consecutive-errors", "2"], script);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(text(&output.stdout), "OK\nERROR\na UP\nERROR\na DOWN\n");
}

#[test]
fn invalid_thresholds_exit_2_with_a_message() {
    for args in [
        ["--rise", "0"],
        ["--fall", "0"],
        ["--consecutive-errors", "0"],
        ["--rise", "x"],
        ["--consecutive-errors", "many"],
    ] {
        let output = replay(&args, b"POOL a\nSTATUS\n");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains(args[0]),
            "{args:?}: the message should name the flag: {stderr}"
        );
        assert_eq!(text(&output.stdout), "", "{args:?}: nothing may run");
    }
}

#[test]
fn exits_0_at_the_end_of_input() {
    let empty = replay(&[], b"");
    assert!(empty.status.success(), "{empty:?}");
    assert_eq!(
        (text(&empty.stdout), text(&empty.stderr)),
        (String::new(), String::new())
    );
    // A last line without its line ending still runs; ERR lines do not change the exit code.
    let output = replay(&[], b"POOL a\nBOGUS\nHEALTHY");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        lines_match("OK\nERR\na\n", &text(&output.stdout)),
        "{output:?}"
    );
}

#[test]
fn an_overlong_line_is_an_err_and_the_run_goes_on() {
    // 64 KiB of line is read whole; 1 MiB more is skipped, never held, and the next line runs.
    let mut script = b"POOL a\n".to_vec();
    script.extend(std::iter::repeat_n(b'x', 1 << 20));
    script.extend_from_slice(b"\nHEALTHY\n");
    // The same at the very end of the input, without a line ending.
    script.extend(std::iter::repeat_n(b'y', (64 << 10) + 1));
    let output = replay(&[], &script);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        text(&output.stdout),
        "OK\nERR line longer than 65536 bytes\na\nERR line longer than 65536 bytes\n"
    );
    // A line of exactly the limit is read whole (an unknown command here).
    let mut script = vec![b'z'; 64 << 10];
    script.push(b'\n');
    let output = replay(&[], &script);
    assert!(
        text(&output.stdout).starts_with("ERR unknown command"),
        "{output:?}"
    );
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let missing = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/no-such-script.in");
    let output = capataz()
        .arg("replay")
        .arg(&missing)
        .output()
        .expect("the capataz binary runs");
    assert!(!output.status.success(), "{output:?}");
    assert_ne!(
        output.status.code(),
        Some(2),
        "not a usage error: {output:?}"
    );
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("no-such-script.in"),
        "the message should name the file: {stderr}"
    );
    assert!(
        stderr.contains("cannot open"),
        "the message should say what failed: {stderr}"
    );
    assert_eq!(text(&output.stdout), "");
}

#[test]
fn streams_results_before_the_input_ends() {
    let mut child = capataz()
        .arg("replay")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the capataz binary runs");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let lines = lines_of(child.stdout.take().expect("stdout is piped"));
    let mut child = Running(child);

    stdin.write_all(b"POOL a\n").unwrap();
    stdin.flush().unwrap();
    assert_eq!(next_line(&lines, "POOL a"), "OK");
    stdin.write_all(b"STATUS\n").unwrap();
    stdin.flush().unwrap();
    assert_eq!(next_line(&lines, "STATUS"), "a UP");
    stdin.write_all(b"PROBE a TIMEOUT\r\n").unwrap();
    stdin.flush().unwrap();
    assert_eq!(next_line(&lines, "PROBE a TIMEOUT"), "FAIL");

    drop(stdin);
    let status = child.0.wait().expect("capataz replay ends at end of input");
    assert!(status.success(), "{status}");
    assert!(
        lines.recv_timeout(DEADLINE).is_err(),
        "nothing after the end of input"
    );
}

#[test]
fn a_closed_stdout_is_a_normal_stop() {
    // `capataz replay script | head -1`: far more output than a pipe holds, and the reader
    // leaves after one line.
    let mut child = capataz()
        .arg("replay")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the capataz binary runs");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut child = Running(child);
    let writer = thread::spawn(move || {
        let mut script = b"POOL a\n".to_vec();
        script.extend(b"HEALTHY\n".repeat(200_000));
        // The binary may stop reading once its stdout is gone; that is what this test is about.
        let _ = stdin.write_all(&script);
    });
    // Read one line, then close the pipe.
    let (send, first) = mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = send.send(line);
    });
    assert_eq!(next_line(&first, "POOL a"), "OK\n");
    let status = child.0.wait().expect("capataz replay ends");
    writer.join().expect("the writer thread does not panic");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(stderr, "");
}
