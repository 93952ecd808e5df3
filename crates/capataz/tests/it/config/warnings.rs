//! The `check` warnings for foot-guns, and configs cut short or mangled that must never
//! panic the loader.

use super::*;

/// The warnings `extra` (appended to `MINIMAL`) raises, as `key: first words` pairs.
fn warnings_for(extra: &str) -> Vec<String> {
    check(&parse(&with_pool(extra)))
        .iter()
        .map(|w| w.key.clone())
        .collect()
}

#[test]
fn warnings_for_foot_guns() {
    assert_eq!(warnings_for(""), Vec::<String>::new(), "defaults");
    let cases: &[(&str, &[&str])] = &[
        ("[pools.web.active]\nrise = 1", &["pools.web.active.rise"]),
        ("[pools.web.active]\nfall = 1", &["pools.web.active.fall"]),
        (
            "[pools.web.active]\ntimeout = \"2s\"",
            &["pools.web.active.timeout"],
        ),
        (
            "[pools.web.active]\ninterval = \"30s\"",
            &["pools.web.active.fall"],
        ),
        (
            "[pools.web.active]\ninterval = \"19s\"\nfall = 3",
            &[], // 3 x (19 s + 1 s timeout): exactly 60 s is fine
        ),
        (
            "[pools.web.active]\njitter = 0",
            &["pools.web.active.jitter"],
        ),
        (
            "[pools.web.active]\njitter = \"0%\"",
            &["pools.web.active.jitter"],
        ),
        (
            "[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nenabled = false",
            &["pools.web"],
        ),
        // Without probes the active settings raise nothing; passive checks still run.
        (
            "[pools.web.active]\nkind = \"none\"\nrise = 1\njitter = 0",
            &[],
        ),
        ("[pools.web.passive]\nenabled = false", &[]),
        // An [admin] table alone no longer warns (the admin API is served).
        ("[admin]", &[]),
        ("[admin]\nopen_read_only = true", &["admin.open_read_only"]),
        ("[admin]\ntoken = \"t\"\nopen_read_only = true", &[]),
        (
            "[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\ntimeout = \"30s\"",
            &["alerts.webhooks[0].timeout"],
        ),
        (
            "[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\ntimeout = \"29s\"",
            &[],
        ),
    ];
    for (extra, expected) in cases {
        assert_eq!(warnings_for(extra), *expected, "{extra}");
    }
    let warning = &check(&parse(&with_pool("[pools.web.active]\nrise = 1")))[0];
    assert_eq!(warning.line, Some(8));
    assert!(
        warning
            .to_string()
            .starts_with("config.toml:8: pools.web.active.rise: rise = 1"),
        "{warning}"
    );
}

#[test]
fn truncated_or_mangled_configs_never_panic() {
    let example = doc_example();
    for (end, _) in example.char_indices() {
        let _ = parse_str(&example[..end], "config.toml");
    }
    for (at, _) in example.char_indices().step_by(7) {
        for junk in ["\"", "[", "]", "=", "\n", "{", "'''", "0", "."] {
            let mangled = format!("{}{junk}{}", &example[..at], &example[at..]);
            let _ = parse_str(&mangled, "config.toml");
        }
    }
}

proptest::proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = parse_str(&text, "config.toml");
    }
}
