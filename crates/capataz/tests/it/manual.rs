//! `capataz man`, capataz(1): it renders with groff without a warning, has every section a
//! manual needs, documents every subcommand and every environment variable the code reads (the
//! list is found by reading `src/`, so a new variable without its paragraph fails here), and
//! names no manual page that does not exist.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::process::subcommands;

fn page() -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .arg("man")
        .output()
        .expect("the capataz binary runs");
    assert!(output.status.success(), "capataz man: {}", output.status);
    String::from_utf8(output.stdout).expect("a UTF-8 page")
}

/// The page as groff renders it for a terminal, with groff's warnings (all of them on).
fn rendered(page: &str) -> (String, String) {
    use std::io::Write as _;
    let mut groff = Command::new(crate::support::tools::require_tool("groff", "groff"))
        .args(["-man", "-Tutf8", "-ww", "-rLL=100n", "-rHY=0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("groff runs");
    groff
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("groff reads the page");
    let output = groff.wait_with_output().expect("groff ends");
    assert!(output.status.success(), "groff: {}", output.status);
    // Bold and underline are overstrikes in groff's terminal output: keep the letters; and
    // read its typographic minus signs, hyphens and quotes as the ASCII ones typed.
    let text = String::from_utf8_lossy(&output.stdout);
    let mut plain = String::new();
    for c in text.chars() {
        match c {
            '\u{8}' => {
                plain.pop();
            }
            '\u{2212}' | '\u{2010}' => plain.push('-'),
            '\u{2018}' | '\u{2019}' => plain.push('\''),
            '\u{201c}' | '\u{201d}' => plain.push('"'),
            c => plain.push(c),
        }
    }
    (plain, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn the_manual_renders_with_every_section_and_every_subcommand_with_its_options() {
    let page = page();
    assert!(page.contains(".TH capataz 1"), "no title header:\n{page}");
    let (text, warnings) = rendered(&page);
    assert!(warnings.trim().is_empty(), "groff warns:\n{warnings}");
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "SUBCOMMANDS",
        "SIGNALS",
        "FILES",
        "ENVIRONMENT",
        "EXIT STATUS",
        "SEE ALSO",
    ] {
        assert!(
            text.lines().any(|l| l == section),
            "no {section} section in:\n{text}"
        );
    }
    let top = subcommands(&[]);
    assert!(top.len() >= 9, "{top:?}");
    for name in &top {
        // Its own subsection, and its options as `capataz NAME --help` lists them.
        let heading = format!("   capataz {name}");
        assert!(
            text.lines().any(|l| l == heading),
            "no subsection for capataz {name} in:\n{text}"
        );
        let subsection = subsection(&text, &heading);
        for option in options(&[name]) {
            assert!(
                subsection.contains(&option),
                "capataz {name}: {option} is not in its subsection:\n{subsection}"
            );
        }
        // Its exit status, said by name.
        let exit = text.split("EXIT STATUS").nth(1).expect("checked above");
        assert!(
            exit.contains(&format!("capataz {name}")),
            "EXIT STATUS does not say what capataz {name} exits with:\n{exit}"
        );
    }
    for name in subcommands(&["ctl"]) {
        assert!(
            text.lines().any(|l| l == format!("   capataz ctl {name}")),
            "no subsection for capataz ctl {name} in:\n{text}"
        );
    }
    for signal in ["SIGHUP", "SIGTERM", "SIGINT", "SIGUSR2"] {
        let signals = text
            .split("\nSIGNALS\n")
            .nth(1)
            .and_then(|s| s.split("\nFILES\n").next())
            .expect("checked above");
        assert!(signals.contains(signal), "{signal} missing:\n{signals}");
    }
    assert!(
        text.contains("docs/config.md"),
        "no pointer to docs/config.md"
    );
    assert!(
        text.contains("/etc/capataz/capataz.toml"),
        "FILES names the unit's config"
    );
}

/// The text under `heading` up to the next subsection or section.
fn subsection<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text.find(&format!("\n{heading}\n")).expect("the heading") + heading.len() + 2;
    let rest = &text[start..];
    // The next heading: a subsection (`   capataz ...` alone on its line) or a section.
    let end = rest
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|&i| {
            let line = rest[i..].lines().next().unwrap_or_default();
            line.starts_with("   capataz ") || line.starts_with(|c: char| c.is_ascii_uppercase())
        })
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The long options `capataz <args> --help` lists, without --help and --version.
fn options(args: &[&str]) -> Vec<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .args(args)
        .arg("--help")
        .output()
        .expect("the capataz binary runs");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    help.split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches([',', '.', ')', ']'])
                .split(['=', '['])
                .next()
                .unwrap_or(w)
                .to_owned()
        })
        .filter(|w| w != "--help" && w != "--version")
        .collect()
}

#[test]
fn the_manual_documents_every_environment_variable_the_code_reads() {
    let (text, _) = rendered(&page());
    let environment = text
        .split("\nENVIRONMENT\n")
        .nth(1)
        .and_then(|s| s.split("\nEXIT STATUS\n").next())
        .expect("an ENVIRONMENT section");
    let read = variables_read();
    for expected in [
        "CAPATAZ_WORKER_THREADS",
        "CAPATAZ_ADMIN_TOKEN",
        "NOTIFY_SOCKET",
        "RUST_LOG",
        "_RJEM_MALLOC_CONF",
    ] {
        assert!(
            read.contains(expected),
            "{expected} not found in src/: {read:?}"
        );
    }
    for name in &read {
        assert!(
            environment.contains(name.as_str()),
            "the code reads {name}, which the manual's ENVIRONMENT does not document:\n{environment}"
        );
    }
    // jemalloc's options as main.rs sets them.
    let main = std::fs::read_to_string(src().join("main.rs")).expect("main.rs");
    let conf = main
        .split("b\"")
        .nth(1)
        .and_then(|s| s.split("\\0\"").next())
        .expect("MALLOC_CONF in main.rs");
    assert!(
        environment.contains(conf),
        "the manual does not give jemalloc's options ({conf}):\n{environment}"
    );
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `src/` of every crate of the workspace (the runtime's layers are crates of their own).
fn every_src() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("read crates/")
        .map(|entry| entry.expect("an entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Every environment variable the code of the crates' `src/` reads: `env::var("NAME")` and
/// `env::var_os(CONST)` (with `const CONST: &str = "NAME"`), clap's `env = "NAME"`, tracing's
/// default filter (RUST_LOG), jemalloc's options (_RJEM_MALLOC_CONF), and the system roots of
/// rustls-native-certs (SSL_CERT_FILE, SSL_CERT_DIR). A read of a name held in a variable is
/// allowed in one place only: the config file's `${NAME}` substitution.
fn variables_read() -> BTreeSet<String> {
    let mut files = Vec::new();
    let mut stack = every_src();
    assert!(
        ["capataz/src", "capataz-runtime/src", "capataz-admin/src"]
            .iter()
            .all(|crate_src| stack.iter().any(|dir| dir.ends_with(crate_src))),
        "{stack:?}"
    );
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let code = std::fs::read_to_string(&path).expect("a source file");
                files.push((path, code));
            }
        }
    }
    let constants: Vec<(String, String)> = files
        .iter()
        .flat_map(|(_, code)| code.lines())
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = ["pub(crate) ", "pub "]
                .iter()
                .find_map(|visibility| line.strip_prefix(visibility))
                .unwrap_or(line);
            let rest = rest.strip_prefix("const ")?;
            let (name, value) = rest.split_once(": &str = \"")?;
            Some((name.to_owned(), value.split('"').next()?.to_owned()))
        })
        .collect();
    let mut read = BTreeSet::new();
    for (path, code) in &files {
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for call in ["env::var(", "env::var_os("] {
                for (at, _) in line.match_indices(call) {
                    let argument = line[at + call.len()..]
                        .split(')')
                        .next()
                        .unwrap_or_default()
                        .trim();
                    if let Some(literal) = argument.strip_prefix('"') {
                        read.insert(literal.trim_end_matches('"').to_owned());
                    } else if let Some((_, value)) =
                        constants.iter().find(|(name, _)| name == argument)
                    {
                        read.insert(value.clone());
                    } else {
                        assert!(
                            path.ends_with("capataz-config/src/parse/env.rs"),
                            "{}: reads the variable named by {argument}: add it to the manual \
                             and to this test",
                            path.display()
                        );
                    }
                }
            }
            // clap's `env = "NAME"`, not `target_env = "..."`.
            for (at, _) in line.match_indices("env = \"") {
                let before = line[..at].chars().next_back();
                if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                    let rest = &line[at + "env = \"".len()..];
                    read.insert(rest.split('"').next().unwrap_or_default().to_owned());
                }
            }
            if line.contains("from_default_env") {
                read.insert("RUST_LOG".to_owned());
            }
            if line.contains("_rjem_malloc_conf") {
                read.insert("_RJEM_MALLOC_CONF".to_owned());
            }
            if line.contains("rustls_native_certs::load_native_certs") {
                read.insert("SSL_CERT_FILE".to_owned());
                read.insert("SSL_CERT_DIR".to_owned());
            }
        }
    }
    read
}

#[test]
fn the_manual_names_no_page_that_does_not_exist() {
    let page = page();
    let (text, _) = rendered(&page);
    // A reference is `name(section)`: the only page capataz ships is capataz(1).
    let mut references = BTreeSet::new();
    for (at, _) in text.match_indices('(') {
        let section: String = text[at + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let closes = text[at + 1 + section.len()..].starts_with(')');
        if !closes || !section.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let name: String = text[..at]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if !name.is_empty() {
            references.insert(format!("{name}({section})"));
        }
    }
    let dangling: Vec<_> = references.iter().filter(|r| *r != "capataz(1)").collect();
    assert!(
        dangling.is_empty(),
        "the manual names pages that are not shipped: {dangling:?}"
    );
    assert!(!page.contains("capataz\\-run(1)"), "{page}");
}
