//! Connection limits and the queue: `max_connections` (HTTP/1.1 and tcp pools), `max_requests`
//! (HTTP/2 pools), `queue_size`, `queue_timeout`, their defaults, and their errors in the
//! operator's words with file, line and key.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz::config::{parse_all_errors, Environment, LimitsConfig};

use super::parse;

const LISTENER: &str = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n";

/// `text` must fail with exactly `expected`.
fn check(text: &str, expected: &str) {
    match parse_all_errors(
        text,
        "config.toml",
        &Environment::from_pairs::<&str, &str>([]),
    ) {
        Ok(_) => panic!("expected {expected:?}, got a valid config:\n{text}"),
        Err(errors) => assert_eq!(errors.to_string(), expected, "\n---\n{text}"),
    }
}

fn pool(lines: &str, second: &str) -> String {
    format!(
        "{LISTENER}[pools.web]\n{lines}\nbackends = [\n  {{ address = \"127.0.0.1:9001\" }},\n  \
         {{ address = \"127.0.0.1:9002\"{second} }},\n]\n"
    )
}

#[test]
fn limits_take_the_pool_default_unless_a_backend_sets_its_own() {
    let config = parse(&pool("max_connections = 100", ", max_connections = 20"));
    let web = &config.pools[0];
    assert_eq!(
        web.limits,
        Some(LimitsConfig {
            default: NonZeroU32::new(100),
            queue_size: 1024,
            queue_timeout: Duration::from_secs(5),
        })
    );
    assert_eq!(web.backends[0].limit, None, "the pool's default applies");
    assert_eq!(web.backends[1].limit, NonZeroU32::new(20));
    // A backend's own limit alone makes a queue too; the others have no limit.
    let config = parse(&pool(
        "queue_size = 0\nqueue_timeout = \"250ms\"",
        ", max_connections = 1",
    ));
    let limits = config.pools[0].limits.expect("limits");
    assert_eq!(limits.default, None);
    assert_eq!(limits.queue_size, 0);
    assert_eq!(limits.queue_timeout, Duration::from_millis(250));
    // HTTP/2 pools say max_requests.
    let config = parse(&pool("protocol = \"h2c\"\nmax_requests = 64", ""));
    assert_eq!(
        config.pools[0].limits.and_then(|l| l.default),
        NonZeroU32::new(64)
    );
    // No limit: nothing at all.
    assert_eq!(parse(&pool("", "")).pools[0].limits, None);
    // A tcp pool says max_connections, the sessions each backend holds.
    let tcp = pool(
        "protocol = \"tcp\"\nmax_connections = 3\nqueue_size = 2",
        "",
    )
    .replace("8080\"\n", "8080\"\nmode = \"tcp\"\npool = \"web\"\n");
    let config = parse(&tcp);
    let limits = config.pools[0].limits.expect("a tcp pool's limits");
    assert_eq!(limits.default, NonZeroU32::new(3));
    assert_eq!(limits.queue_size, 2);
}

#[test]
fn limit_errors_say_the_file_line_and_key() {
    let cases: &[(String, &str)] = &[
        (
            pool("max_connections = 0", ""),
            "config.toml:5: pools.web.max_connections: 0 is out of range (use a whole number \
             from 1 to 1000000)",
        ),
        (
            pool("", ", max_connections = 2000000"),
            "config.toml:8: pools.web.backends[1].max_connections: 2000000 is out of range (use \
             a whole number from 1 to 1000000)",
        ),
        (
            pool("max_requests = 10", ""),
            "config.toml:5: pools.web.max_requests: max_requests limits the concurrent requests \
             (streams) an HTTP/2 backend carries, and this pool's backends speak HTTP/1.1, where \
             each request holds a connection of its own (use max_connections)",
        ),
        (
            pool("protocol = \"h2c\"", ", max_connections = 10"),
            "config.toml:8: pools.web.backends[1].max_connections: max_connections limits the \
             connections an HTTP/1.1 backend holds, and this pool's backends speak HTTP/2, one \
             multiplexed connection each (use max_requests, the concurrent requests each \
             backend may carry)",
        ),
        (
            pool("queue_size = 10", ""),
            "config.toml:5: pools.web.queue_size: a queue holds requests that find every \
             backend at its limit, and no backend of this pool has one (set max_connections on \
             the pool or its backends, or remove queue_size and queue_timeout)",
        ),
        (
            pool("protocol = \"h2\"\nqueue_timeout = \"1s\"", ""),
            "config.toml:6: pools.web.queue_timeout: a queue holds requests that find every \
             backend at its limit, and no backend of this pool has one (set max_requests on \
             the pool or its backends, or remove queue_size and queue_timeout)",
        ),
        (
            pool("protocol = \"tcp\"", ", max_requests = 10"),
            "config.toml:8: pools.web.backends[1].max_requests: max_requests limits the \
             concurrent requests (streams) an HTTP/2 backend carries, and this pool relays TCP \
             sessions, each holding a connection of its own (use max_connections)",
        ),
        (
            pool("max_connections = 5\nqueue_size = -1", ""),
            "config.toml:6: pools.web.queue_size: -1 is out of range (use a whole number from \
             0 to 1000000)",
        ),
        (
            pool("max_connections = 5\nqueue_timeout = \"0s\"", ""),
            "config.toml:6: pools.web.queue_timeout: \"0s\" is zero (use a duration above \
             zero, e.g. \"500ms\", \"2s\", \"1m\")",
        ),
    ];
    for (text, expected) in cases {
        check(text, expected);
    }
}

/// A listener's own `max_connections` (HAProxy's `maxconn` on a frontend): none by default,
/// read as written on HTTP, tcp and socket listeners, and each bad value an error naming
/// the file, line and key.
#[test]
fn a_listeners_max_connections_is_read_and_checked() {
    let http = |line: &str| {
        format!(
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n{line}\n\n[pools.web]\n\
             backends = [{{ address = \"127.0.0.1:9001\" }}]\n"
        )
    };
    assert_eq!(parse(&http("")).listeners[0].max_connections, None);
    assert_eq!(
        parse(&http("max_connections = 1")).listeners[0].max_connections,
        Some(1)
    );
    assert_eq!(
        parse(&http("max_connections = 1000000")).listeners[0].max_connections,
        Some(1_000_000)
    );
    let tcp = "[[listeners]]\naddress = \"127.0.0.1:8080\"\nmode = \"tcp\"\npool = \"db\"\n\
               max_connections = 7\n\n[pools.db]\nprotocol = \"tcp\"\n\
               backends = [{ address = \"127.0.0.1:9001\" }]\n";
    assert_eq!(parse(tcp).listeners[0].max_connections, Some(7));
    let socket = "[[listeners]]\naddress = \"unix:/tmp/capataz-test.sock\"\n\
                  max_connections = 3\n\n[pools.web]\n\
                  backends = [{ address = \"127.0.0.1:9001\" }]\n";
    assert_eq!(parse(socket).listeners[0].max_connections, Some(3));
    for bad in ["0", "-5", "1000001"] {
        check(
            &http(&format!("max_connections = {bad}")),
            &format!(
                "config.toml:3: listeners[0].max_connections: {bad} is out of range (use a \
                 whole number from 1 to 1000000)"
            ),
        );
    }
    check(
        &http("max_connections = \"100\""),
        "config.toml:3: listeners[0].max_connections: \"100\" is not a whole number (write \
         digits without quotes or a decimal point, e.g. 3)",
    );
}
