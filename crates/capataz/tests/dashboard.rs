//! The admin dashboard in a real browser: headless Chromium, driven through ChromeDriver's W3C
//! WebDriver HTTP API, loads `GET /` from a running balancer and must follow a backend from UP
//! to DOWN as its probes fail, with the sentence that says why and the event in its log; show
//! the pool's and backends' charts with samples in them (latencies under a millisecond written
//! as such), the DOWN period on the backend's timeline with the sentence on hover; and, loaded
//! again, the event from the balancer's history. Two more tests: one colour per kind
//! of state on badge, timeline and legend (`dashboard/states.rs`), and charts and timelines
//! over the history a young instance has, not a fixed window (`dashboard/charts.rs`).
//!
//! Without ChromeDriver the tests fail, saying how to install it (Debian's `chromium` and
//! `chromium-driver`, by `.ci/deps/chromium.sh`, which `.ci/test` and CI run); they are the
//! `peers` tier's (README.md, "Tests"). Chromium runs with its background networking off, every host name
//! resolving to nothing and a dead proxy for anything not on loopback: it only reaches the
//! balancer's admin listener.
//!
//! Screenshots are taken of the page with the DOWN backend and of the page loaded again; set
//! `CAPATAZ_DASHBOARD_PNG=/some/file.png` to keep them (the second as `file-reloaded.png`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use capataz::config;
use capataz::server::Balancer;
use capataz::sim::{Mode, SimBackend};
use serde_json::Value;

mod support;

#[path = "dashboard/webdriver.rs"]
mod webdriver;

// The regression tests: one colour per state, charts over the history there is; and a pool's
// queue, affinity and backends' limits (`dashboard/limits.rs`).
#[path = "dashboard/charts.rs"]
mod charts;
#[path = "dashboard/limits.rs"]
mod limits;
#[path = "dashboard/states.rs"]
mod states;

use support::any;
use support::balancer::{ConfigText, FAST_CHECKS};
use webdriver::{find_chromedriver, Driver, Session};

/// How long the page gets to show what the balancer knows (it needs well under a second).
const DEADLINE: Duration = Duration::from_secs(30);

/// ChromeDriver started (a missing one fails the test, saying how to install it).
fn browser() -> Driver {
    Driver::start(&find_chromedriver())
}

/// A balancer on a runtime of its own (this thread drives the browser with blocking IO) over
/// scripted backends named `names`, with an admin listener and `extra` after the pool's table.
/// The balancer's events are there too (unread: the page reads them).
/// Dropped in order: the balancer, its backends, then the runtime they ran on.
struct Started {
    balancer: Balancer,
    sims: Vec<SimBackend>,
    _events: tokio::sync::broadcast::Receiver<capataz::health::Notice>,
    _runtime: tokio::runtime::Runtime,
}

fn start_balancer(names: &[&str], weights: &[u32], extra: &str) -> Started {
    start_balancer_listening(names, weights, extra, "")
}

/// As [`start_balancer`], `listener` added to the client listener's table.
fn start_balancer_listening(
    names: &[&str],
    weights: &[u32],
    extra: &str,
    listener: &str,
) -> Started {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let sims: Vec<SimBackend> = runtime.block_on(async {
        let mut sims = Vec::new();
        for name in names {
            let sim = SimBackend::start(name, any()).await;
            sims.push(sim.unwrap_or_else(|e| panic!("start backend {name}: {e}")));
        }
        sims
    });
    let pairs: Vec<(String, SocketAddr)> = sims
        .iter()
        .map(|s| (s.name().to_owned(), s.addr()))
        .collect();
    let text = ConfigText::new(&pairs)
        .weights(weights)
        .admin("")
        .listener(listener)
        .extra(extra)
        .build();
    let config = config::parse_str(&text, "<dashboard test>").expect("valid test config");
    let (events, events_rx) = tokio::sync::broadcast::channel(4096);
    let balancer = runtime
        .block_on(Balancer::start(&config, events))
        .expect("balancer starts");
    Started {
        balancer,
        sims,
        _events: events_rx,
        _runtime: runtime,
    }
}

/// A backend name that would run script if the page inserted names as HTML.
const HOSTILE_NAME: &str = "<img src=x onerror=window.__pwned=1>&amp;";

/// What the page shows, read from its DOM through the test hooks.
const READ_PAGE: &str = r##"
const text = (el, selector) => {
  const found = el.querySelector(selector);
  return found ? found.textContent.trim() : null;
};
return {
  backends: Array.from(document.querySelectorAll("[data-pool][data-backend]")).map((el) => ({
    pool: el.dataset.pool,
    backend: el.dataset.backend,
    name: text(el, ".name"),
    state: text(el, ".state"),
    explain: text(el, ".explain"),
    probe_fails: el.querySelectorAll(".strip i.r-fail").length,
    strip_cells: el.querySelectorAll(".strip i").length,
    down_segments: Array.from(el.querySelectorAll(".timeline rect.k-down")).map((r) => {
      const title = r.querySelector("title");
      return title ? title.textContent : "";
    }),
    up_segments: el.querySelectorAll(".timeline rect.k-up").length,
    charts_with_data: Array.from(el.querySelectorAll("svg.chart"))
      .filter((c) => Number(c.dataset.points) > 0).map((c) => c.getAttribute("class")),
    chart_values: Array.from(el.querySelectorAll(".chart-value")).map((v) => v.textContent),
  })),
  pool_charts: Array.from(document.querySelectorAll("section.pool")).map((el) => ({
    pool: el.dataset.pool,
    with_data: Array.from(el.querySelectorAll(".pool-charts svg.chart"))
      .filter((c) => Number(c.dataset.points) > 0).map((c) => c.getAttribute("class")),
    values: Array.from(el.querySelectorAll(".pool-charts .chart-value")).map((v) => v.textContent),
  })),
  legend: text(document, "#legend"),
  log: Array.from(document.querySelectorAll("#log li")).map((li) => li.textContent),
  images: document.querySelectorAll("#pools img").length,
  pwned: window.__pwned !== undefined,
};
"##;

/// Reads the page until `done` holds for it, failing with the last reading after the deadline.
fn wait_for_page(session: &Session, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + DEADLINE;
    loop {
        let page = session.execute(READ_PAGE);
        if done(&page) {
            return page;
        }
        assert!(
            Instant::now() < end,
            "the dashboard did not show {what} within {DEADLINE:?}; it shows:\n{page:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn backend<'v>(page: &'v Value, name: &str) -> Option<&'v Value> {
    page["backends"]
        .as_array()?
        .iter()
        .find(|b| b["pool"] == "web" && b["backend"] == name)
}

fn shows(page: &Value, name: &str, state: &str) -> bool {
    backend(page, name).is_some_and(|b| b["state"] == state)
}

/// One request through the balancer's listener; its status code.
fn request(addr: SocketAddr, method: &str, path: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("set a read timeout");
    let head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).expect("send a request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read the answer");
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"))
}

/// One request through the balancer's listener, to give the traffic strips something to show.
fn get(addr: SocketAddr) {
    let mut stream = TcpStream::connect(addr).expect("connect to the listener");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("set a read timeout");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .expect("send a request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read the answer");
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[test]
fn dashboard_follows_a_backend_going_down() {
    let driver = browser();
    let started = start_balancer(&["a", "b", HOSTILE_NAME], &[1, 2, 1], FAST_CHECKS);
    let (balancer, b) = (&started.balancer, &started.sims[1]);
    let admin = balancer.admin_addr().expect("the admin API runs");
    let listener = balancer.local_addrs()[0];

    let session = driver.session();
    session.navigate(&format!("http://{admin}/"));

    wait_for_page(&session, "backend b UP", |page| shows(page, "b", "UP"));
    for _ in 0..12 {
        get(listener);
    }

    b.set_health(Mode::Status(503));
    let page = wait_for_page(
        &session,
        "backend b DOWN after 3 failed probes, and the event in the log",
        |page| {
            backend(page, "b").is_some_and(|b| {
                b["state"] == "DOWN"
                    && b["explain"]
                        .as_str()
                        .is_some_and(|s| s.contains("3 consecutive failed probes"))
            }) && page["log"].as_array().is_some_and(|log| {
                log.iter()
                    .filter_map(Value::as_str)
                    .any(|line| line.contains("backend=b") && line.contains("DOWN"))
            })
        },
    );
    let b_row = backend(&page, "b").expect("b is on the page");
    assert!(
        b_row["probe_fails"].as_u64() >= Some(3),
        "b's probe strip shows its failed probes: {b_row:#}"
    );
    assert!(shows(&page, "a", "UP"), "a stays UP: {page:#}");

    // Names come from the config and are shown as text, never as markup.
    let hostile_row = backend(&page, HOSTILE_NAME).expect("the hostile name is a data attribute");
    assert_eq!(hostile_row["name"], HOSTILE_NAME, "{hostile_row:#}");
    assert_eq!(page["images"], 0, "a backend name became markup: {page:#}");
    assert_eq!(page["pwned"], false, "a backend name ran script: {page:#}");

    screenshot(&session, "");

    // The pool's charts fill with samples (one every 5 s) of the requests sent above, with
    // loopback latencies under a millisecond written as such.
    for _ in 0..6 {
        get(listener);
    }
    let page = wait_for_page(&session, "the pool's charts with samples", |page| {
        page["pool_charts"].as_array().is_some_and(|pools| {
            pools.iter().any(|p| {
                p["pool"] == "web"
                    && p["with_data"]
                        .as_array()
                        .is_some_and(|c| c.len() == 3 && c.iter().any(|c| c == "chart c-latency"))
            })
        }) && backend(page, "a").is_some_and(|a| {
            a["charts_with_data"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c == "chart c-rate"))
        })
    });
    let web = page["pool_charts"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pool"] == "web"))
        .expect("the web pool is on the page");
    let latency = web["values"][2].as_str().unwrap_or_default();
    assert!(
        latency.starts_with("p50 ") && !latency.contains("p50 0 ms") && latency.contains(" · p99 "),
        "the pool's latency is written, sub-millisecond ones as such: {web:#}"
    );
    assert!(
        page["legend"]
            .as_str()
            .is_some_and(|l| l.contains("UTC") && l.contains("p99")),
        "the legend says what the colours and lines mean: {page:#}"
    );

    // b's timeline shows its DOWN period, with the sentence of why on hover.
    let page = wait_for_page(&session, "b's DOWN period on its timeline", |page| {
        backend(page, "b").is_some_and(|b| {
            b["down_segments"].as_array().is_some_and(|segments| {
                segments.iter().any(|title| {
                    title.as_str().is_some_and(|t| {
                        t.contains("UTC DOWN") && t.contains("3 consecutive failed probes")
                    })
                })
            }) && b["up_segments"].as_u64() >= Some(1)
        })
    });
    let a_row = backend(&page, "a").expect("a is on the page");
    assert_eq!(
        a_row["down_segments"].as_array().map(Vec::len),
        Some(0),
        "a was never DOWN: {a_row:#}"
    );

    // Loaded again, the page shows the event from the balancer's history at once, though no
    // new event comes (b stays DOWN).
    session.navigate(&format!("http://{admin}/"));
    let page = wait_for_page(&session, "b's DOWN event from the history", |page| {
        page["log"].as_array().is_some_and(|log| {
            log.iter()
                .filter_map(Value::as_str)
                .any(|line| line.contains("backend=b") && line.contains("UP → DOWN"))
        })
    });
    assert!(
        page["log"].as_array().is_some_and(|log| log
            .iter()
            .all(|line| line.as_str().is_some_and(|l| l.contains(" UTC")))),
        "every logged time says UTC: {page:#}"
    );
    wait_for_page(&session, "b's timeline after the reload", |page| {
        backend(page, "b")
            .is_some_and(|b| b["down_segments"].as_array().is_some_and(|s| !s.is_empty()))
    });
    screenshot(&session, "-reloaded");

    session.delete();
    drop(driver);
    drop(started);
}

/// Takes a screenshot, checks it is a PNG, and keeps it when `CAPATAZ_DASHBOARD_PNG` names a
/// file (`suffix` added before its extension).
fn screenshot(session: &Session, suffix: &str) {
    let png = session.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    if let Some(path) = std::env::var_os("CAPATAZ_DASHBOARD_PNG") {
        let path = PathBuf::from(path);
        let path = match suffix {
            "" => path,
            suffix => path.with_file_name(format!(
                "{}{suffix}.png",
                path.file_stem()
                    .map_or_else(Default::default, |s| s.to_string_lossy())
            )),
        };
        std::fs::write(&path, png).expect("write the screenshot");
        eprintln!("screenshot of the dashboard: {}", path.display());
    }
}
