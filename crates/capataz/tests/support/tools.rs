//! What tests need from outside the repository: the real peers they run (Knot DNS, etcd, nginx,
//! pebble, Prometheus, OpenSSL, curl, h2load, ChromeDriver, tmux, groff, systemd-analyze) and
//! the files beside the repository. One rule for all: a test never skips because one is
//! missing, it fails, saying what to install and with which `.ci/deps` script (the scripts
//! `.ci/test` and CI run). Such tests form the `peers` tier (`.config/nextest.toml`, README.md
//! "Tests"): run in the `fast` or `local` tier, [`require_tool`] fails too, saying so, so that
//! a test that needs a peer cannot hide among those that do not.

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn repo() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    repo.canonicalize().unwrap_or(repo)
}

/// Where the program `name` is (where Debian's packages put it, `/usr/bin` or `/usr/sbin`, first;
/// then `PATH`), or a failure saying to run `.ci/deps/<script>.sh`, which installs it.
pub fn require_tool(name: &str, script: &str) -> PathBuf {
    if let Ok(tier @ ("fast" | "local")) = std::env::var("NEXTEST_PROFILE").as_deref() {
        panic!(
            "this test runs `{name}`, a real peer, in the `{tier}` tier: its module belongs to \
             the `peers` tier's filter in .config/nextest.toml"
        );
    }
    find_tool(name, script).unwrap_or_else(|missing| panic!("{missing}"))
}

/// [`require_tool`] without the tier rule: the program's path, or what to say when it is missing.
pub fn find_tool(name: &str, script: &str) -> Result<PathBuf, String> {
    let deps = format!(".ci/deps/{script}.sh");
    assert!(
        repo().join(&deps).is_file(),
        "require_tool({name:?}, {script:?}): there is no {deps} to install it"
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["/usr/bin", "/usr/sbin"]
        .into_iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            format!(
                "`{name}` is not installed, and this test runs it: run `bash {deps}` (as \
                 `.ci/test` and CI do; it installs Debian packages, so as root)"
            )
        })
}

/// `path`, outside the repository, which a test reads, or a failure saying what it is (`what`:
/// what it holds and where it comes from).
pub fn require_path(path: &Path, what: &str) -> PathBuf {
    assert!(path.exists(), "{} is missing: {what}", path.display());
    path.to_path_buf()
}
