//! `capataz replay` as a what-if tool for gray failures: the thresholds of a pool's
//! detectors from a config file (`--config`, `--pool`) or changed key by key (`--set`),
//! validated as the balancer validates them, over a timed log with latencies.

use std::process::{Command, Output};

fn replay(args: &[&str], script: &str) -> Output {
    let dir = tempdir();
    let path = dir.join("log.in");
    std::fs::write(&path, script).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .arg("replay")
        .args(args)
        .arg(&path)
        .output()
        .expect("the capataz binary runs");
    let _ = std::fs::remove_dir_all(&dir);
    output
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "capataz-what-if-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Forty seconds of traffic: a, b, c answer in 10 ms, d in `slow`, four requests a second each.
fn slow_log(slow: &str) -> String {
    let mut script = String::from("AT 0\nPOOL a b c d\n");
    for step in 1..=160u64 {
        script.push_str(&format!("AT {}\n", step * 250));
        for b in ["a", "b", "c"] {
            script.push_str(&format!("TRAFFIC {b} 10 HTTP/1.1 200 OK\n"));
        }
        script.push_str(&format!("TRAFFIC d {slow} HTTP/1.1 200 OK\n"));
    }
    script.push_str("STATUS\n");
    script
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn set_turns_the_latency_detector_on_with_the_balancers_defaults() {
    let on = replay(
        &[
            "--explain",
            "--set",
            "passive.latency_outliers.enabled=true",
        ],
        &slow_log("100"),
    );
    assert!(on.status.success(), "{on:?}");
    assert!(text(&on.stdout).ends_with("c UP\nd DOWN\n"), "{on:?}");
    assert_eq!(
        text(&on.stderr),
        "@30000 d UP -> DOWN: p99 106 ms against a pool median of 9 ms over the last 3 \
         windows; ejected for 30 s (ejection #1)\n"
    );
    // The same log with the detector off (the protocol's defaults): nobody is ejected.
    let off = replay(&["--explain"], &slow_log("100"));
    assert!(text(&off.stdout).ends_with("c UP\nd UP\n"), "{off:?}");
    assert_eq!(text(&off.stderr), "");
}

#[test]
fn a_config_pools_thresholds_apply_and_set_overrides_them() {
    let dir = tempdir();
    let config = dir.join("capataz.toml");
    std::fs::write(
        &config,
        r#"
[[listeners]]
address = "127.0.0.1:8080"
  [[listeners.routes]]
  path_prefix = "/api/"
  pool = "api"
  [[listeners.routes]]
  pool = "web"

[pools.web]
backends = [{ address = "127.0.0.1:9001" }]

[pools.api]
backends = [{ address = "127.0.0.1:9002" }]
[pools.api.passive]
ejection_time = "10s"
[pools.api.passive.latency_outliers]
enabled = true
percentile = "p50"
window = "5s"
windows = 2
"#,
    )
    .unwrap();
    let config = config.to_str().unwrap();
    // The api pool: p50, 5 s windows, 2 of them, ejected for 10 s. The first window (0-5 s)
    // holds 19 requests of each backend, fewer than `min_requests`: the 2nd and 3rd eject.
    let api = replay(
        &["--explain", "--config", config, "--pool", "api"],
        &slow_log("100"),
    );
    assert!(api.status.success(), "{api:?}");
    assert_eq!(
        text(&api.stderr).lines().next().unwrap_or_default(),
        "@15000 d UP -> DOWN: p50 106 ms against a pool median of 9 ms over the last 2 \
         windows; ejected for 10 s (ejection #1)"
    );
    // A looser factor for the same log, from the command line: no ejection.
    let looser = replay(
        &[
            "--explain",
            "--config",
            config,
            "--pool",
            "api",
            "--set",
            "passive.latency_outliers.factor=20",
        ],
        &slow_log("100"),
    );
    assert!(looser.status.success(), "{looser:?}");
    assert_eq!(text(&looser.stderr), "");
    // Two pools and no --pool: a usage error naming the fix.
    let which = replay(&["--config", config], &slow_log("100"));
    assert_eq!(which.status.code(), Some(2), "{which:?}");
    assert!(text(&which.stderr).contains("--pool"), "{which:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_settings_exit_2_naming_the_key_and_run_nothing() {
    for args in [
        &["--set", "passive.latency_outliers.factor=0"][..],
        &["--set", "passive.latency_outliers.percentile=p42"],
        &["--set", "passive.nonsense"],
        &["--set", "passive..factor=3"],
        &["--set", "passive.latency_outliers.window=0s"],
        &["--pool", "nope"],
    ] {
        let output = replay(args, "POOL a\nSTATUS\n");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert_eq!(text(&output.stdout), "", "{args:?}: nothing may run");
        assert!(!text(&output.stderr).is_empty(), "{args:?}");
    }
}
