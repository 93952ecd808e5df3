//! `capataz status` and `capataz top` of a pool with limits and sticky sessions: its queue and
//! affinity lines and each backend's `in_flight/limit`, compared with what `/status` says and
//! what the backends hold, while requests wait and once they are all answered.

use std::process::{Command, Stdio};

use super::*;

/// `capataz status --admin admin`, run off the runtime threads; its standard output.
async fn capataz_status(admin: SocketAddr) -> String {
    capataz(&["status"], admin).await
}

/// One frame of `capataz top --admin admin` (not on a terminal: the whole frame).
async fn capataz_top(admin: SocketAddr) -> String {
    capataz(&["top", "--iterations", "1"], admin).await
}

/// `capataz <args> --admin admin`, run off the runtime threads; its standard output.
async fn capataz(args: &[&str], admin: SocketAddr) -> String {
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.extend(["--admin".to_owned(), admin.to_string()]);
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_capataz"))
            .args(&args)
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

/// The `IN-FLIGHT` cell of backend `name`'s row (the sixth column in `capataz status`, the
/// fourth in `capataz top`).
fn in_flight_cell(text: &str, name: &str) -> String {
    let column = if text.starts_with("--- frame") { 3 } else { 5 };
    text.lines()
        .find(|l| l.starts_with(&format!("  {name} ")))
        .and_then(|l| l.split_whitespace().nth(column))
        .unwrap_or_else(|| panic!("no row for {name}: {text}"))
        .to_owned()
}

/// What `capataz status` or `capataz top` must print for `pool` (`/status`'s): the queue line
/// under the pool's sentence, the affinity line and each backend's `in_flight/limit`.
fn check(text: &str, pool: &Value) {
    let queue = &pool["queue"];
    let line = format!(
        "\n  queue: {} waiting of {}, timeout 60 s; refused {} full, {} timed out\n",
        queue["length"], queue["size"], queue["refused_full"], queue["refused_timeout"]
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
async fn capataz_status_and_top_show_the_queue_the_affinity_and_each_backends_limit() {
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
    let top = capataz_top(admin).await;
    // Nothing moved between the reads: the backends hold, the fourth request waits.
    assert_eq!(pool_status(admin).await["queue"]["length"], 1);
    for shown in [&shown, &top] {
        check(shown, &pool);
        assert_eq!(in_flight_cell(shown, "a"), "2/2", "{shown}");
        assert_eq!(in_flight_cell(shown, "b"), "1/1", "{shown}");
    }
    // In top, in the words of `capataz status`, right under the pool's sentence.
    let lines: Vec<&str> = top.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("pool web: 2 of 2 eligible; "))
        .unwrap_or_else(|| panic!("no sentence: {top}"));
    assert!(
        lines[at + 1].starts_with("  queue: 1 waiting of 5"),
        "{top}"
    );
    assert!(lines[at + 2].starts_with("  affinity: sticky"), "{top}");
    assert!(lines[at + 3].starts_with("  BACKEND"), "{top}");

    // The queue full (five waiting): a sixth request is refused at once, and both views say
    // so, as `/status` and the metric count it.
    let more: Vec<_> = ["/r4", "/r5", "/r6", "/r7"].map(send).into_iter().collect();
    wait_queued(admin, 5).await;
    assert_eq!(get(addr, "/r8").await.status, 503);
    let pool = pool_status(admin).await;
    assert_eq!(pool["queue"]["refused_full"], 1, "{pool:#}");
    assert_eq!(
        metric(
            &balancer,
            "capataz_queue_rejected_total{pool=\"web\",reason=\"full\"}"
        ),
        1.0
    );
    for shown in [capataz_status(admin).await, capataz_top(admin).await] {
        check(&shown, &pool);
        assert!(shown.contains("; refused 1 full, 0 timed out\n"), "{shown}");
    }

    a.release(8);
    b.release(8);
    for answer in held.into_iter().chain(more) {
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
    for shown in [capataz_status(admin).await, capataz_top(admin).await] {
        check(&shown, &pool);
        assert_eq!(in_flight_cell(&shown, "a"), "0/2", "{shown}");
    }
}
