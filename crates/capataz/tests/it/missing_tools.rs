//! The rule for what tests need from outside the repository (`support::tools`): a missing
//! program or file fails the test, saying what to install and with which `.ci/deps` script;
//! nothing skips.

use crate::support::tools::{find_tool, repo, require_path};

#[test]
fn a_missing_program_fails_naming_the_script_that_installs_it() {
    let missing = find_tool("capataz-test-no-such-program", "knot").expect_err("not installed");
    assert!(
        missing.contains("`capataz-test-no-such-program` is not installed")
            && missing.contains("run `bash .ci/deps/knot.sh`"),
        "{missing}"
    );
}

#[test]
fn a_program_there_is_found_where_debian_puts_it() {
    // `sh` is on every machine the tests run on, in /usr/bin (merged /usr) or on PATH.
    let sh = find_tool("sh", "curl").expect("sh is found");
    assert!(sh.is_file() && sh.ends_with("sh"), "{}", sh.display());
}

#[test]
#[should_panic(expected = "there is no .ci/deps/no-such-script.sh to install it")]
fn a_script_that_does_not_exist_is_refused() {
    let _ = find_tool("sh", "no-such-script");
}

#[test]
#[should_panic(expected = "is missing: a file no test has")]
fn a_missing_path_fails_saying_what_it_is() {
    require_path(&repo().join("no/such/file"), "a file no test has");
}

#[test]
fn the_local_tier_is_the_end_to_end_tests_less_the_peers_tier() {
    // .config/nextest.toml writes the `peers` expression twice: in `peers`, and negated in
    // `local`. Different, a test would run in both tiers or in neither.
    let text = std::fs::read_to_string(repo().join(".config/nextest.toml")).expect("nextest.toml");
    let config: toml::Table = text.parse().expect("nextest.toml is TOML");
    let filter = |profile: &str| {
        let filter = config["profile"][profile]["default-filter"]
            .as_str()
            .unwrap_or_else(|| panic!("profile.{profile}.default-filter"));
        filter.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    assert_eq!(
        filter("local"),
        format!(
            "package(capataz) & kind(test) & not ( {} )",
            filter("peers")
        )
    );
    assert_eq!(filter("fast"), "not (package(capataz) & kind(test))");
}
