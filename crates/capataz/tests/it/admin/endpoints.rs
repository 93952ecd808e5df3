//! The admin endpoints: status and its explain sentences, the backend page, errors.

use super::*;

#[tokio::test]
async fn status_lists_every_backend_and_explains_why_it_is_out() {
    let b = backends(&["good", "good2", "sick", "liar"]).await;
    b[3].set_traffic(Mode::Status(500));
    let all: Vec<&SimBackend> = b.iter().collect();
    let mut r = Running::start(&config_text(
        "",
        &all,
        &[],
        &format!("{FAST_CHECKS}{PASSIVE}"),
    ))
    .await;

    // The liar answers traffic with 500 while its probes pass: passive checks eject it.
    let end = tokio::time::Instant::now() + DEADLINE;
    while b[3].traffic_hits() < 3 {
        assert!(tokio::time::Instant::now() < end, "the liar got no traffic");
        r.proxy.get("/").await;
    }
    r.wait_for("liar ejected", |e| is_transition(e, "liar", State::Down))
        .await;
    // The sick one fails its probes: active checks take it DOWN.
    b[2].set_health(Mode::Status(503));
    r.wait_for("sick DOWN", |e| is_transition(e, "sick", State::Down))
        .await;

    let reply = r.get("/status").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["content-type"], "application/json");
    let pools = reply.json["pools"].as_array().expect("a pools array");
    assert_eq!(pools.len(), 1);
    let pool = &pools[0];
    assert_eq!(text(pool, "/name"), "web");
    assert_eq!(number(pool, "/backends_total"), 4.0);
    assert_eq!(number(pool, "/healthy"), 2.0);
    let listed: HashMap<&str, &Value> = pool["backends"]
        .as_array()
        .expect("a backends array")
        .iter()
        .map(|b| (text(b, "/name"), b))
        .collect();
    assert_eq!(listed.len(), 4);
    for (name, backend) in &listed {
        for pointer in ["/verdict", "/state", "/explain", "/since", "/address"] {
            text(backend, pointer);
        }
        for pointer in [
            "/active/fail_streak",
            "/active/pass_streak",
            "/passive/error_streak",
            "/weight",
            "/effective_weight",
        ] {
            number(backend, pointer);
        }
        assert!(
            !backend["history"]["probes"].as_array().unwrap().is_empty(),
            "{name} has no probe history"
        );
    }
    let good = listed["good"];
    assert_eq!(text(good, "/verdict"), "UP");
    assert_eq!(text(good, "/state"), "UP");
    assert!(text(good, "/explain").starts_with("UP since "), "{good:#}");

    let sick = listed["sick"];
    assert_eq!(text(sick, "/verdict"), "DOWN");
    assert_eq!(text(sick, "/state"), "DOWN");
    assert_eq!(text(sick, "/active/state"), "DOWN");
    assert!(number(sick, "/active/fail_streak") >= 3.0);
    let last_probe = sick["history"]["probes"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    assert_eq!(text(last_probe, "/outcome"), "HTTP 503");
    assert_eq!(text(last_probe, "/result"), "FAIL");

    let liar = listed["liar"];
    assert_eq!(text(liar, "/verdict"), "DOWN");
    assert_eq!(text(liar, "/active/state"), "UP", "its probes pass");
    assert_eq!(text(liar, "/passive/ejection/state"), "ejected");
    assert_eq!(number(liar, "/passive/ejection/nth"), 1.0);
    let traffic = liar["history"]["traffic"].as_array().unwrap();
    assert!(
        traffic
            .iter()
            .any(|t| text(t, "/outcome") == "HTTP 500" && text(t, "/result") == "ERROR"),
        "{liar:#}"
    );

    // One backend at a time, with the sentence that says why it is out.
    let sick = r.backend("sick").await;
    let explain = text(&sick, "/explain");
    assert!(explain.starts_with("DOWN since "), "{explain}");
    assert!(explain.contains("3 consecutive failed probes"), "{explain}");
    assert!(
        explain.contains("needs 2 passing probes in a row"),
        "{explain}"
    );
    assert_eq!(text(&sick, "/last_transition/side"), "active");

    let liar = r.backend("liar").await;
    let explain = text(&liar, "/explain");
    assert!(explain.starts_with("ejected until "), "{explain}");
    assert!(explain.contains("1st ejection"), "{explain}");
    assert!(
        explain.contains("3 consecutive traffic errors"),
        "{explain}"
    );
    assert_eq!(text(&liar, "/last_transition/side"), "passive");

    // Unknown pools and backends, wrong methods, unknown paths: JSON errors.
    for (method, path, status) in [
        ("GET", "/status/nope/good", 404),
        ("GET", "/status/web/nope", 404),
        ("POST", "/status", 405),
        ("DELETE", "/status/web/good", 405),
        ("POST", "/events", 405),
        ("GET", "/backends/web/good/drain", 405),
        ("GET", "/reload", 405),
        ("GET", "/nope", 404),
        ("POST", "/nope/deeper", 404),
    ] {
        let reply = admin_call(r.admin, method, path, None).await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.json);
        assert_eq!(reply.headers["content-type"], "application/json");
        let error = text(&reply.json, "/error");
        if status == 404 {
            assert!(
                error.contains("nope"),
                "{method} {path}: the error names what was not found: {error}"
            );
        }
    }
}
