//! What a newcomer reads and types in the first hour, held to what the
//! binary and the scripts do: every `capataz <subcommand>` the docs name exists; every install
//! line is the same `cargo install --locked --path crates/capataz`; the test dependencies
//! install nothing with pip (Debian's own Python refuses it); the gRPC tests run Debian's
//! Python, not whichever `python3` comes first on PATH.

use std::path::{Path, PathBuf};

use crate::support::process::subcommands;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The files a user reads: the README, the docs, the architecture and benchmark notes, what
/// ships in contrib/, and the Containerfile.
fn user_docs() -> Vec<(String, String)> {
    let mut paths: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "Containerfile",
    ]
    .iter()
    .map(|p| repo().join(p))
    .collect();
    for dir in ["docs", "bench", "contrib", "contrib/systemd"] {
        for entry in std::fs::read_dir(repo().join(dir)).expect(dir) {
            let path = entry.expect("an entry").path();
            let name = path.to_string_lossy();
            if name.ends_with(".md") || name.ends_with(".service") || name.ends_with(".toml") {
                paths.push(path);
            }
        }
    }
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = path
                .strip_prefix(repo())
                .unwrap_or(&path)
                .display()
                .to_string();
            (name, text)
        })
        .collect()
}

/// The `capataz ...` command lines of `text`: the code spans that start with `capataz `, and
/// in code blocks (indented or fenced) each shell command (split at `&&`, `||`, `|`, `;`,
/// `$(`; comments dropped) whose program is `capataz` or a path ending in `/capataz`. Each as
/// its words after the program, with the line number.
fn commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        for span in line.split('`').skip(1).step_by(2) {
            if let Some(rest) = span.strip_prefix("capataz ") {
                found.push((i + 1, rest.split_whitespace().map(str::to_owned).collect()));
            }
        }
        if !(fenced || line.starts_with("    ")) {
            continue;
        }
        let code = line.split(" #").next().unwrap_or_default();
        let code = code
            .replace("&&", ";")
            .replace("||", ";")
            .replace("$(", ";");
        for command in code.split([';', '|']) {
            let mut words = command
                .split_whitespace()
                .skip_while(|w| w.contains('=') || matches!(*w, "env" | "sudo" | "exec"));
            let program = words.next().unwrap_or_default();
            if program == "capataz" || program.ends_with("/capataz") {
                found.push((i + 1, words.map(str::to_owned).collect()));
            }
        }
    }
    found
}

#[test]
fn every_capataz_command_in_the_docs_is_a_real_subcommand() {
    let mut top = subcommands(&[]);
    top.push("help".to_owned());
    let ctl = subcommands(&["ctl"]);
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (file, text) in user_docs() {
        for (line, words) in commands(&text) {
            let Some(first) = words.first() else { continue };
            if !first.starts_with(|c: char| c.is_ascii_lowercase()) {
                continue; // a flag (`capataz --version`), a placeholder
            }
            let first = first.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
            seen += 1;
            if !top.iter().any(|c| c == first) {
                wrong.push(format!("{file}:{line}: capataz {}", words.join(" ")));
            } else if first == "ctl" {
                if let Some(action) = words
                    .get(1)
                    .filter(|w| w.starts_with(|c: char| c.is_ascii_lowercase()))
                {
                    let action = action.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
                    if !ctl.iter().any(|c| c == action) {
                        wrong.push(format!("{file}:{line}: capataz {}", words.join(" ")));
                    }
                }
            }
        }
    }
    assert!(seen > 50, "only {seen} commands found: the scan is broken");
    assert!(
        wrong.is_empty(),
        "commands that are not subcommands of capataz ({top:?}, ctl {ctl:?}):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_command_scan_finds_what_it_must() {
    let text = "Run `capataz record web` and\n\n    capataz check a.toml && capataz bogus # capataz nope\n    \
                install -g capataz capataz.toml\n    X=1 /usr/local/bin/capataz run --config f\n";
    let found: Vec<String> = commands(text)
        .into_iter()
        .map(|(line, words)| format!("{line}:{}", words.first().cloned().unwrap_or_default()))
        .collect();
    assert_eq!(found, ["1:record", "3:check", "3:bogus", "5:run"]);
}

#[test]
fn every_install_line_is_cargo_install_locked_from_crates_capataz() {
    let mut lines = 0;
    for (file, text) in user_docs() {
        for (i, line) in text.lines().enumerate() {
            // A command, not the name in prose (`cargo install` builds ...).
            for (at, _) in line.match_indices("cargo install ") {
                lines += 1;
                assert!(
                    line[at..].starts_with("cargo install --locked --path crates/capataz"),
                "{file}:{}: {line}\nthe install line is `cargo install --locked --path crates/capataz` \
                 (without --locked, cargo resolves every dependency anew, to versions never tested)",
                    i + 1
                );
            }
        }
    }
    assert!(lines >= 6, "only {lines} install lines found");
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    assert!(
        readme.contains("target/debug/capataz"),
        "the README says where `cargo run` leaves the binary"
    );
}

#[test]
fn the_test_dependencies_install_nothing_with_pip() {
    let dir = repo().join(".ci/deps");
    let mut scripts = 0;
    for entry in std::fs::read_dir(&dir).expect(".ci/deps") {
        let path = entry.expect("an entry").path();
        let text = std::fs::read_to_string(&path).expect("a script");
        scripts += 1;
        for (i, line) in text.lines().enumerate() {
            let code = line.split('#').next().unwrap_or_default();
            assert!(
                !code.contains("pip ") && !code.contains("pip3 ") && !code.contains("-m pip"),
                "{}:{}: {line}\nDebian's Python refuses pip installs \
                 (externally-managed-environment): use Debian's packages",
                path.display(),
                i + 1
            );
        }
    }
    assert!(scripts >= 10, "{scripts}");
    let grpcio = std::fs::read_to_string(dir.join("grpcio.sh")).expect("grpcio.sh");
    assert!(grpcio.contains(".ci/apt-install") && grpcio.contains("python3-grpcio"));
}

#[test]
fn the_grpc_peers_run_on_debians_python_with_debians_grpcio() {
    // The interpreter the gRPC tests use, whatever is first on PATH.
    if std::env::var_os("CAPATAZ_TEST_PYTHON").is_none() {
        assert_eq!(crate::support::grpc::python(), "/usr/bin/python3");
    }
    // Its grpcio is enough for the server: no grpcio-health-checking (Debian 12 has no
    // package of it), the health check is served by server.py itself.
    let server =
        std::fs::read_to_string(repo().join("crates/capataz/tests/support/grpc/server.py"))
            .expect("server.py");
    assert!(
        !server.contains("grpc_health"),
        "server.py imports grpc_health"
    );
    let mut child = crate::support::grpc::peer("server.py")
        .arg("probe")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}: {}", crate::support::grpc::missing()));
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the port line");
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.trim().parse::<u16>().is_ok(),
        "server.py did not start on {}: {line:?}; {}",
        crate::support::grpc::python(),
        crate::support::grpc::missing()
    );
}
