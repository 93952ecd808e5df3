//! `capataz status` of a pool with limits and sticky sessions: its queue and affinity lines and
//! each backend's `in_flight/limit`, compared with what `/status` says and what the backends
//! hold, while requests wait and once they are all answered.

use std::process::{Command, Stdio};

use super::*;

/// `capataz status --admin admin`, run off the runtime threads; its standard output.
async fn capataz_status(admin: SocketAddr) -> String {
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_capataz"))
            .args(["status", "--admin", &admin.to_string()])
            .stdin(Stdio::null())
            .output()
            .expect("run capataz status")
    })
    .await
    .expect("the command's task");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The `IN-FLIGHT` cell of backend `name`'s row (the sixth column).
fn in_flight_cell(text: &str, name: &str) -> String {
    text.lines()
        .find(|l| l.starts_with(&format!("  {name} ")))
        .and_then(|l| l.split_whitespace().nth(5))
        .unwrap_or_else(|| panic!("no row for {name}: {text}"))
        .to_owned()
}

/// What `capataz status` must print for `pool` (`/status`'s): the queue line and each
/// backend's `in_flight/limit`.
fn check(text: &str, pool: &Value) {
    let queue = &pool["queue"];
    let line = format!(
        "\n  queue: {} waiting of {}, timeout 60 s\n",
        queue["length"], queue["size"]
    );
    assert_eq!(queue["timeout_ms"], 60_000, "{pool:#}");
    assert!(text.contains(&line), "{line:?} in:\n{text}\n{pool:#}");
    assert!(
        text.contains("\n  affinity: sticky cookie SRV, on drain keep\n"),
        "{text}"
    );
    for b in pool["backends"].as_array().expect("backends") {
        let name = b["name"].as_str().expect("a name");
        let cell = format!("{}/{}", b["in_flight"], b["limit"]);
        assert_eq!(in_flight_cell(text, name), cell, "{text}\n{b:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capataz_status_shows_the_queue_the_affinity_and_each_backends_limit() {
    let (a, b) = (
        SlowBackend::start(Hold::Gate).await,
        SlowBackend::start(Hold::Gate).await,
    );
    let text = config(
        &[
            ("a", a.addr(), ", max_connections = 2"),
            ("b", b.addr(), ""),
        ],
        "max_connections = 1\nqueue_size = 5\nqueue_timeout = \"60s\"\nsticky = { cookie = \"SRV\" }",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let send = |path: &'static str| tokio::spawn(async move { get(addr, path).await });
    let held = [send("/r0"), send("/r1"), send("/r2")];
    wait_until("a holding 2 and b 1", || {
        a.holding() == 2 && b.holding() == 1
    })
    .await;
    let queued = send("/r3");
    let pool = wait_queued(admin, 1).await;
    let shown = capataz_status(admin).await;
    // Nothing moved between the two reads: the backends hold, the fourth request waits.
    assert_eq!(pool_status(admin).await["queue"]["length"], 1);
    check(&shown, &pool);
    assert_eq!(in_flight_cell(&shown, "a"), "2/2", "{shown}");
    assert_eq!(in_flight_cell(&shown, "b"), "1/1", "{shown}");

    a.release(8);
    b.release(8);
    for answer in held {
        assert_eq!(answer.await.unwrap().status, 200);
    }
    assert_eq!(queued.await.unwrap().status, 200);
    let pool = until_ok("nothing in flight", Duration::from_millis(10), async || {
        let pool = pool_status(admin).await;
        let idle = pool["backends"]
            .as_array()
            .is_some_and(|all| all.iter().all(|b| b["in_flight"] == 0));
        match idle && pool["queue"]["length"] == 0 {
            true => Ok(pool),
            false => Err(format!("{pool:#}")),
        }
    })
    .await;
    let shown = capataz_status(admin).await;
    check(&shown, &pool);
    assert_eq!(in_flight_cell(&shown, "a"), "0/2", "{shown}");
}
