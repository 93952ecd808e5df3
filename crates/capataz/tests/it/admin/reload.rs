//! Live reloads: unchanged backends keep their health, an invalid file changes nothing, added
//! backends wait for their probes, removed ones finish what they started.

use super::*;

/// The fields of a backend's status that a reload must not touch.
fn health_fields(status: &Value) -> Value {
    serde_json::json!({
        "verdict": status["verdict"],
        "state": status["state"],
        "since": status["since"],
        "active": {
            "state": status["active"]["state"],
            "fail_streak": status["active"]["fail_streak"],
            "pass_streak": status["active"]["pass_streak"],
        },
        "passive": status["passive"],
        "last_transition": status["last_transition"],
        "probes": status["history"]["probes"],
    })
}

#[tokio::test]
async fn a_reload_keeps_the_health_of_unchanged_backends() {
    let b = backends(&["a", "b"]).await;
    let both = [&b[0], &b[1]];
    let file = ConfigFile::new(&config_text("", &both, &[], FAST_CHECKS));
    let mut r = Running::start_from(&file).await;
    b[1].set_health(Mode::Status(503));
    r.wait_for("b DOWN", |e| is_transition(e, "b", State::Down))
        .await;
    let before = r.backend("b").await;
    let fail_streak = number(&before, "/active/fail_streak");
    assert!(fail_streak >= 3.0);

    // The operator slows the probes down: the backends themselves are unchanged.
    let slow = FAST_CHECKS.replace("interval = \"30ms\"", "interval = \"1h\"");
    let config = parse(&config_text("", &both, &[], &slow));
    let summary = r
        .balancer
        .reload(&config)
        .await
        .expect("the reload applies");
    assert_eq!((summary.kept, summary.added, summary.removed), (2, 0, 0));
    let after = r.backend("b").await;
    assert_eq!(text(&after, "/verdict"), "DOWN", "{after:#}");
    assert!(
        number(&after, "/active/fail_streak") >= fail_streak,
        "{after:#}"
    );
    assert_eq!(after["last_transition"], before["last_transition"]);
    assert_eq!(after["since"], before["since"]);
    let a = r.backend("a").await;
    assert_eq!(text(&a, "/state"), "UP");
    assert_eq!(r.traffic(10).await.get("a"), Some(&10));

    // With no probe due for an hour, nothing moves: a second reload, from the file, keeps
    // every field exactly.
    let (a_before, b_before) = (r.backend("a").await, r.backend("b").await);
    file.write(&format!(
        "# touched\n{}",
        config_text("", &both, &[], &slow)
    ));
    let reply = r.post("/reload").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(reply.json["reloaded"], true);
    assert_eq!(number(&reply.json, "/kept"), 2.0);
    assert_eq!(number(&reply.json, "/added"), 0.0);
    assert_eq!(number(&reply.json, "/removed"), 0.0);
    let (a_after, b_after) = (r.backend("a").await, r.backend("b").await);
    assert_eq!(health_fields(&a_after), health_fields(&a_before));
    assert_eq!(health_fields(&b_after), health_fields(&b_before));
    assert_eq!(text(&a_after, "/state"), "UP");
    assert_eq!(text(&b_after, "/state"), "DOWN");
    assert_eq!(
        number(&b_after, "/active/fail_streak"),
        number(&b_before, "/active/fail_streak")
    );
    assert_eq!(r.traffic(10).await.get("a"), Some(&10));
}

#[tokio::test]
async fn an_invalid_reload_is_refused_and_the_old_config_keeps_serving() {
    let b = backends(&["a", "b"]).await;
    let both = [&b[0], &b[1]];
    let text_before = config_text("", &both, &[], FAST_CHECKS);
    let file = ConfigFile::new(&text_before);
    let mut r = Running::start_from(&file).await;
    let config_before = r.balancer.supervisor().config();

    let bad_interval = FAST_CHECKS.replace("\"30ms\"", "\"2x\"");
    let in_use = format!("{text_before}\n[[listeners]]\naddress = \"{}\"\n", r.admin);
    for (bad, says) in [
        (
            config_text("", &[&b[0]], &[], &bad_interval),
            "pools.web.active.interval",
        ),
        (
            config_text("", &both, &[], &format!("{FAST_CHECKS}\nbogus = 1\n")),
            "bogus",
        ),
        // Valid, but a new listener cannot bind: nothing changes either.
        (in_use, "is in use (another process listens there"),
    ] {
        file.write(&bad);
        let reply = r.post("/reload").await;
        assert_eq!(reply.status, 422, "{}", reply.json);
        let error = text(&reply.json, "/error");
        assert!(error.contains("reload refused"), "{error}");
        assert!(
            error.contains(says),
            "the error names the problem ({says}): {error}"
        );

        assert_eq!(r.balancer.supervisor().config(), config_before);
        let seen = r.traffic(10).await;
        assert_eq!((seen.get("a"), seen.get("b")), (Some(&5), Some(&5)));
        let status = r.get("/status").await;
        assert_eq!(
            status.json["pools"][0]["backends"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
    assert_eq!(r.balancer.local_addrs().len(), 1);

    // Two mistakes in one file: the refusal names both, as `capataz check` does.
    file.write(&config_text(
        "",
        &both,
        &[],
        &bad_interval.replace("\"100ms\"", "\"soon\""),
    ));
    let reply = r.post("/reload").await;
    assert_eq!(reply.status, 422, "{}", reply.json);
    let error = text(&reply.json, "/error");
    assert!(error.contains("2 errors: "), "{error}");
    assert!(error.contains("pools.web.active.interval"), "{error}");
    assert!(error.contains("pools.web.active.timeout"), "{error}");
    assert_eq!(r.balancer.supervisor().config(), config_before);
}

#[tokio::test]
async fn a_backend_added_by_a_reload_gets_traffic_only_after_rise_probes() {
    let b = backends(&["a", "new"]).await;
    b[1].set_health(Mode::Status(503));
    let file = ConfigFile::new(&config_text("", &[&b[0]], &[], FAST_CHECKS));
    let mut r = Running::start_from(&file).await;

    file.write(&config_text("", &[&b[0], &b[1]], &[], FAST_CHECKS));
    let reply = r.post("/reload").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(number(&reply.json, "/kept"), 1.0);
    assert_eq!(number(&reply.json, "/added"), 1.0);
    let status = r.backend("new").await;
    assert_eq!(text(&status, "/verdict"), "DOWN", "{status:#}");
    assert_eq!(status["eligible"], false);
    let explain = text(&status, "/explain");
    assert!(explain.starts_with("DOWN since "), "{explain}");
    assert!(
        explain.contains("needs 2 passing probes in a row"),
        "{explain}"
    );

    // Probed but failing: no traffic.
    assert!(b[1].wait_health_hits(3, DEADLINE).await);
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(b[1].traffic_hits(), 0, "a gated backend got traffic");

    b[1].set_health(Mode::Status(200));
    let event = r
        .wait_for("new UP", |e| is_transition(e, "new", State::Up))
        .await;
    let Notice::Transition { transition, .. } = event else {
        unreachable!("matched a transition")
    };
    assert!(
        matches!(transition.reason, Reason::ProbesPassed { streak: 2, .. }),
        "{:?}",
        transition.reason
    );
    assert_eq!(b[1].traffic_hits(), 0);
    assert!(r.traffic(20).await.get("new").is_some_and(|&n| n > 0));
    assert!(b[1].traffic_hits() > 0);
}

#[tokio::test]
async fn a_removed_backend_finishes_its_in_flight_request_and_gets_no_more() {
    let b = backends(&["a", "b"]).await;
    b[1].set_traffic(Mode::Delay(Duration::from_millis(700), 200));
    let mut r = Running::start(&config_text("", &[&b[0], &b[1]], &[], FAST_CHECKS)).await;
    let addr = r.balancer.local_addrs()[0];
    // Round robin sends one of two requests to b, which answers late.
    let requests: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { Client::new(addr).get("/").await }))
        .collect();
    assert!(b[1].wait_traffic_hits(1, DEADLINE).await);

    let config = parse(&config_text("", &[&b[0]], &[], FAST_CHECKS));
    let summary = r
        .balancer
        .reload(&config)
        .await
        .expect("the reload applies");
    assert_eq!((summary.kept, summary.added, summary.removed), (1, 0, 1));
    assert!(
        requests.iter().any(|t| !t.is_finished()),
        "the slow request finished before the reload"
    );
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(
        b[1].traffic_hits(),
        1,
        "a removed backend got a new request"
    );
    let status = r.get("/status/web/b").await;
    assert_eq!(status.status, 404);

    let mut served = Vec::new();
    for request in requests {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 200, "a request failed across the reload");
        served.push(answer.backend.unwrap());
    }
    served.sort();
    assert_eq!(served, ["a", "b"]);

    // Nobody probes it any more (one probe may have been under way).
    let probes = b[1].health_hits();
    assert!(
        b[0].wait_health_hits(b[0].health_hits() + 5, DEADLINE)
            .await
    );
    assert!(b[1].health_hits() <= probes + 1);
}
