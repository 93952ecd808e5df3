//! Host names in the config: validation checks their syntax and resolves nothing; resolution is
//! a separate, blocking step that names the key of a name that does not resolve. A reload with
//! such a name is refused and the running configuration stays; `capataz check` reports it.

use std::net::SocketAddr;
use std::time::Duration;

use capataz::config;
use capataz::server::Balancer;

use crate::support::{blocking, DEADLINE};

fn text(backend: &str, hook: &str) -> String {
    format!(
        r#"
[admin]
address = "127.0.0.1:0"

[[listeners]]
address = "127.0.0.1:0"

[pools.web]
backends = [{{ name = "b1", address = "{backend}" }}]
active.kind = "none"

[[alerts.webhooks]]
url = "{hook}"
"#
    )
}

#[test]
fn validation_resolved_host_names_on_the_calling_thread() {
    // `.invalid` never resolves (RFC 6761), yet validation alone accepts the syntax.
    let unresolved = config::parse_unresolved(
        &text("backend.invalid:8080", "http://hooks.invalid/x"),
        "<t>",
    )
    .expect("the syntax is valid");
    let names: Vec<&str> = unresolved.names().collect();
    assert_eq!(names, ["backend.invalid:8080", "hooks.invalid:80"]);
    let message = unresolved.resolve().unwrap_err().to_string();
    assert!(
        message.starts_with(
            "<t>:9: pools.web.backends[0].address: \"backend.invalid:8080\" does not resolve"
        ),
        "{message}"
    );
    // IP literals need no lookup at all.
    let literal = config::parse_unresolved(&text("127.0.0.1:9", "http://127.0.0.1:9/x"), "<t>")
        .expect("valid");
    assert_eq!(literal.names().count(), 0);
    let config = literal.resolve().expect("nothing to resolve");
    assert_eq!(
        config.pools[0].backends[0].socket_addr,
        "127.0.0.1:9".parse::<SocketAddr>().expect("an address")
    );
    // Syntax is still checked without resolving.
    for (bad, why) in [
        ("backend.invalid", "has no port"),
        ("backend.invalid:0", "has a bad port"),
        ("backend.invalid:http", "has a bad port"),
        ("bad host:80", "does not start with a host name"),
        ("127.0.0.1:0", "has port 0"),
    ] {
        let message = config::parse_unresolved(&text(bad, "http://127.0.0.1:9/x"), "<t>")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("pools.web.backends[0].address") && message.contains(why),
            "{bad}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_a_name_that_does_not_resolve_keeps_the_old_config() {
    let backend_addr = blocking::backend();
    let path = std::env::temp_dir().join(format!("capataz-dns-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        text(&backend_addr.to_string(), "http://127.0.0.1:9/x"),
    )
    .expect("write config");
    let config = config::load(&path).expect("valid");
    let (events, _) = tokio::sync::broadcast::channel(64);
    let balancer = Balancer::start_with_path(&config, events, Some(path.clone()))
        .await
        .expect("starts");
    std::fs::write(&path, text("backend.invalid:8080", "http://127.0.0.1:9/x"))
        .expect("rewrite config");
    let error = balancer
        .supervisor()
        .reload_from_file()
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("pools.web.backends[0].address")
            && error.contains("\"backend.invalid:8080\" does not resolve"),
        "{error}"
    );
    let listener = balancer.local_addrs()[0];
    let status = tokio::task::spawn_blocking(move || {
        blocking::request(listener, "GET / HTTP/1.1", DEADLINE)
    })
    .await
    .expect("request");
    assert_eq!(status, 200, "the old backend still serves");
    assert_eq!(
        balancer.supervisor().config().pools[0].backends[0].address,
        backend_addr.to_string()
    );
    balancer.shutdown(Duration::from_secs(1)).await;

    // `capataz check` still reports the name.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capataz"))
        .arg("check")
        .arg(&path)
        .output()
        .expect("run capataz check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("pools.web.backends[0].address") && stderr.contains("does not resolve"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&path);
}
