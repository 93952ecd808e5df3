//! Every error of a file in one run: through the library (`parse_all_errors`) and the binary
//! (`capataz check`, `capataz run`).

use capataz::config::{self, Environment};

use super::{capataz, shown, TempDir};

/// Six independent mistakes, and a route to a pool that failed (not an error of its own).
const MANY: &str = r#"
[[listeners]]
address = "127.0.0.1:0"
idle_timeout = "soon"

[[listeners.routes]]
pool = "api"

[[listeners]]
address = "nowhere"

[[listeners.routes]]
pool = "web"

[pools.web]
backends = [{ address = "127.0.0.1:9001", weight = 0 }]

[pools.web.active]
interval = "2x"
rise = 0

[pools.api]
backends = []
"#;

/// Where each error of `MANY` is, in the order validation meets them: the pools by name, then
/// the listeners.
const MANY_PLACES: [(usize, &str); 6] = [
    (23, "pools.api.backends"),
    (16, "pools.web.backends[0].weight"),
    (19, "pools.web.active.interval"),
    (20, "pools.web.active.rise"),
    (4, "listeners[0].idle_timeout"),
    (10, "listeners[1].address"),
];

/// `(line, key)` of every error `text` has, in order.
fn placed(text: &str) -> Vec<(Option<usize>, String)> {
    match config::parse_all_errors(text, "app.toml", &Environment::from_pairs::<&str, &str>([])) {
        Ok(_) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| (e.line(), e.key().to_owned()))
            .collect(),
    }
}

#[test]
fn validation_reports_every_independent_error_in_file_order_of_checks() {
    let got = placed(MANY);
    let want: Vec<(Option<usize>, String)> = MANY_PLACES
        .iter()
        .map(|(l, k)| (Some(*l), k.to_string()))
        .collect();
    assert_eq!(got, want);
    // The route to the failed pool "api" is not an error of its own.
    // The single-error API still gives the first, as before.
    let first = config::parse_unresolved(MANY, "app.toml").unwrap_err();
    assert_eq!(
        (first.line(), first.key()),
        (Some(23), "pools.api.backends")
    );
}

#[test]
fn a_placeholder_never_makes_an_error_of_its_own() {
    // A bad ejection_time reads as its default (30s) for the rest of validation, which must not
    // then complain that max_ejection_time (10s) is shorter.
    let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.web]\n\
                backends = [{ address = \"127.0.0.1:9001\" }]\n[pools.web.passive]\n\
                ejection_time = \"x\"\nmax_ejection_time = \"10s\"\n";
    assert_eq!(
        placed(text),
        [(Some(6), "pools.web.passive.ejection_time".to_string())]
    );
    // A bad pool name and no pools at all are one error each.
    assert_eq!(
        placed("[[listeners]]\naddress = \"127.0.0.1:0\"\n").len(),
        1
    );
}

#[test]
fn capataz_check_prints_every_error_and_exits_2() {
    let dir = TempDir::new("many");
    let file = dir.write("app.toml", MANY);
    let path = shown(&file);
    let out = capataz(&["check", &path], &[]);
    assert_eq!(out.code, Some(2), "{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 7, "{}", out.stderr);
    for (line, (number, key)) in lines.iter().zip(MANY_PLACES) {
        assert!(
            line.starts_with(&format!("{path}:{number}: {key}: ")),
            "{line}"
        );
    }
    assert_eq!(lines[6], format!("{path}: 6 errors"));
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

/// Regression: a wrong type inside a backend's inline table was printed as
/// `pools.web.backends: invalid type: floating point `1.5`, expected i64`, and `active = []`
/// as "expected struct RawActive with 23 elements".
#[test]
fn capataz_check_prints_a_wrong_type_in_the_operators_words_at_its_key() {
    let dir = TempDir::new("words");
    let head = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.web]\nbackends = [\n  \
                { address = \"127.0.0.1:9001\" },\n";
    for (body, line) in [
        (
            "  { address = \"127.0.0.1:9002\", weight = 1.5 },\n]\n",
            "6: pools.web.backends[1].weight: 1.5 is not a whole number (write digits without \
             quotes or a decimal point, e.g. 3)",
        ),
        (
            "]\nactive = []\n",
            "7: pools.web.active: a list is not a table (write a [pools.web.active] section with \
             its keys on the lines below it, or active = { key = value, ... })",
        ),
    ] {
        let file = dir.write("app.toml", &format!("{head}{body}"));
        let path = shown(&file);
        let out = capataz(&["check", &path], &[]);
        assert_eq!(out.code, Some(2), "{}{}", out.stdout, out.stderr);
        assert_eq!(out.stderr, format!("{path}:{line}\n"));
        assert!(out.stdout.is_empty(), "{}", out.stdout);
    }
}

#[test]
fn capataz_run_prints_every_error_before_refusing_to_start() {
    let dir = TempDir::new("many-run");
    let file = dir.write("app.toml", MANY);
    let path = shown(&file);
    let out = capataz(&["run", "--config", &path], &[]);
    assert_eq!(out.code, Some(2), "{}{}", out.stdout, out.stderr);
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("capataz: invalid configuration: "))
        .collect();
    assert_eq!(errors.len(), 6, "{}", out.stderr);
    assert!(errors[5].contains(&format!("{path}:10: listeners[1].address: ")));
}

#[test]
fn every_bad_alert_hook_is_reported() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.web]\n\
                backends = [{ address = \"127.0.0.1:9001\" }]\n\
                [[alerts.webhooks]]\nurl = \"https://example.com/\"\n\
                [[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000/\"\nretries = 99\n\
                [[alerts.commands]]\ncommand = \"page-oncall --now\"\n";
    assert_eq!(
        placed(text),
        [
            (Some(6), "alerts.webhooks[0].url".to_string()),
            (Some(9), "alerts.webhooks[1].retries".to_string()),
            (Some(11), "alerts.commands[0].command".to_string()),
        ]
    );
}
