//! The configuration loader: typed values and defaults, one error per class of bad input (with
//! its line and key), and the `check` warnings.

use std::net::SocketAddr;
use std::time::Duration;

use capataz::config::{
    check, load, parse_str, Algorithm, AllDownPolicy, CheckKind, Config, ConfigError, LogFormat,
};
use capataz_health::{State, StatusSet};

/// The smallest valid config; everything else is a default.
const MINIMAL: &str = r#"
[[listeners]]
address = "127.0.0.1:8080"

[pools.web]
backends = [{ address = "127.0.0.1:9001" }]
"#;

fn parse(text: &str) -> Config {
    parse_str(text, "config.toml").unwrap_or_else(|error| panic!("{error}\n---\n{text}"))
}

/// `text` must fail on line `line` (`None`: no line) with a key containing `key`.
fn check_err(text: &str, line: Option<usize>, key: &str) -> ConfigError {
    let error = match parse_str(text, "config.toml") {
        Ok(_) => panic!("expected an error at {key}, got a valid config:\n{text}"),
        Err(error) => error,
    };
    let shown = error.to_string();
    assert_eq!(error.line(), line, "wrong line in {shown:?}\n---\n{text}");
    assert!(
        error.key().contains(key),
        "key {:?} does not contain {key:?} in {shown:?}",
        error.key()
    );
    let prefix = match line {
        Some(line) => format!("config.toml:{line}: "),
        None => "config.toml: ".to_owned(),
    };
    assert!(
        shown.starts_with(&prefix),
        "{shown:?} should start with {prefix:?}"
    );
    assert!(!shown.contains('\n'), "one line please: {shown:?}");
    error
}

/// `MINIMAL` with `extra` appended under `[pools.web]`-level tables and keys.
fn with_pool(extra: &str) -> String {
    format!("{MINIMAL}{extra}\n")
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The complete example of docs/config.md, which must stay valid.
fn doc_example() -> String {
    let doc = include_str!("../../../../docs/config.md");
    let start = doc
        .find("<!-- example:start -->")
        .expect("docs/config.md marks its example");
    let block = &doc[start..];
    let open = block.find("```toml\n").unwrap() + "```toml\n".len();
    let close = block[open..].find("```").unwrap();
    block[open..open + close].to_owned()
}

#[test]
fn documented_example_round_trips() {
    let config = parse(&doc_example());
    assert_eq!(config.source, "config.toml");
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(config.log.level, "info,capataz=debug");
    assert_eq!(config.server.shutdown_timeout, Duration::from_secs(20));
    let admin = config.admin.as_ref().unwrap();
    assert_eq!(admin.address, addr("127.0.0.1:9901"));
    assert_eq!(admin.token.as_deref(), Some("change-me"));
    assert!(admin.open_read_only);
    assert!(!admin.metrics_backend_histograms);

    // Pools are sorted by name; routes hold indexes.
    let names: Vec<_> = config.pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["api", "web"]);
    let (api, web) = (&config.pools[0], &config.pools[1]);

    assert_eq!(config.listeners.len(), 1);
    let public = &config.listeners[0];
    assert_eq!(public.name, "public");
    assert_eq!(public.address, addr("0.0.0.0:8080"));
    assert_eq!(public.idle_timeout, Duration::from_secs(75));
    assert_eq!(public.header_read_timeout, Duration::from_secs(5));
    assert_eq!(public.max_header_bytes, 32768);
    let routes: Vec<_> = public
        .routes
        .iter()
        .map(|r| (r.host.as_deref(), r.path_prefix.as_str(), r.pool))
        .collect();
    assert_eq!(
        routes,
        [
            (Some("api.example.com"), "/", 0),
            (None, "/api/", 0),
            (None, "/", 1),
        ]
    );

    assert_eq!(web.algorithm, Algorithm::RoundRobin);
    assert_eq!(web.when_all_down, AllDownPolicy::FailOpen);
    let backends: Vec<_> = web
        .backends
        .iter()
        .map(|b| (b.name.as_str(), b.address.as_str(), b.socket_addr, b.weight))
        .collect();
    assert_eq!(
        backends,
        [
            ("web1", "127.0.0.1:9001", addr("127.0.0.1:9001"), 1),
            ("web2", "127.0.0.1:9002", addr("127.0.0.1:9002"), 1),
            (
                "127.0.0.1:9003",
                "127.0.0.1:9003",
                addr("127.0.0.1:9003"),
                2
            ),
        ]
    );
    let active = &web.active;
    assert_eq!(active.kind, CheckKind::Http);
    assert_eq!(active.path, "/healthz");
    assert_eq!(active.host.as_deref(), Some("web.internal"));
    assert_eq!(active.expect.to_string(), "200-299,302");
    assert_eq!(active.interval, Duration::from_secs(2));
    assert_eq!(active.timeout, Duration::from_millis(500));
    assert_eq!((active.rise.get(), active.fall.get()), (2, 3));
    assert_eq!(active.jitter, 0.1);
    assert_eq!(active.initial, State::Up);
    let passive = &web.passive;
    assert!(passive.enabled && passive.count_503);
    assert_eq!(passive.consecutive_errors.get(), 5);
    assert_eq!(passive.ejection_time, Duration::from_secs(30));
    assert_eq!(passive.max_ejection_time, Duration::from_secs(300));
    assert_eq!(passive.max_ejected_percent, 50);
    assert_eq!(
        (
            web.retries.attempts,
            web.retries.budget_percent,
            web.retries.min_budget
        ),
        (1, 20, 10)
    );
    assert_eq!(web.timeouts.connect, Duration::from_millis(500));
    assert_eq!(web.timeouts.response_header, Duration::from_secs(15));
    assert_eq!(web.timeouts.idle, Duration::from_secs(30));
    assert_eq!(web.slow_start, Some(Duration::from_secs(30)));
    assert!(!web.gate_new_backends);

    assert_eq!(api.algorithm, Algorithm::LeastRequest);
    assert_eq!(
        api.when_all_down,
        AllDownPolicy::Reject {
            retry_after: Duration::from_secs(10)
        }
    );
    assert_eq!(api.active.kind, CheckKind::Tcp);
    assert_eq!(api.active.interval, Duration::from_millis(1500));
    assert_eq!(api.active.jitter, 0.2);
    assert_eq!(api.active.initial, State::Down);
    assert!(!api.passive.count_503);
    assert_eq!(api.passive.ejection_time, Duration::from_secs(10));
    assert_eq!(api.passive.max_ejection_time, Duration::from_secs(120));
    assert_eq!(api.passive.max_ejected_percent, 34);
    assert_eq!(api.retries.attempts, 2);
    assert_eq!(api.retries.budget_percent, 10);
    assert_eq!(api.retries.min_budget, 5);
    assert_eq!(api.slow_start, None);
    assert!(api.gate_new_backends);

    let alerts = &config.alerts;
    assert_eq!(alerts.debounce, Some(Duration::from_secs(60)));
    assert_eq!(alerts.webhooks.len(), 1);
    let hook = &alerts.webhooks[0];
    assert_eq!(hook.url, "http://127.0.0.1:9000/hook?source=capataz");
    assert_eq!(hook.socket_addr, addr("127.0.0.1:9000"));
    assert_eq!(hook.host, "127.0.0.1:9000");
    assert_eq!(hook.path, "/hook?source=capataz");
    assert_eq!(hook.timeout, Duration::from_secs(3));
    assert_eq!(hook.retries, 5);
    assert_eq!(hook.backoff, Duration::from_secs(1));
    assert_eq!(hook.queue, 512);
    assert_eq!(alerts.commands.len(), 1);
    let command = &alerts.commands[0];
    assert_eq!(
        command.argv,
        ["/usr/local/bin/page-oncall", "--severity", "high"]
    );
    assert_eq!(command.timeout, Duration::from_secs(5));
    assert_eq!(command.queue, 64);

    let warnings = check(&config);
    assert!(
        warnings.is_empty(),
        "the example raises no warnings: {warnings:?}"
    );
}

#[test]
fn defaults() {
    let config = parse(MINIMAL);
    assert_eq!(config.log.format, LogFormat::Text);
    assert_eq!(config.log.level, "info");
    assert_eq!(config.admin, None);
    assert_eq!(config.server.shutdown_timeout, Duration::from_secs(30));
    assert_eq!(config.alerts.debounce, None);
    assert!(config.alerts.webhooks.is_empty() && config.alerts.commands.is_empty());
    let listener = &config.listeners[0];
    assert_eq!(listener.name, "listener-0");
    assert_eq!(listener.idle_timeout, Duration::from_secs(60));
    assert_eq!(listener.header_read_timeout, Duration::from_secs(10));
    assert_eq!(listener.max_header_bytes, 16384);
    // One pool and no routes: a catch-all route to it.
    assert_eq!(listener.routes.len(), 1);
    let route = &listener.routes[0];
    assert_eq!(
        (route.host.as_deref(), route.path_prefix.as_str()),
        (None, "/")
    );
    assert_eq!(route.pool, 0);

    let pool = &config.pools[0];
    assert_eq!(pool.name, "web");
    assert_eq!(pool.backends[0].name, "127.0.0.1:9001");
    assert_eq!(pool.backends[0].weight, 1);
    assert_eq!(pool.algorithm, Algorithm::RoundRobin);
    assert_eq!(pool.when_all_down, AllDownPolicy::FailOpen);
    let active = &pool.active;
    assert_eq!(active.kind, CheckKind::Http);
    assert_eq!(active.path, "/healthz");
    assert_eq!(active.host, None);
    assert_eq!(active.expect, StatusSet::range(200, 399));
    assert_eq!(active.interval, Duration::from_secs(2));
    assert_eq!(active.timeout, Duration::from_secs(1));
    assert_eq!((active.rise.get(), active.fall.get()), (2, 3));
    assert_eq!(active.jitter, 0.1);
    assert_eq!(active.initial, State::Up);
    let passive = &pool.passive;
    assert!(passive.enabled);
    assert_eq!(passive.consecutive_errors.get(), 3);
    assert!(passive.count_503);
    assert_eq!(passive.ejection_time, Duration::from_secs(30));
    assert_eq!(passive.max_ejection_time, Duration::from_secs(300));
    assert_eq!(passive.max_ejected_percent, 50);
    assert_eq!(pool.retries.attempts, 1);
    assert_eq!(pool.retries.budget_percent, 20);
    assert_eq!(pool.retries.min_budget, 10);
    assert_eq!(pool.timeouts.connect, Duration::from_secs(1));
    assert_eq!(pool.timeouts.response_header, Duration::from_secs(15));
    assert_eq!(pool.timeouts.idle, Duration::from_secs(30));
    assert_eq!(pool.slow_start, None);
    assert!(pool.gate_new_backends);

    // An empty [admin] table enables the admin listener with its defaults.
    let config = parse(&format!("[admin]\n{MINIMAL}"));
    let admin = config.admin.unwrap();
    assert_eq!(admin.address, addr("127.0.0.1:9901"));
    assert_eq!(admin.token, None);
    assert!(!admin.open_read_only);
    assert!(!admin.metrics_backend_histograms);
    // A hook with only its required key.
    let config = parse(&with_pool(
        "[[alerts.webhooks]]\nurl = \"http://127.0.0.1:9000\"\n\
         [[alerts.commands]]\ncommand = [\"page\"]",
    ));
    let hook = &config.alerts.webhooks[0];
    assert_eq!(hook.path, "/");
    assert_eq!(hook.timeout, Duration::from_secs(2));
    assert_eq!(hook.retries, 3);
    assert_eq!(hook.backoff, Duration::from_millis(500));
    assert_eq!(hook.queue, 1024);
    let command = &config.alerts.commands[0];
    assert_eq!(command.argv, ["page"]);
    assert_eq!(command.timeout, Duration::from_secs(10));
    assert_eq!(command.queue, 256);
    // reject's Retry-After defaults to 5 s.
    let config = parse(&with_pool("when_all_down = \"reject\""));
    assert_eq!(
        config.pools[0].when_all_down,
        AllDownPolicy::Reject {
            retry_after: Duration::from_secs(5)
        }
    );
}

#[test]
fn values_are_normalized() {
    let config = parse(
        r#"
[[listeners]]
address = "127.0.0.1:8080"
[[listeners.routes]]
host = "API.Example.com:8080"
pool = "b"
[[listeners.routes]]
host = "[::1]:8080"
pool = "b"
[[listeners.routes]]
pool = "a"
[pools.b]
backends = [{ address = "localhost:9001" }]
[pools.b.active]
jitter = 0.25
[pools.a]
backends = [{ address = "[::1]:9001" }]
active.jitter = "0%"
active.kind = "none"
"#,
    );
    let routes = &config.listeners[0].routes;
    assert_eq!(routes[0].host.as_deref(), Some("api.example.com"));
    assert_eq!(routes[1].host.as_deref(), Some("[::1]"));
    assert_eq!((routes[0].pool, routes[2].pool), (1, 0));
    assert!(config.pools[1].backends[0].socket_addr.ip().is_loopback());
    assert_eq!(config.pools[1].active.jitter, 0.25);
    assert_eq!(config.pools[0].active.jitter, 0.0);
    assert_eq!(config.pools[0].active.kind, CheckKind::None);
}

#[test]
fn webhook_urls_are_taken_apart() {
    let hook = |url: &str| {
        let config = parse(&with_pool(&format!("[[alerts.webhooks]]\nurl = {url:?}")));
        let hook = config.alerts.webhooks[0].clone();
        (hook.host, hook.socket_addr, hook.path)
    };
    // The port defaults to 80; Host is the authority as written.
    assert_eq!(
        hook("http://127.0.0.1/alerts"),
        ("127.0.0.1".into(), addr("127.0.0.1:80"), "/alerts".into())
    );
    assert_eq!(
        hook("http://[::1]:9000?x=1#top"),
        ("[::1]:9000".into(), addr("[::1]:9000"), "/?x=1".into())
    );
    let (host, socket_addr, path) = hook("http://localhost:9000/a/b");
    assert_eq!((host.as_str(), path.as_str()), ("localhost:9000", "/a/b"));
    assert!(socket_addr.ip().is_loopback() && socket_addr.port() == 9000);
}

#[test]
fn metrics_backend_histograms_is_read() {
    let config = parse(&format!(
        "[admin]\nmetrics_backend_histograms = true\n{MINIMAL}"
    ));
    assert!(config.admin.unwrap().metrics_backend_histograms);
}

#[test]
fn admin_token_rule() {
    let admin = |table: &str| {
        parse(&format!("[admin]\n{table}\n{MINIMAL}"))
            .admin
            .unwrap()
    };
    // Loopback needs no token; any other address does.
    assert_eq!(admin("address = \"[::1]:9901\"").token, None);
    let open = admin("address = \"0.0.0.0:9901\"\ntoken = \"s3cret\"\nopen_read_only = true");
    assert_eq!(open.address, addr("0.0.0.0:9901"));
    assert!(open.open_read_only);
    let error = check_err(
        &format!("[admin]\naddress = \"0.0.0.0:9901\"\n{MINIMAL}"),
        Some(2),
        "admin.address",
    );
    assert!(
        error.to_string().contains(
            "a non-loopback admin address needs admin.token (anyone who can reach it could \
             take backends down"
        ),
        "{error}"
    );
}

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
            &with_pool("[pools.web.active]\nkind = \"grpc\""),
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
            Some(3),
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
            "listener address with a host name",
            "[[listeners]]\naddress = \"localhost:8080\"\n[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
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
        error.to_string().contains("unknown field `foo`")
            && error.to_string().contains("docs/config.md"),
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
            "[pools.web.active]\ninterval = \"20s\"\nfall = 3",
            &[], // exactly 60 s is fine
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
    assert_eq!(warning.line, None);
    assert!(
        warning
            .to_string()
            .starts_with("pools.web.active.rise: rise = 1"),
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
