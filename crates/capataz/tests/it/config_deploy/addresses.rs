//! `localhost:PORT` and `[::1]:PORT` as addresses to listen on, and bind errors that name the
//! key (or flag) to change, once.

use std::net::SocketAddr;

use capataz::config;

use super::{capataz, shown, TempDir};

#[test]
fn localhost_and_bracketed_loopback_addresses_are_accepted() {
    let text = "[admin]\naddress = \"localhost:9911\"\n[[listeners]]\naddress = \"LOCALHOST:0\"\n\
                [[listeners]]\naddress = \"[::1]:8080\"\n\
                [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n";
    let config = config::parse_unresolved(text, "app.toml").expect("valid");
    let config = config.config();
    let v4: SocketAddr = "127.0.0.1:9911".parse().unwrap();
    assert_eq!(config.admin.as_ref().unwrap().address, v4);
    assert_eq!(config.listeners[0].address, "127.0.0.1:0".parse().unwrap());
    assert_eq!(config.listeners[1].address, "[::1]:8080".parse().unwrap());
    for bad in [
        "localhost",
        "localhost:http",
        "localhost:70000",
        "example.com:80",
    ] {
        let text = text.replace("LOCALHOST:0", bad);
        let error = config::parse_unresolved(&text, "app.toml").unwrap_err();
        assert_eq!(
            (error.line(), error.key()),
            (Some(4), "listeners[0].address")
        );
        assert!(error.to_string().contains("localhost:port"), "{error}");
    }
    assert_eq!(
        config::parse_listen_address("localhost:8080"),
        Ok("127.0.0.1:8080".parse().unwrap())
    );
}

#[test]
fn the_admin_flag_takes_localhost() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Nothing listens there now: the flag is accepted, and the request is what fails.
    let out = capataz(&["status", "--admin", &format!("localhost:{port}")], &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(!out.stderr.contains("invalid value"), "{}", out.stderr);
    let out = capataz(&["status", "--admin", "localhost"], &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("localhost:port"), "{}", out.stderr);
}

#[test]
fn a_listener_address_in_use_names_its_key_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let dir = TempDir::new("in-use");
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners]]\naddress = \"{address}\"\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n\
         [pools.web.active]\nkind = \"none\"\n"
    );
    let file = dir.write("app.toml", &text);
    let out = capataz(&["run", "--config", &shown(&file)], &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let said = format!(
        "listeners[1].address {address} is in use (another process listens there: pick another \
         port or stop it)"
    );
    assert!(out.stderr.contains(&said), "{}", out.stderr);
    assert_eq!(out.stderr.matches("in use").count(), 1, "{}", out.stderr);
    drop(taken);
}

#[tokio::test]
async fn an_admin_address_in_use_names_admin_address() {
    let taken = tokio::net::TcpListener::bind(crate::support::any())
        .await
        .unwrap();
    let address = taken.local_addr().unwrap();
    let text = format!(
        "[admin]\naddress = \"{address}\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    );
    let config = config::parse_str(&text, "app.toml").unwrap();
    let (events, _) = tokio::sync::broadcast::channel(8);
    let error = match capataz::server::Balancer::start(&config, events).await {
        Ok(_) => panic!("started on an address in use"),
        Err(error) => error,
    };
    assert_eq!(
        error.to_string(),
        format!(
            "admin.address {address} is in use (another process listens there: pick another \
             port or stop it)"
        )
    );
    assert!(std::error::Error::source(&error).is_none(), "said once");
}
