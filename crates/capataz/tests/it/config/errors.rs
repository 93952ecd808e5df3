//! One error per class of bad input, with its line and key and what to do; an unreadable
//! file; loading from disk.

use super::*;

#[test]
fn errors_name_the_line_and_key() {
    let cases: &[(&str, &str, Option<usize>, &str)] = &[
        // (what, toml, line, key fragment)
        ("syntax", "[[listeners]]\naddress = \"127.0.0.1:8080\n", Some(2), "listeners[0]"),
        ("unclosed header", "[pools.web\n", Some(1), ""),
        (
            "unknown key",
            &with_pool("[pools.web.active]\nrise = 2\nraise = 3"),
            Some(9),
            "pools.web.active.raise",
        ),
        (
            "unknown top-level table",
            &format!("[logging]\nlevel = \"info\"\n{MINIMAL}"),
            Some(1),
            "logging",
        ),
        (
            "wrong type",
            &with_pool("[pools.web.retries]\nattempts = \"2\""),
            Some(8),
            "pools.web.retries.attempts",
        ),
        (
            "unknown variant",
            &with_pool("[pools.web.active]\nkind = \"icmp\""),
            Some(8),
            "pools.web.active.kind",
        ),
        (
            "bad duration",
            &with_pool("[pools.web.active]\ninterval = \"2x\""),
            Some(8),
            "pools.web.active.interval",
        ),
        (
            "duration without unit",
            &with_pool("[pools.web.timeouts]\nconnect = 2"),
            Some(8),
            "pools.web.timeouts.connect",
        ),
        (
            "zero duration",
            &with_pool("[pools.web.passive]\nejection_time = \"0s\""),
            Some(8),
            "pools.web.passive.ejection_time",
        ),
        (
            "rise 0",
            &with_pool("[pools.web.active]\nrise = 0"),
            Some(8),
            "pools.web.active.rise",
        ),
        (
            "fall negative",
            &with_pool("[pools.web.active]\nfall = -1"),
            Some(8),
            "pools.web.active.fall",
        ),
        (
            "consecutive_errors 0 in a dotted key",
            &with_pool("passive.consecutive_errors = 0"),
            Some(7),
            "pools.web.passive.consecutive_errors",
        ),
        (
            "bad expect list",
            &with_pool("[pools.web.active]\nexpect = \"200-29x\""),
            Some(8),
            "pools.web.active.expect",
        ),
        (
            "probe path without slash",
            &with_pool("[pools.web.active]\npath = \"healthz\""),
            Some(8),
            "pools.web.active.path",
        ),
        (
            "probe host with a space",
            &with_pool("[pools.web.active]\nhost = \"a b\""),
            Some(8),
            "pools.web.active.host",
        ),
        (
            "jitter 80%",
            &with_pool("[pools.web.active]\njitter = \"80%\""),
            Some(8),
            "pools.web.active.jitter",
        ),
        (
            "jitter fraction too large",
            &with_pool("[pools.web.active]\njitter = 0.8"),
            Some(8),
            "pools.web.active.jitter",
        ),
        (
            "max_ejection_time < ejection_time",
            &with_pool("[pools.web.passive]\nejection_time = \"60s\"\nmax_ejection_time = \"30s\""),
            Some(9),
            "pools.web.passive.max_ejection_time",
        ),
        (
            "ejection_time above the default maximum",
            &with_pool("[pools.web.passive]\nejection_time = \"10m\""),
            Some(8),
            "pools.web.passive.ejection_time",
        ),
        (
            "max_ejected_percent 101",
            &with_pool("[pools.web.passive]\nmax_ejected_percent = 101"),
            Some(8),
            "pools.web.passive.max_ejected_percent",
        ),
        (
            "attempts 11",
            &with_pool("[pools.web.retries]\nattempts = 11"),
            Some(8),
            "pools.web.retries.attempts",
        ),
        (
            "budget_percent 101",
            &with_pool("[pools.web.retries]\nbudget_percent = 101"),
            Some(8),
            "pools.web.retries.budget_percent",
        ),
        (
            "route to unknown pool",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\npool = \"web\"\n\
             [[listeners.routes]]\npool = \"wbe\"\n[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(6),
            "listeners[0].routes[1].pool",
        ),
        (
            "route without pool",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nhost = \"a\"\n\
             [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(3),
            "listeners[0].routes[0].pool",
        ),
        (
            "route path without slash",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\npath_prefix = \"api\"\n\
             pool = \"web\"\n[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(4),
            "listeners[0].routes[0].path_prefix",
        ),
        (
            "no routes and two pools",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.a]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n\
             [pools.b]\nbackends = [{ address = \"127.0.0.1:9002\" }]\n",
            Some(1),
            "listeners[0].routes",
        ),
        (
            "backend address that does not parse",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [\n  { address = \"127.0.0.1:9001\" },\n  { address = \"127.0.0.1\" },\n]\n",
            Some(6),
            "pools.web.backends[1].address",
        ),
        (
            "backend port 0",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [{ address = \"127.0.0.1:0\" }]\n",
            Some(4),
            "pools.web.backends[0].address",
        ),
        (
            "backend without address",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[pools.web.backends]]\nname = \"web1\"\n",
            Some(3),
            "pools.web.backends[0].address",
        ),
        (
            "duplicate backend name",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [\n  { name = \"a\", address = \"127.0.0.1:9001\" },\n  { name = \"a\", address = \"127.0.0.1:9002\" },\n]\n",
            Some(6),
            "pools.web.backends[1].name",
        ),
        (
            "duplicate backend address without names",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [\n  { address = \"127.0.0.1:9001\" },\n  { address = \"127.0.0.1:9001\" },\n]\n",
            Some(6),
            "pools.web.backends[1].name",
        ),
        (
            "weight 0",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [\n  { address = \"127.0.0.1:9001\", weight = 0 },\n]\n",
            Some(5),
            "pools.web.backends[0].weight",
        ),
        (
            "weight 1001",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\", weight = 1001 }]\n",
            Some(4),
            "pools.web.backends[0].weight",
        ),
        (
            "unknown backend key",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [\n  { address = \"127.0.0.1:9001\", wieght = 2 },\n]\n",
            Some(5),
            "pools.web.backends",
        ),
        (
            "empty backends",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = []\n",
            Some(4),
            "pools.web.backends",
        ),
        (
            "missing backends",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nalgorithm = \"round_robin\"\n",
            Some(3),
            "pools.web.backends",
        ),
        (
            "bad pool name",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.\"web pool\"]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(3),
            "pools.web pool",
        ),
        ("no listeners", "[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n", None, "listeners"),
        ("no pools", "[[listeners]]\naddress = \"127.0.0.1:8080\"\n", None, "pools"),
        (
            "listener without address",
            "\n[[listeners]]\nname = \"public\"\n[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(2),
            "listeners[0].address",
        ),
        (
            "listener address with a host name (only localhost is taken, as 127.0.0.1)",
            "[[listeners]]\naddress = \"example.com:8080\"\n[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(2),
            "listeners[0].address",
        ),
        (
            "duplicate listener address",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n\
             [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(4),
            "listeners[1].address",
        ),
        (
            "listener on the admin address",
            "[admin]\naddress = \"127.0.0.1:9901\"\n[[listeners]]\naddress = \"127.0.0.1:9901\"\n\
             [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(4),
            "listeners[0].address",
        ),
        (
            "max_header_bytes too small",
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\nmax_header_bytes = 100\n\
             [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            Some(3),
            "listeners[0].max_header_bytes",
        ),
        (
            "bad admin address",
            &format!("[admin]\naddress = \"9901\"\n{MINIMAL}"),
            Some(2),
            "admin.address",
        ),
        (
            "non-loopback admin address without a token",
            &format!("[admin]\naddress = \"10.0.0.5:9901\"\nopen_read_only = true\n{MINIMAL}"),
            Some(2),
            "admin.address",
        ),
        (
            "unspecified IPv6 admin address without a token",
            &format!("[admin]\naddress = \"[::]:9901\"\n{MINIMAL}"),
            Some(2),
            "admin.address",
        ),
        (
            "open_read_only not a boolean",
            &format!("[admin]\nopen_read_only = \"yes\"\n{MINIMAL}"),
            Some(2),
            "admin.open_read_only",
        ),
        (
            "metrics_backend_histograms not a boolean",
            &format!("[admin]\nmetrics_backend_histograms = \"on\"\n{MINIMAL}"),
            Some(2),
            "admin.metrics_backend_histograms",
        ),
        (
            "zero shutdown_timeout",
            &format!("[server]\nshutdown_timeout = \"0s\"\n{MINIMAL}"),
            Some(2),
            "server.shutdown_timeout",
        ),
        (
            "unknown server key",
            &format!("[server]\ngrace = \"5s\"\n{MINIMAL}"),
            Some(2),
            "server.grace",
        ),
        (
            "slow_start without a unit",
            &with_pool("slow_start = 30"),
            Some(7),
            "pools.web.slow_start",
        ),
        (
            "zero slow_start",
            &with_pool("slow_start = \"0ms\""),
            Some(7),
            "pools.web.slow_start",
        ),
        (
            "gate_new_backends not a boolean",
            &with_pool("gate_new_backends = 1"),
            Some(7),
            "pools.web.gate_new_backends",
        ),
        (
            "bad debounce",
            &with_pool("[alerts]\ndebounce = \"soon\""),
            Some(8),
            "alerts.debounce",
        ),
        (
            "unknown alerts key",
            &with_pool("[alerts]\nwebhook = \"http://127.0.0.1:9000\""),
            Some(8),
            "alerts.webhook",
        ),
        (
            "webhook without url",
            &with_pool("[[alerts.webhooks]]\ntimeout = \"1s\""),
            Some(7),
            "alerts.webhooks[0].url",
        ),
        (
            "https webhook",
            &with_pool("[[alerts.webhooks]]\nurl = \"https://hooks.example.com/x\""),
            Some(8),
            "alerts.webhooks[0].url",
        ),
        (
            "webhook url without a scheme",
            &with_pool("[[alerts.webhooks]]\nurl = \"127.0.0.1:9000/hook\""),
            Some(8),
            "alerts.webhooks[0].url",
        ),
        (
            "webhook url without a host",
            &with_pool("[[alerts.webhooks]]\nurl = \"http:///hook\""),
            Some(8),
            "alerts.webhooks[0].url",
        ),
        (
            "webhook port 0",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:0/hook\""),
            Some(8),
            "alerts.webhooks[0].url",
        ),
        (
            "webhook url with credentials",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://a:b@127.0.0.1:9000/hook\""),
            Some(8),
            "alerts.webhooks[0].url",
        ),
        (
            "webhook url with a space",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000/a b\""),
            Some(8),
            "alerts.webhooks[0].url",
        ),
        (
            "webhook host that does not resolve",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://hooks.invalid/x\""),
            Some(8),
            "alerts.webhooks[0].url",
        ),
        (
            "second webhook's url",
            &with_pool(
                "[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\n\
                 [[alerts.webhooks]]\nurl = \"ftp://127.0.0.1\"",
            ),
            Some(10),
            "alerts.webhooks[1].url",
        ),
        (
            "webhook zero timeout",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\ntimeout = \"0s\""),
            Some(9),
            "alerts.webhooks[0].timeout",
        ),
        (
            "webhook retries 11",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\nretries = 11"),
            Some(9),
            "alerts.webhooks[0].retries",
        ),
        (
            "webhook negative retries",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\nretries = -1"),
            Some(9),
            "alerts.webhooks[0].retries",
        ),
        (
            "webhook bad backoff",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\nbackoff = 500"),
            Some(9),
            "alerts.webhooks[0].backoff",
        ),
        (
            "webhook queue 0",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\nqueue = 0"),
            Some(9),
            "alerts.webhooks[0].queue",
        ),
        (
            "webhook queue 100001",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\nqueue = 100001"),
            Some(9),
            "alerts.webhooks[0].queue",
        ),
        (
            "unknown webhook key",
            &with_pool("[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\nmethod = \"PUT\""),
            Some(9),
            "alerts.webhooks[0].method",
        ),
        (
            "command hook without command",
            &with_pool("[[alerts.commands]]\ntimeout = \"1s\""),
            Some(7),
            "alerts.commands[0].command",
        ),
        (
            "command as a shell line",
            &with_pool("[[alerts.commands]]\ncommand = \"page-oncall --severity high\""),
            Some(8),
            "alerts.commands[0].command",
        ),
        (
            "empty command",
            &with_pool("[[alerts.commands]]\ncommand = []"),
            Some(8),
            "alerts.commands[0].command",
        ),
        (
            "empty program",
            &with_pool("[[alerts.commands]]\ncommand = [\"\", \"x\"]"),
            Some(8),
            "alerts.commands[0].command",
        ),
        (
            "command argument not a string",
            &with_pool("[[alerts.commands]]\ncommand = [\"page\", 3]"),
            Some(8),
            "alerts.commands[0].command",
        ),
        (
            "command not an array",
            &with_pool("[[alerts.commands]]\ncommand = 3"),
            Some(8),
            "alerts.commands[0].command",
        ),
        (
            "command with a NUL",
            &with_pool("[[alerts.commands]]\ncommand = [\"page\", \"a\\u0000b\"]"),
            Some(8),
            "alerts.commands[0].command",
        ),
        (
            "command zero timeout",
            &with_pool("[[alerts.commands]]\ncommand = [\"page\"]\ntimeout = \"0s\""),
            Some(9),
            "alerts.commands[0].timeout",
        ),
        (
            "command queue 0",
            &with_pool("[[alerts.commands]]\ncommand = [\"page\"]\nqueue = 0"),
            Some(9),
            "alerts.commands[0].queue",
        ),
        (
            "unknown command key",
            &with_pool("[[alerts.commands]]\ncommand = [\"page\"]\nshell = true"),
            Some(9),
            "alerts.commands[0].shell",
        ),
        (
            "bad log level",
            &format!("[log]\nlevel = \"capataz=loud\"\n{MINIMAL}"),
            Some(2),
            "log.level",
        ),
    ];
    for (what, text, line, key) in cases {
        eprintln!("case: {what}");
        check_err(text, *line, key);
    }
}

#[test]
fn error_messages_say_what_to_do() {
    let error = check_err(
        &with_pool("[pools.web.active]\ninterval = \"2x\""),
        Some(8),
        "interval",
    );
    assert_eq!(
        error.to_string(),
        r#"config.toml:8: pools.web.active.interval: "2x" is not a duration (use e.g. "500ms", "2s", "1m")"#
    );
    let error = check_err(&with_pool("[pools.web.active]\nrise = 0"), Some(8), "rise");
    assert_eq!(
        error.to_string(),
        "config.toml:8: pools.web.active.rise: 0 is out of range (use a whole number of at least 1)"
    );
    let error = check_err(
        &with_pool("[pools.web.active]\nfoo = 1"),
        Some(8),
        "pools.web.active.foo",
    );
    assert!(
        error.to_string().starts_with(
            "config.toml:8: pools.web.active.foo: unknown key \"foo\" (the keys here are kind, \
             path, host,"
        ),
        "{error}"
    );
    assert!(matches!(error, ConfigError::Parse { .. }));
    let error = check_err(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\npool = \"api\"\n\
         [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
        Some(4),
        "pool",
    );
    assert_eq!(
        error.to_string(),
        r#"config.toml:4: listeners[0].routes[0].pool: "api" is not a pool (use one of "web", or add [pools.api])"#
    );
    let error = check_err(
        &with_pool("[[alerts.webhooks]]\nurl = \"https://hooks.example.com/x\""),
        Some(8),
        "url",
    );
    assert_eq!(
        error.to_string(),
        r#"config.toml:8: alerts.webhooks[0].url: "https://hooks.example.com/x" uses https, which webhooks do not support: they speak plain HTTP (use an http:// URL, e.g. of a local relay that adds TLS)"#
    );
    let error = check_err(
        &with_pool("[[alerts.commands]]\ncommand = \"page-oncall --severity high\""),
        Some(8),
        "command",
    );
    assert!(error.to_string().contains("run without a shell"), "{error}");
}

#[test]
fn unreadable_file_is_an_io_error() {
    let path = std::path::Path::new("/nonexistent/capataz.toml");
    let error = load(path).unwrap_err();
    assert!(matches!(error, ConfigError::Io { .. }), "{error:?}");
    assert_eq!(error.line(), None);
    assert!(
        error
            .to_string()
            .starts_with("/nonexistent/capataz.toml: cannot read the configuration"),
        "{error}"
    );
}

#[test]
fn load_reads_a_file() {
    let dir = std::env::temp_dir().join(format!("capataz-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, MINIMAL).unwrap();
    let config = load(&path).unwrap();
    assert_eq!(config.source, path.display().to_string());
    std::fs::remove_dir_all(&dir).unwrap();
}
