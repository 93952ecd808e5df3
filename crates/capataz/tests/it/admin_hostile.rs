//! The admin API, reloads and the command line against a hostile or confused operator: a reload
//! must not strip the admin listener of its token, an override must not be lost to a reload
//! racing it, every name the config allows must be reachable, errors must say what the docs say,
//! and a stuck reload must not keep the process from stopping.
//!
//! Loopback only, ephemeral ports, raw HTTP/1.1 where the headers matter.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::support::balancer::{parse, start};
use crate::support::raw::{header, send_head, status_of};
use crate::support::DEADLINE;
use capataz::server::Balancer;

fn pool_of(backends: &[(&str, SocketAddr)], extra: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|(name, addr)| format!("{{ name = \"{name}\", address = \"{addr}\" }}"))
        .collect();
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [{}]\n\
         active.kind = \"none\"\n{extra}\n",
        list.join(", ")
    )
}

/// An address nothing listens on: the pools here never send traffic.
fn nowhere() -> SocketAddr {
    "127.0.0.1:9".parse().expect("an address")
}

fn admin_addr(balancer: &Balancer) -> SocketAddr {
    let bound = balancer.admin_addr().expect("an admin listener");
    SocketAddr::from(([127, 0, 0, 1], bound.port()))
}

/// Regression: the admin listener keeps the address it was bound to across a reload, but read
/// its token from the new config; a reload that moved `[admin]` to loopback without a token, or
/// removed the table, left a listener on `0.0.0.0` open to unauthenticated writes from the
/// network.
#[tokio::test]
async fn a_reload_that_moves_or_removes_admin_keeps_the_running_listeners_token() {
    let pool = pool_of(&[("b1", nowhere())], "");
    let guarded = format!("[admin]\naddress = \"0.0.0.0:0\"\ntoken = \"s3cret\"\n{pool}");
    let (balancer, _events) = start(&guarded).await;
    let admin = admin_addr(&balancer);
    let write = format!("POST /backends/web/b1/down HTTP/1.1\r\nhost: {admin}");
    assert_eq!(send_head(admin, &write).await.0, 401);
    for (what, text) in [
        (
            "moved to loopback without a token",
            format!("[admin]\naddress = \"127.0.0.1:0\"\n{pool}"),
        ),
        ("removed", pool.clone()),
    ] {
        balancer.reload(&parse(&text)).await.expect("reload");
        let (status, answer) = send_head(admin, &write).await;
        assert_eq!(status, 401, "[admin] {what}: {answer}");
        let authorized = format!("{write}\r\nauthorization: Bearer s3cret");
        assert_eq!(send_head(admin, &authorized).await.0, 200, "[admin] {what}");
    }
    // A new table for the same address does apply: here, a new token.
    let rotated = format!("[admin]\naddress = \"0.0.0.0:0\"\ntoken = \"n3w\"\n{pool}");
    balancer.reload(&parse(&rotated)).await.expect("reload");
    let old = format!("{write}\r\nauthorization: Bearer s3cret");
    assert_eq!(send_head(admin, &old).await.0, 401);
    let new = format!("{write}\r\nauthorization: Bearer n3w");
    assert_eq!(send_head(admin, &new).await.0, 200);
}

/// Regression: a reload copies each backend's override into the new pools and then swaps them
/// in; an override set in between landed on the old pool and was lost, though the API had
/// answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_while_a_reload_swaps_the_pools_is_not_lost() {
    let backends: Vec<(String, SocketAddr)> = (0..200)
        .map(|i| (format!("b{i}"), SocketAddr::from(([127, 0, 0, 1], 9))))
        .collect();
    let pairs: Vec<(&str, SocketAddr)> = backends.iter().map(|(n, a)| (n.as_str(), *a)).collect();
    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n{}",
        pool_of(&pairs, "")
    );
    let (balancer, _events) = start(&text).await;
    let balancer = Arc::new(balancer);
    let config = parse(&text);
    let admin = admin_addr(&balancer);
    let mut lost = 0;
    for round in 0..100 {
        let kind = if round % 2 == 0 { "down" } else { "clear" };
        let reloading = {
            let balancer = balancer.clone();
            let config = config.clone();
            tokio::spawn(async move { balancer.reload(&config).await.map(|_| ()) })
        };
        let head = format!("POST /backends/web/b199/{kind} HTTP/1.1\r\nhost: {admin}");
        let overriding = tokio::spawn(async move { send_head(admin, &head).await });
        reloading.await.expect("reload task").expect("reload");
        let (status, answer) = overriding.await.expect("override task");
        assert_eq!(status, 200, "{answer}");
        let body = answer.split_once("\r\n\r\n").expect("a body").1;
        let answered: serde_json::Value = serde_json::from_str(body).expect("JSON");
        let answered = answered["state"].as_str().expect("a state").to_owned();
        let pool = balancer.pool("web").expect("pool web");
        let index = pool.index_of("b199").expect("b199");
        let state = capataz::status::backend_json(&pool, &pool.view_of(index))["state"]
            .as_str()
            .expect("a state")
            .to_owned();
        if state != answered {
            lost += 1;
        }
    }
    assert_eq!(lost, 0, "overrides lost to a racing reload, of 100");
}

/// Regression: a right method on a wrong path answered 405 "use POST" (or "use GET" to a GET);
/// the docs promise 404 for an unknown path, and 405 (with `Allow`, RFC 9110) for a wrong
/// method only.
#[tokio::test]
async fn a_wrong_path_is_404_and_a_wrong_method_is_405_with_allow() {
    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n{}",
        pool_of(&[("b1", nowhere())], "")
    );
    let (balancer, _events) = start(&text).await;
    let admin = admin_addr(&balancer);
    for (head, want) in [
        ("POST /backends/web HTTP/1.1", 404),
        ("POST /backends/web/b1/down/extra HTTP/1.1", 404),
        ("POST /reload/now HTTP/1.1", 404),
        ("GET /status/web HTTP/1.1", 404),
        ("GET /status/web/b1/extra HTTP/1.1", 404),
        ("GET /backends/web/b1/down HTTP/1.1", 405),
        ("POST /status HTTP/1.1", 405),
        ("DELETE /reload HTTP/1.1", 405),
        ("HEAD /status HTTP/1.1", 200),
    ] {
        let (status, answer) = send_head(admin, &format!("{head}\r\nhost: {admin}")).await;
        assert_eq!(status, want, "{head}: {answer}");
        if want == 405 {
            let (head, _) = answer.split_once("\r\n\r\n").expect("a head");
            assert!(header(head, "allow").is_some(), "{head}");
        }
    }
}

/// Regression: path segments were not percent-decoded, so a backend whose name has a space,
/// a `/` or non-ASCII text (all valid in the config) could not be reached by a client that
/// encodes its URLs (curl, a browser), and `capataz ctl` refused such names outright.
#[tokio::test]
async fn backend_names_with_spaces_slashes_and_unicode_are_reachable_percent_encoded() {
    let names = ["web 2", "a/b", "w\u{e9}b"];
    let pairs: Vec<(&str, SocketAddr)> = names.iter().map(|n| (*n, nowhere())).collect();
    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n{}",
        pool_of(&pairs, "")
    );
    let (balancer, _events) = start(&text).await;
    let admin = admin_addr(&balancer);
    for (name, encoded) in names.iter().zip(["web%202", "a%2Fb", "w%C3%A9b"]) {
        let head = format!("POST /backends/web/{encoded}/drain HTTP/1.1\r\nhost: {admin}");
        let (status, answer) = send_head(admin, &head).await;
        assert_eq!(status, 200, "{name}: {answer}");
        let head = format!("GET /status/web/{encoded} HTTP/1.1\r\nhost: {admin}");
        let (status, answer) = send_head(admin, &head).await;
        assert_eq!(status, 200, "{name}: {answer}");
        assert!(answer.contains("DRAINING"), "{name}: {answer}");
    }
    let head = format!("GET /status/web/%zz HTTP/1.1\r\nhost: {admin}");
    assert_eq!(send_head(admin, &head).await.0, 400);
    // The command line encodes what it is given.
    let admin_arg = admin.to_string();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_capataz"))
            .args(["ctl", "down", "web", "web 2", "--ttl", "10m", "--admin"])
            .arg(&admin_arg)
            .output()
            .expect("run capataz ctl")
    })
    .await
    .expect("ctl task");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("FORCED_DOWN"), "{stdout}");
}

/// Regression: `?ttl=0s` was accepted, and the override lapsed at once; the docs say a TTL is
/// a duration as in the config, and every config duration is above zero.
#[tokio::test]
async fn a_zero_ttl_is_refused_with_400() {
    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n{}",
        pool_of(&[("b1", nowhere())], "")
    );
    let (balancer, _events) = start(&text).await;
    let admin = admin_addr(&balancer);
    for ttl in ["0s", "0ms", "0.0h"] {
        let head = format!("POST /backends/web/b1/down?ttl={ttl} HTTP/1.1\r\nhost: {admin}");
        let (status, answer) = send_head(admin, &head).await;
        assert_eq!(status, 400, "{ttl}: {answer}");
        assert!(answer.contains("is zero"), "{answer}");
    }
}

/// Regression: the SIGHUP handler awaited the reload inside the signal loop, so while a reload
/// was stuck (here, the config path replaced by a FIFO nobody writes) SIGTERM went unheard, and
/// once heard, dropping the runtime waited for the stuck read: the process never exited.
#[cfg(unix)]
#[test]
fn sigterm_stops_the_process_while_a_sighup_reload_is_stuck() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let dir = std::env::temp_dir().join(format!("capataz-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config.toml");
    std::fs::write(&path, pool_of(&[("b1", nowhere())], "")).expect("write config");
    let child = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .args(["run", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start capataz run");
    let mut child = Kill(child);
    let pid = child.0.id().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.0.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_for = |what: &str| loop {
        let line = rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("no line with {what:?}"));
        if line.contains(what) {
            return;
        }
    };
    wait_for("listening");
    std::fs::remove_file(&path).expect("remove config");
    let made = Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let signal = |name: &str| {
        let sent = Command::new("kill")
            .args([name, &pid])
            .status()
            .expect("run kill");
        assert!(sent.success());
    };
    signal("-HUP");
    wait_for("SIGHUP: reloading");
    signal("-TERM");
    let mut status = None;
    crate::support::wait::block_until("exit on SIGTERM during a stuck reload", || {
        status = child.0.try_wait().expect("try_wait");
        status.is_some()
    });
    let status = status.expect("it exited");
    assert!(status.success(), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: the admin listener accepted any number of connections, each held until hyper's
/// 30 s head timeout: clients that connect and idle could use up the file descriptors the proxy
/// needs. Past `MAX_CONNECTIONS` a new one is closed at once, and a slot that frees is reused.
#[tokio::test]
async fn admin_connections_past_the_limit_are_closed_at_once() {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpStream;

    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n{}",
        pool_of(&[("b1", nowhere())], "")
    );
    let (balancer, _events) = start(&text).await;
    let admin = admin_addr(&balancer);
    let mut idle = Vec::new();
    // The limit docs/operating.md states.
    for _ in 0..256 {
        idle.push(TcpStream::connect(admin).await.expect("connect"));
    }
    // Each of these was accepted (the status check goes through once all are in).
    let mut extra = TcpStream::connect(admin).await.expect("connect");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(DEADLINE, extra.read(&mut byte))
        .await
        .expect("the connection past the limit is closed at once");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    idle.pop();
    let every = std::time::Duration::from_millis(10);
    crate::support::wait::until_ok("a freed slot reused", every, async || {
        let request = format!("GET /status HTTP/1.1\r\nhost: {admin}\r\nconnection: close\r\n\r\n");
        let mut stream = TcpStream::connect(admin).await.expect("connect");
        let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
        match status_of(&answer) {
            Some(200) => Ok(()),
            status => Err(format!("answered {status:?}")),
        }
    })
    .await;
}

/// Regression: only `Bearer` was recognised, while the scheme is case-insensitive (RFC 9110
/// section 11.1): `Authorization: bearer <token>` got 401.
#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n{}",
        pool_of(&[("b1", nowhere())], "")
    );
    let (balancer, _events) = start(&text).await;
    let admin = admin_addr(&balancer);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let head =
            format!("GET /status HTTP/1.1\r\nhost: {admin}\r\nauthorization: {scheme} s3cret");
        assert_eq!(send_head(admin, &head).await.0, 200, "{scheme}");
    }
    let head = format!("GET /status HTTP/1.1\r\nhost: {admin}\r\nauthorization: Basic s3cret");
    assert_eq!(send_head(admin, &head).await.0, 401);
}

/// Regression: a reload stored the new `[log]` table although logging is set up once at
/// start, so the config in force claimed a level the process was not logging at.
#[tokio::test]
async fn a_reload_keeps_the_log_settings_the_process_runs_with() {
    let pool = pool_of(&[("b1", nowhere())], "");
    let (balancer, _events) = start(&pool).await;
    let louder = format!("[log]\nlevel = \"debug\"\n{pool}");
    balancer.reload(&parse(&louder)).await.expect("reload");
    assert_eq!(balancer.supervisor().config().log.level, "info");
}

/// Regression: unknown query parameters were ignored, so a typo (`?tll=10m`, `?TTL=10m`) set an
/// override until cleared instead of for ten minutes, and `clear?ttl=30s` answered with a
/// `ttl_ms` although nothing lapses. Each is now a 400, and nothing changes.
#[tokio::test]
async fn a_mistyped_ttl_or_a_ttl_on_clear_is_refused_and_changes_nothing() {
    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n{}",
        pool_of(&[("b1", nowhere())], "")
    );
    let (balancer, _events) = start(&text).await;
    let admin = admin_addr(&balancer);
    for target in [
        "down?tll=10m",
        "down?TTL=10m",
        "drain?ttl=10m&ttl=1h",
        "up?ttl=10m&force=1",
        "clear?ttl=30s",
    ] {
        let head = format!("POST /backends/web/b1/{target} HTTP/1.1\r\nhost: {admin}");
        let (status, answer) = send_head(admin, &head).await;
        assert_eq!(status, 400, "{target}: {answer}");
        let head = format!("GET /status/web/b1 HTTP/1.1\r\nhost: {admin}");
        let (_, status) = send_head(admin, &head).await;
        assert!(status.contains("\"override\": null"), "{target}: {status}");
    }
    let head = format!("POST /backends/web/b1/down?ttl=1.5%6D HTTP/1.1\r\nhost: {admin}");
    let (status, answer) = send_head(admin, &head).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"ttl_ms\": 90000"), "{answer}");
}

/// Regression: a reload during shutdown (a SIGHUP or `POST /reload` in the drain window) found
/// no running listeners, since shutdown had taken them, and bound every listener of the config
/// again: the balancer accepted new connections while draining.
#[tokio::test]
async fn a_reload_during_shutdown_is_refused_and_binds_nothing() {
    let pool = pool_of(&[("b1", nowhere())], "");
    let (balancer, _events) = start(&pool).await;
    let supervisor = balancer.supervisor().clone();
    let stopped = supervisor.shutdown_signal();
    let stopping = tokio::spawn(balancer.shutdown(DEADLINE));
    crate::support::wait::wait_until("shutdown to begin", || *stopped.borrow()).await;
    let refused = supervisor.reload(&parse(&pool)).await;
    assert!(refused.is_err(), "a reload during shutdown was applied");
    stopping.await.expect("shutdown");
}

/// Regression: `capataz check`, `status` and `ctl` printed with `println!`, which panics when
/// the reader of standard output has gone away (`capataz status | head -1`): a backtrace and
/// exit status 101 instead of a quiet stop.
#[test]
fn a_closed_standard_output_is_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("capataz-hostile-pipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config.toml");
    // rise = 1 adds a warning line, so there is more than one write.
    let text =
        pool_of(&[("b1", nowhere())], "").replace("active.kind = \"none\"", "active.rise = 1");
    std::fs::write(&path, text).expect("write config");
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capataz"))
        .arg("check")
        .arg(&path)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run capataz check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        output.status.code(),
        Some(0),
        "valid with a warning: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: `POST /reload` waited for its reload however long it took, so a reload stuck
/// reading its file (here, the config path replaced by a FIFO nobody writes yet) held the
/// admin connection (one of 256) for as long, and `capataz ctl reload` gave up at 30 s with
/// no answer. It answers `202 Accepted` after 20 s, and the reload still applies when its file
/// arrives.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_reload_stuck_reading_its_file_is_answered_202_and_still_applies() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = std::env::temp_dir().join(format!("capataz-stuck-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config.toml");
    let admin = "[admin]\naddress = \"127.0.0.1:0\"\n";
    std::fs::write(
        &path,
        format!("{admin}{}", pool_of(&[("b1", nowhere())], "")),
    )
    .expect("write");
    let config = capataz::config::load(&path).expect("valid config");
    let (events, _rx) = tokio::sync::broadcast::channel(1024);
    let balancer = Balancer::start_with_path(&config, events, Some(path.clone()))
        .await
        .expect("balancer starts");
    let address = admin_addr(&balancer);
    std::fs::remove_file(&path).expect("remove config");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");

    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!(
        "POST /reload HTTP/1.1\r\nhost: {address}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("an answer while the reload is still stuck")
    .expect("read");
    // The file arrives (before any assertion: a read left blocked would hold the runtime's
    // shutdown): the reload applies whole.
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(0o4000) // O_NONBLOCK: the reload is reading
        .open(&path)
        .expect("the FIFO's write end");
    let two = format!(
        "{admin}{}",
        pool_of(&[("b1", nowhere()), ("b2", nowhere())], "")
    );
    writer.write_all(two.as_bytes()).expect("write the FIFO");
    drop(writer);
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(status_of(&answer), Some(202), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["pending"], true, "{text}");
    assert_eq!(body["reloaded"], false, "{text}");
    crate::support::wait::wait_until("the stuck reload applied", || {
        balancer.supervisor().config().pools[0].backends.len() == 2
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}
