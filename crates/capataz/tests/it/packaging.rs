//! What ships around the binary: shell completions generated from the command line's
//! definition, the systemd unit, and the license files (the manual page: `manual.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::process::subcommands;
use crate::support::tools::require_tool;

fn capataz(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .args(args)
        .output()
        .expect("the capataz binary runs");
    assert!(
        output.status.success(),
        "capataz {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn completions_name_every_subcommand_in_every_shell() {
    let top = subcommands(&[]);
    for expected in ["run", "check", "completions", "man", "ctl"] {
        assert!(
            top.iter().any(|c| c == expected),
            "{expected} missing from {top:?}"
        );
    }
    let ctl = subcommands(&["ctl"]);
    assert!(ctl.iter().any(|c| c == "drain"), "{ctl:?}");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script =
            String::from_utf8(capataz(&["completions", shell]).stdout).expect("a UTF-8 script");
        for name in top.iter().chain(&ctl) {
            assert!(
                script.contains(name.as_str()),
                "the {shell} completions do not name {name}"
            );
        }
    }
    // Flags too, and the choices of a value.
    let bash = String::from_utf8(capataz(&["completions", "bash"]).stdout).expect("UTF-8");
    assert!(
        bash.contains("--config") && bash.contains("--log-format"),
        "{bash}"
    );
}

#[test]
fn completions_refuse_an_unknown_shell() {
    let output = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .args(["completions", "tcsh"])
        .output()
        .expect("the capataz binary runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("tcsh"));
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(repo().join("contrib/systemd/capataz.service"))
        .expect("contrib/systemd/capataz.service");
    for line in [
        "Type=notify",
        "NotifyAccess=all",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line}");
    }
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let dir = std::env::temp_dir().join(format!("capataz-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("capataz.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/capataz", env!("CARGO_BIN_EXE_capataz")),
    )
    .expect("write the unit");
    let output = Command::new(require_tool("systemd-analyze", "systemd"))
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    let _ = std::fs::remove_dir_all(&dir);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "systemd-analyze verify failed:\n{said}"
    );
    // Unknown keys and the like are warnings only: none is acceptable.
    assert!(
        said.trim().is_empty(),
        "systemd-analyze verify says:\n{said}"
    );
}

#[test]
fn the_license_files_match_the_cargo_license_field() {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest
            .lines()
            .any(|l| l == r#"license = "MIT OR Apache-2.0""#),
        "the license field changed: update the LICENSE files and this test"
    );
    let mit = std::fs::read_to_string(repo().join("LICENSE-MIT")).expect("LICENSE-MIT");
    assert!(
        mit.contains("Permission is hereby granted, free of charge"),
        "{mit}"
    );
    let apache = std::fs::read_to_string(repo().join("LICENSE-APACHE")).expect("LICENSE-APACHE");
    assert!(apache.contains("Apache License\n                           Version 2.0, January 2004"));
    assert!(apache.contains("END OF TERMS AND CONDITIONS"));
}
