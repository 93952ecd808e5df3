//! What a valid file means: the documented example round-trips, defaults, normalized values,
//! webhook URLs, the metrics scope, and the admin token rule.

use super::*;

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
        .map(|r| (r.host.as_deref(), r.path_prefix.as_str(), r.pool().unwrap()))
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
    assert_eq!(route.pool(), Some(0));

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
    assert_eq!((routes[0].pool(), routes[2].pool()), (Some(1), Some(0)));
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
