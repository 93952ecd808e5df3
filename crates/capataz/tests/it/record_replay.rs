//! The recorder end to end (what-if): a running balancer with a scripted slow
//! backend, `GET /record/web` on its admin API while the latency-outlier detector ejects the
//! backend, and `capataz replay` of that log: under the recorded thresholds (the same config
//! file) it ejects the same backend with the same sentence; under a looser factor it does not.
//! Also: the recorder's cap, its admin auth, and an unknown pool.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz::server::Balancer;
use capataz::sim::Mode;
use capataz_health::{Reason, State};
use tokio::sync::broadcast;
use tokio::task::JoinSet;

use crate::support::balancer::{backends, parse};
use crate::support::client::Client;
use crate::support::events::{transition_of, wait_for};
use crate::support::stream;

/// Pool `web` over a, b (10 ms) and slow (100 ms), with the latency-outlier detector on short
/// windows, slow probes and no retries; `admin` lines go in the `[admin]` table.
fn config(b: &[capataz::sim::SimBackend], admin: &str) -> String {
    let list: Vec<String> = b
        .iter()
        .map(|b| format!("{{ name = \"{}\", address = \"{}\" }}", b.name(), b.addr()))
        .collect();
    format!(
        r#"[admin]
address = "127.0.0.1:0"
{admin}

[[listeners]]
address = "127.0.0.1:0"

[pools.web]
backends = [{}]

[pools.web.active]
interval = "1s"

[pools.web.retries]
attempts = 0

[pools.web.passive]
ejection_time = "1s"
max_ejection_time = "10s"

[pools.web.passive.latency_outliers]
enabled = true
percentile = "p50"
factor = 3
windows = 2
window = "300ms"
min_requests = 3
min_latency = "5ms"
"#,
        list.join(", ")
    )
}

/// Runs `capataz replay` over `log` with `args`; returns (stdout, stderr).
fn replay(args: &[&str], log: &str) -> (String, String) {
    let dir = std::env::temp_dir().join(format!(
        "capataz-record-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("recorded.log");
    std::fs::write(&path, log).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .arg("replay")
        .args(args)
        .arg(&path)
        .output()
        .expect("the capataz binary runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "{output:?}");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_log_replays_the_ejection_under_its_thresholds_and_not_under_looser_ones() {
    let b = backends(&["a", "b", "slow"]).await;
    b[0].set_traffic(Mode::Delay(Duration::from_millis(10), 200));
    b[1].set_traffic(Mode::Delay(Duration::from_millis(10), 200));
    b[2].set_traffic(Mode::Delay(Duration::from_millis(100), 200));
    let text = config(&b, "");
    let (events, mut rx) = broadcast::channel(65_536);
    let balancer = Balancer::start(&parse(&text), events)
        .await
        .expect("balancer starts");
    let admin = balancer.admin_addr().expect("the admin API runs");

    // Record from before the first request.
    let (status, mut log) = stream::open(admin, "/record/web", "").await;
    assert_eq!(status, 200, "{}", log.text);
    log.read_until("the log's head", |t| t.contains("\nPOOL a b slow\n"))
        .await;

    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = JoinSet::new();
    for _ in 0..6 {
        let (addr, stop) = (balancer.local_addrs()[0], stop.clone());
        loops.spawn(async move {
            let mut client = Client::new(addr);
            while !stop.load(Ordering::Relaxed) {
                client.get("/").await;
            }
        });
    }
    let event = wait_for(&mut rx, "slow ejected", |e| {
        transition_of(e, "slow", State::Down).is_some()
    })
    .await;
    let t = *transition_of(&event, "slow", State::Down).unwrap();
    assert!(
        matches!(t.reason, Reason::SlowTraffic { .. }),
        "{}",
        t.reason
    );
    let ejected_ms = t.at.as_millis();
    // Keep recording past the ejection, so the log holds the window that ended there.
    let past = ejected_ms + 600;
    log.read_until("the log past the ejection", |text| {
        text.lines()
            .filter_map(|l| l.strip_prefix("AT "))
            .filter_map(|ms| ms.parse::<u128>().ok())
            .any(|ms| ms > past)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    while loops.join_next().await.is_some() {}
    let recorded = log.text.clone();
    drop(log);
    // The detector's metrics, which promtool finds nothing to say about.
    let page = crate::support::client::exchange(admin, "GET", "/metrics", &admin.to_string(), &[])
        .await
        .text();
    assert!(
        page.contains(
            "capataz_outlier_ejections_total{pool=\"web\",backend=\"slow\",detector=\"latency\"} "
        ),
        "{page}"
    );
    assert!(page.contains("capataz_backend_slow_windows{pool=\"web\",backend=\"a\"} 0"));
    let (code, findings) = crate::support::prometheus::promtool_check(&page);
    assert_eq!((code, findings.trim()), (0, ""), "promtool:\n{findings}");
    balancer.shutdown(Duration::from_secs(1)).await;

    assert!(
        recorded.contains("\nTRAFFIC slow 1"),
        "latencies are recorded"
    );
    assert!(!recorded.contains("# dropped"), "nothing was lost");

    let dir = std::env::temp_dir().join(format!(
        "capataz-record-config-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("capataz.toml");
    std::fs::write(&config_path, &text).unwrap();
    let config_path = config_path.to_str().unwrap().to_owned();

    // The recorded thresholds: slow is ejected by the same detector, around the same time.
    let (_, explain) = replay(&["--explain", "--config", &config_path], &recorded);
    let first = explain
        .lines()
        .find(|l| l.contains(" slow UP -> DOWN: "))
        .unwrap_or_else(|| panic!("no ejection in the replay: {explain}\n--- log\n{recorded}"));
    assert!(
        first.contains(": p50 ") && first.contains("over the last 2 windows; ejected for 1 s"),
        "{first}"
    );
    let at: u128 = first[1..first.find(' ').unwrap()].parse().unwrap();
    assert!(
        at.abs_diff(ejected_ms) <= 600,
        "replayed at {at} ms, ejected at {ejected_ms} ms"
    );
    assert!(
        !explain.contains(" a UP -> DOWN") && !explain.contains(" b UP -> DOWN"),
        "{explain}"
    );

    // A looser factor on the same log: nobody is ejected.
    let (_, looser) = replay(
        &[
            "--explain",
            "--config",
            &config_path,
            "--set",
            "passive.latency_outliers.factor=20",
        ],
        &recorded,
    );
    assert!(!looser.contains("UP -> DOWN"), "{looser}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn recorders_are_capped_per_pool_need_the_admin_token_and_name_a_pool() {
    let b = backends(&["a"]).await;
    let (events, _rx) = broadcast::channel(1024);
    let balancer = Balancer::start(&parse(&config(&b, "token = \"s3cret\"")), events)
        .await
        .expect("balancer starts");
    let admin = balancer.admin_addr().unwrap();
    let auth = "Authorization: Bearer s3cret\r\n";

    let (status, _) = stream::open(admin, "/record/web", "").await;
    assert_eq!(status, 401, "no token, no record");
    let (status, _) = stream::open(admin, "/record/nope", auth).await;
    assert_eq!(status, 404);

    let mut open = Vec::new();
    for _ in 0..capataz::balance::tap::MAX_RECORDERS {
        let (status, mut s) = stream::open(admin, "/record/web", auth).await;
        assert_eq!(status, 200);
        s.read_until("the head", |t| t.contains("POOL a\n")).await;
        open.push(s);
    }
    let (status, refused) = stream::open(admin, "/record/web", auth).await;
    assert_eq!(status, 503, "{}", refused.text);
    // A recorder that leaves frees its place.
    drop(open.pop());
    // (The server notices the reader left when its next write fails or its task ends: polled
    // with the suite's deadline.)
    let place = "the place of a recorder that left taken again";
    crate::support::wait::until_ok(
        place,
        crate::support::wait::POLL,
        async || match stream::open(admin, "/record/web", auth).await {
            (200, _) => Ok(()),
            (status, _) => Err(format!("{status}")),
        },
    )
    .await;
    balancer.shutdown(Duration::from_secs(1)).await;
}
