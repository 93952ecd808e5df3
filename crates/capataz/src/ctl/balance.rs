//! What `capataz status` shows of a pool's load balancing beyond health: its queue when it has
//! connection limits, its affinity (hashing, sticky sessions) when set, and each backend's limit
//! beside its in-flight count. All of it read from the `/status` fields the dashboard shows
//! (`queue`, `affinity`, a backend's `limit`); a pool without them prints as before.

use std::time::Duration;

use serde_json::Value;

use super::cell;

/// The lines under a pool's sentence, each starting with two spaces and ending in a newline:
/// `  queue: 3 waiting of 64, timeout 5 s; refused 2 full, 1 timed out` for a pool with
/// limits, `  affinity: hash on
/// header:x-user, balance factor 150%; sticky cookie SRV, on drain keep (keeping web2)` for
/// one with hashing or sticky sessions; nothing for a pool without them.
pub(super) fn pool_lines(pool: &Value) -> String {
    let mut out = String::new();
    let queue = &pool["queue"];
    if queue.is_object() {
        let timeout = match queue["timeout_ms"].as_u64() {
            Some(ms) => capataz_health::pool::human_duration(Duration::from_millis(ms)).to_string(),
            None => "-".into(),
        };
        out.push_str(&format!(
            "  queue: {} waiting of {}, timeout {timeout}{}\n",
            cell(&queue["length"]),
            cell(&queue["size"]),
            queue_history(queue),
        ));
    }
    let affinity = &pool["affinity"];
    let mut parts = Vec::new();
    let hash = &affinity["hash"];
    if hash.is_object() {
        let factor = match hash["balance_factor"].as_u64() {
            Some(f) if f > 0 => format!(", balance factor {f}%"),
            _ => String::new(),
        };
        parts.push(format!("hash on {}{factor}", cell(&hash["key"])));
    }
    let sticky = &affinity["sticky"];
    if sticky.is_object() {
        let keeping: Vec<String> = sticky["keeping"]
            .as_array()
            .map(|names| names.iter().map(cell).collect())
            .unwrap_or_default();
        let keeping = match keeping.is_empty() {
            true => String::new(),
            false => format!(" (keeping {})", keeping.join(", ")),
        };
        parts.push(format!(
            "sticky cookie {}, on drain {}{keeping}",
            cell(&sticky["cookie"]),
            cell(&sticky["on_drain"]),
        ));
    }
    if !parts.is_empty() {
        out.push_str(&format!("  affinity: {}\n", parts.join("; ")));
    }
    out
}

/// The requests the queue refused since the start, when `/status` says (`refused_full`,
/// `refused_timeout`): `; refused 2 full, 1 timed out`; nothing from an older server.
fn queue_history(queue: &Value) -> String {
    match (
        queue["refused_full"].as_u64(),
        queue["refused_timeout"].as_u64(),
    ) {
        (Some(full), Some(timeout)) => format!("; refused {full} full, {timeout} timed out"),
        _ => String::new(),
    }
}

/// The `IN-FLIGHT` cell: `in_flight/limit` for a backend with a limit, else `in_flight`.
pub(super) fn in_flight_of(b: &Value) -> String {
    match &b["limit"] {
        Value::Null => cell(&b["in_flight"]),
        limit => format!("{}/{}", cell(&b["in_flight"]), cell(limit)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ctl::render_status;

    fn status(pool: Value) -> Value {
        json!({"time": "2026-12-05T09:00:00Z", "pools": [pool]})
    }

    fn pool(queue: Value, affinity: Value, limits: [Value; 2]) -> Value {
        let [la, lb] = limits;
        json!({
            "name": "web", "healthy": 2, "backends_total": 2, "protocol": "http1",
            "explain": "served by its primary backends in rotation",
            "queue": queue, "affinity": affinity,
            "backends": [
                {"name": "a", "address": "127.0.0.1:1", "state": "UP", "weight": 1,
                 "effective_weight": 1.0, "in_flight": 10, "limit": la, "explain": "UP since 09:00:00"},
                {"name": "b", "address": "127.0.0.1:2", "state": "UP", "weight": 1,
                 "effective_weight": 1.0, "in_flight": 2, "limit": lb, "explain": "UP since 09:00:00"},
            ],
        })
    }

    fn row<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("  {name} ")))
            .unwrap_or_else(|| panic!("no row for {name}: {text}"));
        line.split_whitespace().collect()
    }

    #[test]
    fn a_pool_with_limits_shows_its_queue_and_each_backends_in_flight_over_its_limit() {
        let queue = json!({"length": 3, "size": 64, "timeout_ms": 5000});
        let text = render_status(&status(pool(queue, Value::Null, [json!(10), json!(4)])));
        assert!(
            text.contains("\n  queue: 3 waiting of 64, timeout 5 s\n"),
            "{text}"
        );
        let queue = json!({"length": 3, "size": 64, "timeout_ms": 5000,
                           "refused_full": 2, "refused_timeout": 1});
        let text = render_status(&status(pool(queue, Value::Null, [json!(10), json!(4)])));
        assert!(
            text.contains("\n  queue: 3 waiting of 64, timeout 5 s; refused 2 full, 1 timed out\n"),
            "{text}"
        );
        assert!(!text.contains("affinity"), "{text}");
        // BACKEND ADDRESS STATE SINCE WEIGHT IN-FLIGHT ...
        assert_eq!(row(&text, "a")[5], "10/10", "{text}");
        assert_eq!(row(&text, "b")[5], "2/4", "{text}");
    }

    #[test]
    fn a_pool_with_hashing_and_sticky_sessions_shows_its_affinity() {
        let affinity = json!({
            "hash": {"key": "header:x-user", "balance_factor": 150},
            "sticky": {"cookie": "SRV", "on_drain": "keep", "keeping": ["b"]},
        });
        let text = render_status(&status(pool(
            Value::Null,
            affinity,
            [Value::Null, Value::Null],
        )));
        assert!(
            text.contains(
                "\n  affinity: hash on header:x-user, balance factor 150%; \
                 sticky cookie SRV, on drain keep (keeping b)\n"
            ),
            "{text}"
        );
        let affinity = json!({"hash": null, "sticky": {"cookie": "S\u{1b}", "on_drain": "move", "keeping": []}});
        let text = render_status(&status(pool(
            Value::Null,
            affinity,
            [Value::Null, Value::Null],
        )));
        assert!(
            text.contains("\n  affinity: sticky cookie S\\u{1b}, on drain move\n"),
            "{text}"
        );
        let affinity = json!({"hash": {"key": "client_ip", "balance_factor": 0}, "sticky": null});
        let text = render_status(&status(pool(
            Value::Null,
            affinity,
            [Value::Null, Value::Null],
        )));
        assert!(text.contains("\n  affinity: hash on client_ip\n"), "{text}");
    }

    #[test]
    fn a_pool_without_limits_or_affinity_prints_as_before() {
        let text = render_status(&status(pool(
            Value::Null,
            Value::Null,
            [Value::Null, Value::Null],
        )));
        assert!(
            !text.contains("queue") && !text.contains("affinity"),
            "{text}"
        );
        assert_eq!(row(&text, "a")[5], "10", "{text}");
        assert_eq!(row(&text, "b")[5], "2", "{text}");
        assert_eq!(
            text.lines().nth(2),
            Some("pool web: 2 of 2 backends eligible; served by its primary backends in rotation")
        );
        assert!(
            text.lines()
                .nth(3)
                .is_some_and(|l| l.starts_with("  BACKEND")),
            "{text}"
        );
    }
}
