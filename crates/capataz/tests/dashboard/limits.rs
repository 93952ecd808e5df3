//! A pool with connection limits and sticky sessions shows its queue (requests waiting of its
//! size, its timeout, the requests it refused) and its affinity in its header, and each backend its in-flight count over
//! its limit; a listener with `max_connections` its connections over it: the same figures
//! `/status` gives at that moment.

use super::*;

use support::raw::send_head;

/// Two backends that may hold one request each, a queue of 8, a sticky cookie.
const LIMITS: &str = "max_connections = 1\nqueue_size = 8\nqueue_timeout = \"60s\"\n\
                      [pools.web.sticky]\ncookie = \"SRV\"\n";

/// The pool's header and each backend's in-flight and limit, as the page shows them.
const READ_LIMITS: &str = r##"
const text = (el, selector) => {
  const found = el.querySelector(selector);
  return found ? found.textContent.trim() : null;
};
const pool = document.querySelector("section.pool");
return {
  queue: pool ? text(pool, ".pool-head .queue") : null,
  queue_length: pool && pool.querySelector(".queue") ? pool.querySelector(".queue").dataset.length : null,
  affinity: pool ? text(pool, ".pool-head .affinity") : null,
  listener: text(document, "#listeners .listener"),
  listener_open: document.querySelector("#listeners .listener")
    ? document.querySelector("#listeners .listener").dataset.open : null,
  backends: Array.from(document.querySelectorAll("tbody[data-backend]")).map((el) => ({
    backend: el.dataset.backend,
    in_flight: text(el, ".in-flight"),
    limit: text(el, ".limit"),
  })),
};
"##;

/// A request sent and left open: the backend (answering nothing) holds it, or it waits.
fn hold(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect to the listener");
    let head = format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n");
    stream.write_all(head.as_bytes()).expect("send a request");
    stream
}

#[test]
fn dashboard_shows_a_pools_queue_and_affinity_and_each_backends_limit() {
    let driver = browser();
    let extra = format!("{LIMITS}{FAST_CHECKS}");
    // The listener holds at most the three requests below.
    let started = start_balancer_listening(&["a", "b"], &[], &extra, "max_connections = 3");
    let admin = started.balancer.admin_addr().expect("the admin API runs");
    let listener = started.balancer.local_addrs()[0];
    let session = driver.session();
    session.navigate(&format!("http://{admin}/"));
    wait_for_page(&session, "a and b UP", |page| {
        shows(page, "a", "UP") && shows(page, "b", "UP")
    });

    // Both backends hold what they get: two requests fill their limits, the third waits.
    for sim in &started.sims {
        sim.set_traffic(Mode::Hang);
    }
    let _held: Vec<TcpStream> = ["/1", "/2", "/3"]
        .iter()
        .map(|path| hold(listener, path))
        .collect();
    let end = Instant::now() + DEADLINE;
    let page = loop {
        let page = session.execute(READ_LIMITS);
        let full = page["backends"].as_array().is_some_and(|b| {
            b.len() == 2 && b.iter().all(|b| b["in_flight"] == "1" && b["limit"] == "1")
        });
        if full && page["queue_length"] == "1" && page["listener_open"] == "3" {
            break page;
        }
        assert!(
            Instant::now() < end,
            "the page did not show two full backends and one request waiting: {page:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };

    // What `/status` says now (nothing moves: the backends hold, the third request waits).
    let (code, answer) = started._runtime.block_on(send_head(
        admin,
        &format!("GET /status HTTP/1.1\r\nhost: {admin}"),
    ));
    assert_eq!(code, 200, "{answer}");
    let body = &answer[answer.find("\r\n\r\n").expect("a body") + 4..];
    let status: Value = serde_json::from_str(body).expect("/status is JSON");
    let pool = &status["pools"][0];
    let queue = &pool["queue"];
    assert_eq!(queue["timeout_ms"], 60_000, "{pool:#}");
    assert_eq!(
        page["queue"].as_str(),
        Some(
            format!(
                "queue: {} waiting of {}, timeout 60 s; refused {} full, {} timed out",
                queue["length"], queue["size"], queue["refused_full"], queue["refused_timeout"]
            )
            .as_str()
        ),
        "{page:#}\n{pool:#}"
    );
    assert_eq!(queue["length"], 1, "{pool:#}");
    assert_eq!(
        page["affinity"], "affinity: sticky cookie SRV, on drain keep",
        "{page:#}\n{pool:#}"
    );
    assert_eq!(pool["affinity"]["sticky"]["cookie"], "SRV", "{pool:#}");
    // The listener, full with the three: the same figures as `/status`'s.
    let listener_status = &status["listeners"][0];
    assert_eq!(listener_status["open"], 3, "{listener_status:#}");
    assert_eq!(listener_status["full"], true, "{listener_status:#}");
    assert_eq!(
        page["listener"].as_str(),
        Some(
            format!(
                "listener listener-0 ({}, http): 3 connections of 3 max; {} waited at the limit \
                 full: new connections wait",
                listener_status["address"].as_str().expect("an address"),
                listener_status["limit_reached"],
            )
            .as_str()
        ),
        "{page:#}\n{listener_status:#}"
    );
    for b in pool["backends"].as_array().expect("backends") {
        let shown = page["backends"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["backend"] == b["name"]))
            .unwrap_or_else(|| panic!("{} is not on the page: {page:#}", b["name"]));
        assert_eq!(
            shown["in_flight"],
            b["in_flight"].to_string(),
            "{page:#}\n{b:#}"
        );
        assert_eq!(shown["limit"], b["limit"].to_string(), "{page:#}\n{b:#}");
    }

    session.delete();
    drop(driver);
    drop(started);
}
