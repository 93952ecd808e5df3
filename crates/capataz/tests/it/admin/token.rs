//! The token rule: a token guards every request unless reads are open, and an admin listener
//! off loopback needs one.

use super::*;

#[tokio::test]
async fn a_token_guards_every_request_unless_reads_are_open() {
    let b = backends(&["a"]).await;
    let r = Running::start(&config_text(
        "token = \"s3cret\"",
        &[&b[0]],
        &[],
        FAST_CHECKS,
    ))
    .await;
    // Each request, and the state of `a` once it has been let through.
    let requests = [
        ("GET", "/status", "UP"),
        ("GET", "/status/web/a", "UP"),
        ("POST", "/backends/web/a/drain", "DRAINING"),
        ("POST", "/backends/web/a/clear", "UP"),
    ];
    let mut state = "UP";
    for (method, path, after) in requests {
        for refused in [
            None,
            Some("Bearer wrong"),
            Some("s3cret"),
            Some("Bearer s3cret2"),
        ] {
            let reply = admin_call(r.admin, method, path, refused).await;
            assert_eq!(reply.status, 401, "{method} {path} with {refused:?}");
            assert_eq!(
                reply.headers["www-authenticate"],
                "Bearer realm=\"capataz\""
            );
            assert!(
                text(&reply.json, "/error").contains("Authorization: Bearer"),
                "{}",
                reply.json
            );
        }
        // A refused request changed nothing.
        let status = admin_call(r.admin, "GET", "/status/web/a", Some("Bearer s3cret")).await;
        assert_eq!(
            text(&status.json, "/state"),
            state,
            "after refused {method} {path}"
        );
        let reply = admin_call(r.admin, method, path, Some("Bearer s3cret")).await;
        assert_eq!(reply.status, 200, "{method} {path}: {}", reply.json);
        state = after;
        let status = admin_call(r.admin, "GET", "/status/web/a", Some("Bearer s3cret")).await;
        assert_eq!(text(&status.json, "/state"), state, "after {method} {path}");
    }

    // With open_read_only, reads need no token; anything that changes something still does.
    let r = Running::start(&config_text(
        "token = \"s3cret\"\nopen_read_only = true",
        &[&b[0]],
        &[],
        FAST_CHECKS,
    ))
    .await;
    assert_eq!(r.get("/status").await.status, 200);
    assert_eq!(r.get("/status/web/a").await.status, 200);
    for path in ["/backends/web/a/drain", "/reload"] {
        assert_eq!(r.post(path).await.status, 401, "POST {path}");
    }
    assert_eq!(text(&r.backend("a").await, "/state"), "UP");
    let reply = admin_call(
        r.admin,
        "POST",
        "/backends/web/a/drain",
        Some("Bearer s3cret"),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&r.backend("a").await, "/state"), "DRAINING");
}

#[test]
fn a_non_loopback_admin_address_without_a_token_is_a_config_error() {
    let rest = r#"
[[listeners]]
address = "127.0.0.1:0"

[pools.web]
backends = [{ address = "127.0.0.1:9001" }]
"#;
    let error = config::parse_str(
        &format!("[admin]\naddress = \"0.0.0.0:9901\"\n{rest}"),
        "<test>",
    )
    .expect_err("a non-loopback admin address without a token is refused")
    .to_string();
    assert!(error.contains("admin.address"), "{error}");
    assert!(
        error.contains("admin.token"),
        "the error says what to do: {error}"
    );
    let config = parse(&format!(
        "[admin]\naddress = \"0.0.0.0:9901\"\ntoken = \"s3cret\"\n{rest}"
    ));
    assert_eq!(config.admin.unwrap().token.as_deref(), Some("s3cret"));
}
