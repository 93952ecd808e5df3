//! Warnings with file, line and key; a TCP check with `expect`; detection and recovery
//! budgets; a TCP probe's outcome is a connect, not an HTTP status.

use capataz::config::{self, CheckKind, DETECTION_BUDGET, RECOVERY_BUDGET};
use capataz::sim::{Mode, SimBackend};
use capataz_health::{Outcome, ProbeResult, ProbeRule, State};

use super::{capataz, shown, TempDir};
use crate::support::balancer::{start, ConfigText};
use crate::support::events::{transition_of, wait_for};

const BASE: &str = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
                    backends = [{ address = \"127.0.0.1:9001\" }]\n\n[pools.web.active]\n";

/// `(line, key)` of each warning of `BASE` + `active` (lines of `[pools.web.active]`).
fn warned(active: &str) -> Vec<(Option<usize>, String)> {
    let text = format!("{BASE}{active}\n");
    let config = config::parse_str(&text, "app.toml").expect("valid");
    config::check(&config)
        .into_iter()
        .map(|w| (w.line, w.key))
        .collect()
}

#[test]
fn a_tcp_check_with_expect_warns_at_the_expect_line() {
    assert_eq!(
        warned("kind = \"tcp\"\nexpect = \"204\""),
        [(Some(9), "pools.web.active.expect".to_string())]
    );
    assert_eq!(warned("kind = \"tcp\""), []);
    assert_eq!(warned("expect = \"204\""), []);
}

#[test]
fn detection_and_recovery_slower_than_their_budgets_warn() {
    assert_eq!(DETECTION_BUDGET.as_secs(), 60);
    assert_eq!(RECOVERY_BUDGET.as_secs(), 300);
    // fall 3 x (interval 15s + timeout 6s) = 63 s.
    assert_eq!(
        warned("interval = \"15s\"\ntimeout = \"6s\""),
        // fall is not written: the warning points at its table.
        [(Some(7), "pools.web.active.fall".to_string())]
    );
    // 3 x (14 s + 6 s) = 60 s: within the budget.
    assert_eq!(warned("interval = \"14s\"\ntimeout = \"6s\""), []);
    // rise 40 x 10 s = 400 s; fall 2 x 11 s = 22 s is fine.
    assert_eq!(
        warned("interval = \"10s\"\nrise = 40\nfall = 2"),
        [(Some(9), "pools.web.active.rise".to_string())]
    );
}

#[test]
fn a_warning_for_a_default_points_at_the_nearest_written_table() {
    // The key itself is written here: its line.
    let text = format!("{BASE}jitter = 0\n");
    let config = config::parse_str(&text, "app.toml").unwrap();
    let warning = &config::check(&config)[0];
    assert_eq!(warning.to_string().split(": ").next(), Some("app.toml:8"));
    // An HTTP/2 pool probes over TCP by default: `expect` written there warns too.
    let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.web]\nprotocol = \"h2c\"\n\
                backends = [{ address = \"127.0.0.1:9001\" }]\nactive.expect = \"200\"\n";
    let config = config::parse_str(text, "app.toml").unwrap();
    let warnings = config::check(&config);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].line, Some(6));
}

#[test]
fn capataz_check_prints_warnings_with_file_line_and_key() {
    let dir = TempDir::new("warn");
    let file = dir.write(
        "app.toml",
        &format!("{BASE}kind = \"tcp\"\nexpect = \"204\"\n"),
    );
    let path = shown(&file);
    // Valid with a warning: exit 0, as `nginx -t` (1 only with --strict).
    let out = capataz(&["check", &path], &[]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with(&format!(
            "warning: {path}:9: pools.web.active.expect: expect does nothing with kind = \"tcp\""
        )),
        "{}",
        out.stdout
    );
}

#[tokio::test]
async fn a_tcp_probe_is_a_connect_that_passes_whatever_expect_says() {
    let listener = tokio::net::TcpListener::bind(crate::support::any())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let outcome = capataz::prober::probe_once(
        CheckKind::Tcp,
        addr,
        "/",
        "x",
        std::time::Duration::from_secs(5),
    )
    .await;
    assert_eq!(outcome, Outcome::Connected);
    assert_eq!(outcome.to_string(), "TCP connect succeeded");
    let rule = ProbeRule {
        expect: "204".parse().unwrap(),
    };
    assert_eq!(rule.judge(outcome), ProbeResult::Pass);
    drop(listener);
    let refused = capataz::prober::probe_once(
        CheckKind::Tcp,
        addr,
        "/",
        "x",
        std::time::Duration::from_secs(5),
    )
    .await;
    assert_eq!(rule.judge(refused), ProbeResult::Fail);
}

/// Regression: a TCP connect was recorded as "HTTP 200", so `expect = "204"` failed every
/// backend of a `tcp` check, and the events said HTTP 200.
#[tokio::test]
async fn a_tcp_check_with_expect_204_brings_backends_up_and_says_tcp_connect() {
    let backend = SimBackend::start("a", crate::support::any()).await.unwrap();
    backend.set_health(Mode::Status(500));
    let text = ConfigText::sims(std::slice::from_ref(&backend))
        .extra(
            "[pools.web.active]\nkind = \"tcp\"\nexpect = \"204\"\ninterval = \"50ms\"\n\
             timeout = \"40ms\"\ninitial = \"down\"\nrise = 2\n",
        )
        .build();
    let (balancer, mut rx) = start(&text).await;
    let event = wait_for(&mut rx, "backend a UP", |e| {
        transition_of(e, "a", State::Up).is_some()
    })
    .await;
    let shown = format!("{event:?}");
    assert!(!shown.contains("HTTP 200"), "{shown}");
    let pools = balancer.supervisor().pools();
    let page = capataz::status::page(&pools, "now", None, &[]).expect("status page");
    let text = String::from_utf8(page).unwrap();
    assert!(text.contains("TCP connect succeeded"), "{text}");
    assert!(!text.contains("HTTP 200"), "{text}");
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}
