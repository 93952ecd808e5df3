//! The command line's habits: `capataz run` and `capataz check` take the
//! configuration file both as an argument and as `--config`; `capataz check` exits 0 on a valid
//! file with warnings, as `nginx -t` and `haproxy -c` do, and 1 only under `--strict`; the
//! example configuration shipped in `contrib/` passes `capataz check` without a warning.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::process::{Capataz, TempFile};

fn capataz(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_capataz"))
        .args(args)
        .output()
        .expect("the capataz binary runs")
}

fn text(output: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A valid config whose `rise = 1` draws one warning; its listener on an ephemeral port.
const WARNED: &str = r#"
[[listeners]]
name = "front"
address = "127.0.0.1:0"

[pools.web]
backends = [{ name = "one", address = "127.0.0.1:9" }]

[pools.web.active]
rise = 1
"#;

#[test]
fn run_takes_its_config_file_as_an_argument_as_check_does() {
    let config = TempFile::new("run-positional.toml", WARNED);
    let path = config.path().to_str().expect("a UTF-8 path");
    let mut running = Capataz::spawn(&["run", path], &[]);
    let line = running.wait_line("the listening line", |l| {
        l.contains("listening") || l.contains("error")
    });
    assert!(
        line.contains("listener=front"),
        "{line}\n{}",
        running.stderr()
    );
    running.signal("TERM");
    let status = running.wait_exit();
    assert!(status.success(), "{status}\n{}", running.stderr());
}

#[test]
fn run_and_check_refuse_two_different_config_files() {
    let one = TempFile::new("one.toml", WARNED);
    let two = TempFile::new("two.toml", WARNED);
    let (one, two) = (
        one.path().to_str().expect("UTF-8"),
        two.path().to_str().expect("UTF-8"),
    );
    for subcommand in ["run", "check"] {
        let output = capataz(&[subcommand, one, "--config", two]);
        assert_eq!(output.status.code(), Some(2), "{}", text(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!(
                "two configuration files, {one} and --config {two}"
            )),
            "{subcommand}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("capataz {subcommand}")),
            "the usage of {subcommand}: {stderr}"
        );
        assert!(!stderr.contains("listening"), "{stderr}");
    }
}

#[test]
fn check_takes_the_same_file_given_both_ways_and_run_needs_one() {
    let config = TempFile::new("both.toml", WARNED);
    let path = config.path().to_str().expect("UTF-8");
    let output = capataz(&["check", path, "-c", path]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let output = capataz(&["check", "--config", path]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    for subcommand in ["run", "check"] {
        let output = capataz(&[subcommand]);
        assert_eq!(output.status.code(), Some(2), "{}", text(&output));
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(&format!(
                "no configuration file: capataz {subcommand} FILE (or --config FILE)"
            )),
            "{}",
            text(&output)
        );
    }
}

#[test]
fn check_with_warnings_exits_0_so_check_and_deploy_works() {
    let config = TempFile::new("warned.toml", WARNED);
    let path = config.path().to_str().expect("UTF-8");
    let output = capataz(&["check", path]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(
        stdout.contains("warning: ") && stdout.contains("pools.web.active.rise"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{path}: valid (1 listeners, 1 pools, 1 backends, 1 warnings)"
        )),
        "{stdout}"
    );
}

#[test]
fn check_strict_exits_1_on_warnings_and_0_without() {
    let config = TempFile::new("strict.toml", WARNED);
    let path = config.path().to_str().expect("UTF-8");
    let output = capataz(&["check", "--strict", path]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("1 warnings)"),
        "{}",
        text(&output)
    );
    let clean = TempFile::new("clean.toml", &WARNED.replace("rise = 1", "rise = 2"));
    let output = capataz(&["check", "--strict", clean.path().to_str().expect("UTF-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    // Invalid stays 2, strict or not.
    let bad = TempFile::new("bad.toml", &WARNED.replace("rise = 1", "rise = 0"));
    for args in [&["check"][..], &["check", "--strict"]] {
        let mut args = args.to_vec();
        args.push(bad.path().to_str().expect("UTF-8"));
        let output = capataz(&args);
        assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    }
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn the_example_config_passes_check_strict_and_documents_only_real_keys() {
    let path = repo().join("contrib/capataz.toml");
    let output = capataz(&["check", "--strict", path.to_str().expect("UTF-8")]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !stdout.contains("warning:") && stdout.contains(" 0 warnings)"),
        "{stdout}"
    );
    // The path the systemd unit runs it from, and the line that installs it there.
    let unit =
        std::fs::read_to_string(repo().join("contrib/systemd/capataz.service")).expect("the unit");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/capataz run --config /etc/capataz/capataz.toml"),
        "{unit}"
    );
    let install = "install -D -m 0640 -g capataz contrib/capataz.toml /etc/capataz/capataz.toml";
    for file in ["contrib/systemd/capataz.service", "docs/operating.md"] {
        let text = std::fs::read_to_string(repo().join(file)).expect(file);
        assert!(text.contains(install), "{file} does not say {install:?}");
    }
    // Every key it sets has a row in docs/config.md.
    let example = std::fs::read_to_string(&path).expect("the example");
    let reference = std::fs::read_to_string(repo().join("docs/config.md")).expect("config.md");
    let value: toml::Value = toml::from_str(&example).expect("TOML");
    let mut keys = Vec::new();
    collect_keys(&value, &mut keys);
    assert!(keys.len() > 10, "{keys:?}");
    for key in keys {
        assert!(
            reference.contains(&format!("| `{key}` |")),
            "contrib/capataz.toml sets {key}, which docs/config.md does not document"
        );
    }
}

/// The names of the keys holding values (not tables) in `value`, depth first.
fn collect_keys(value: &toml::Value, keys: &mut Vec<String>) {
    let Some(table) = value.as_table() else {
        return;
    };
    for (key, value) in table {
        match value {
            toml::Value::Table(_) => collect_keys(value, keys),
            toml::Value::Array(items) if items.iter().all(toml::Value::is_table) => {
                items.iter().for_each(|item| collect_keys(item, keys));
            }
            _ => keys.push(key.clone()),
        }
    }
}
