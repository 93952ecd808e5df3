//! Unix socket addresses in the config: `unix:/path` backends and listeners, and each way
//! one is refused, with its line and key.

use super::*;

/// A pool `web` whose one backend is `address`, with `extra` lines in the pool's table.
fn unix_pool(address: &str, extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[pools.web]\n\
         backends = [{{ address = \"127.0.0.1:9001\" }}, {{ address = {address:?} }}]\n{extra}\n"
    )
}

#[test]
fn a_unix_backend_keeps_its_path_as_its_address_and_name() {
    let config = parse(&unix_pool("unix:/run/app.sock", ""));
    let backend = &config.pools[0].backends[1];
    assert_eq!(backend.name, "unix:/run/app.sock");
    assert_eq!(
        backend.unix_path(),
        Some(std::path::Path::new("/run/app.sock"))
    );
    assert_eq!(config.pools[0].backends[0].unix_path(), None);
    // h2c, tcp pools and PROXY protocol take one too.
    parse(&unix_pool("unix:/run/app.sock", "protocol = \"h2c\""));
    parse(&unix_pool(
        "unix:/run/app.sock",
        "send_proxy_protocol = \"v2\"",
    ));
}

#[test]
fn bad_unix_addresses_name_the_line_and_key() {
    let longest = format!("/{}", "s".repeat(106));
    let cases: Vec<(String, &str)> = vec![
        (
            unix_pool("unix:run/app.sock", ""),
            "is not an absolute path",
        ),
        (unix_pool("unix:", ""), "is not an absolute path"),
        (unix_pool("unix:/run/", ""), "names a directory"),
        (
            unix_pool("unix:/run/a\nb.sock", ""),
            "holds a control character",
        ),
        (
            unix_pool(&format!("unix:{longest}s"), ""),
            "is 108 bytes long; a Unix socket path holds at most 107",
        ),
        (
            unix_pool("/run/app.sock", ""),
            "write it unix:/run/app.sock",
        ),
        (
            unix_pool("unix@/run/app.sock", ""),
            "write it unix:/run/app.sock",
        ),
        (
            unix_pool("unix:/run/app.sock", "tls = true"),
            "TLS over a Unix socket is not supported",
        ),
        (
            unix_pool(
                "unix:/run/app.sock",
                "[pools.web.agent]\nport = 9777\ninterval = \"5s\"\ntimeout = \"1s\"",
            ),
            "connect to a TCP port on the backend's host",
        ),
    ];
    for (text, says) in &cases {
        let error = check_err(text, Some(5), "pools.web.backends[1].address");
        assert!(error.to_string().contains(says), "{error} lacks {says:?}");
    }
    assert!(parse_str(&unix_pool(&format!("unix:{longest}"), ""), "c").is_ok());
}

/// A listener on `address` with `extra` lines, and pool `web`.
fn unix_listener(address: &str, extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = {address:?}\n{extra}\n\n[pools.web]\n\
         backends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn a_unix_socket_listener_keeps_its_path_and_socket_mode() {
    let config = parse(&unix_listener(
        "unix:/run/capataz.sock",
        "socket_mode = \"0660\"",
    ));
    let unix = config.listeners[0]
        .unix
        .as_ref()
        .expect("a socket listener");
    assert_eq!(unix.path, std::path::Path::new("/run/capataz.sock"));
    assert_eq!(unix.mode, Some(0o660));
    let config = parse(&unix_listener("unix:/run/capataz.sock", ""));
    assert_eq!(config.listeners[0].unix.as_ref().unwrap().mode, None);
    assert_eq!(
        parse(&unix_listener("127.0.0.1:8080", "")).listeners[0].unix,
        None
    );
}

#[test]
fn a_unix_socket_listener_is_refused_what_it_cannot_have() {
    let cases = [
        (
            unix_listener("/run/capataz.sock", ""),
            Some(2),
            "listeners[0].address",
            "write it unix:/run/capataz.sock",
        ),
        (
            unix_listener("unix@/run/capataz.sock", ""),
            Some(2),
            "listeners[0].address",
            "write it unix:/run/capataz.sock",
        ),
        (
            unix_listener("unix:run/capataz.sock", ""),
            Some(2),
            "listeners[0].address",
            "is not an absolute path",
        ),
        (
            unix_listener("unix:/run/capataz.sock", "socket_mode = \"rw\""),
            Some(3),
            "listeners[0].socket_mode",
            "is not a file mode",
        ),
        (
            unix_listener("unix:/run/capataz.sock", "socket_mode = \"+660\""),
            Some(3),
            "listeners[0].socket_mode",
            "is not a file mode",
        ),
        (
            unix_listener("unix:/run/capataz.sock", "socket_mode = \"01777\""),
            Some(3),
            "listeners[0].socket_mode",
            "is not a file mode",
        ),
        (
            unix_listener("127.0.0.1:8080", "socket_mode = \"0660\""),
            Some(3),
            "listeners[0].socket_mode",
            "this listener binds a TCP address",
        ),
        (
            unix_listener(
                "unix:/run/capataz.sock",
                "[listeners.proxy_protocol]\ntrusted = [\"10.0.0.0/8\"]",
            ),
            Some(3),
            "listeners[0].proxy_protocol",
            "a Unix socket's clients have no IP",
        ),
        (
            unix_listener(
                "unix:/run/capataz.sock",
                "[listeners.tls]\ncertificates = [{ cert = \"/c.pem\", key = \"/k.pem\" }]",
            ),
            Some(3),
            "listeners[0].tls",
            "TLS is not served over a Unix socket listener",
        ),
        (
            format!(
                "{}\n[[listeners]]\naddress = \"unix:/run/capataz.sock\"\n",
                unix_listener("unix:/run/capataz.sock", "")
            ),
            Some(9),
            "listeners[1].address",
            "is already used by listener listener-0",
        ),
    ];
    for (text, line, key, says) in &cases {
        let error = check_err(text, *line, key);
        assert!(error.to_string().contains(says), "{error} lacks {says:?}");
    }
}
