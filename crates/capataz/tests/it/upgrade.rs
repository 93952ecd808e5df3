//! Zero-downtime binary upgrades and systemd's notifications, end to end: `capataz run` as a
//! child process (a process of its own is what an upgrade replaces, and what systemd hears
//! from), its new process started by SIGUSR2 learnt from the log and killed by the guard at the
//! end. Backends are [`SimBackend`]s on a runtime each test owns; the clients are blocking
//! threads. Loopback and ephemeral ports only; every wait has a deadline.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capataz::sim::{Mode, SimBackend};

use crate::support::process::{gone, load, pid_in, signal, Capataz, NotifySocket, TempFile};
use crate::support::wait::block_until;
use crate::support::{any, runtime};

/// A listener `front` and an admin listener, both on ephemeral ports, over pool `web` of
/// `backends`, probed every 50 ms; `fall = 100` keeps a backend whose probes start failing UP
/// in a running process for seconds.
fn config_text(backends: &[SimBackend]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ name = \"{}\", address = \"{}\" }}", b.name(), b.addr()))
        .collect();
    format!(
        r#"
[admin]
address = "127.0.0.1:0"

[[listeners]]
name = "front"
address = "127.0.0.1:0"

[pools.web]
backends = [{}]

[pools.web.active]
interval = "50ms"
timeout = "1s"
rise = 2
fall = 100
"#,
        list.join(", ")
    )
}

/// `GET /` over a fresh connection: the status and the `X-Backend` header.
fn get(addr: SocketAddr) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: upgrade.test\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let backend = text
        .split("\r\n")
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("x-backend")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    Ok((status, backend))
}

fn hits(backends: &[SimBackend]) -> u64 {
    backends.iter().map(SimBackend::traffic_hits).sum()
}

/// One upgrade of the process `pid` (`capataz`'s child or a later generation, whose log lines
/// all reach `capataz`'s standard error): sends SIGUSR2, waits for the new process to accept
/// and the old one to exit, checks what systemd was told, and returns the new process's pid,
/// the time to its first accept and the time to the old one's exit, both from the signal.
fn upgrade(capataz: &mut Capataz, pid: u32, notify: &NotifySocket) -> (u32, Duration, Duration) {
    let mark = capataz.line_count();
    let signalled = Instant::now();
    signal(pid, "USR2");
    let (_, started) = capataz.wait_line_after(mark, "the new process", |l| {
        l.contains("upgrade: the new process started")
    });
    let new_pid = pid_in(&started);
    capataz.adopt(new_pid);
    capataz.wait_line_after(mark, "the takeover", |l| {
        l.contains("took over from the old process")
    });
    let accepted = signalled.elapsed();
    if pid == capataz.pid() {
        let status = capataz.wait_exit();
        assert!(status.success(), "the old process exited with {status}");
    } else {
        block_until("the old process to exit", || gone(pid));
    }
    let exited = signalled.elapsed();
    assert!(
        !gone(new_pid),
        "the new process is gone:\n{}",
        capataz.stderr()
    );
    // systemd is told who the main process is now, by both, and that the new one is ready.
    let mut told = vec![notify.next(), notify.next()];
    told.sort();
    assert_eq!(
        told,
        vec![
            format!("MAINPID={new_pid}"),
            format!("MAINPID={new_pid}\nREADY=1")
        ]
    );
    (new_pid, accepted, exited)
}

#[test]
fn upgrades_under_load_drop_no_request_and_each_new_process_waits_for_its_own_probes() {
    let rt = runtime();
    let backends = rt.block_on(async {
        vec![
            SimBackend::start("a", any()).await.expect("start a"),
            SimBackend::start("b", any()).await.expect("start b"),
        ]
    });
    let config = TempFile::new("upgrade.toml", &config_text(&backends));
    let notify = NotifySocket::at_path();
    let mut capataz = Capataz::spawn(
        &["run", "--config", config.text()],
        &[("NOTIFY_SOCKET", notify.name.as_str())],
    );
    let addr = capataz.listening_on("front");
    let admin = capataz.admin_on();
    assert_eq!(notify.next(), "READY=1");

    // b's probes fail from now on; with fall = 100 the first process keeps it UP, so b still
    // gets its share there. No later process may send it anything: none saw b pass.
    backends[1].set_health(Mode::Status(503));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(addr, 4, 2, stop.clone());
    block_until("300 requests before the upgrade", || hits(&backends) >= 300);
    assert!(
        backends[1].traffic_hits() > 0,
        "b served before the upgrade"
    );

    // Twice (or CAPATAZ_UPGRADE_ROUNDS times, up to 50, for BENCHMARKS.md): the first
    // process's child upgrades in turn (its handover variables were consumed, its inherited
    // sockets are its own).
    let count = std::env::var("CAPATAZ_UPGRADE_ROUNDS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(2)
        .clamp(1, 50);
    let mut pid = capataz.pid();
    let mut rounds = Vec::new();
    for _ in 0..count {
        let (new_pid, accepted, exited) = upgrade(&mut capataz, pid, &notify);
        pid = new_pid;
        // Only the new process serves now; b, never seen passing by it, gets nothing.
        let b_after = backends[1].traffic_hits();
        let total_after = hits(&backends);
        block_until("300 requests after the upgrade", || {
            hits(&backends) >= total_after + 300
        });
        assert_eq!(
            backends[1].traffic_hits(),
            b_after,
            "the new process sent requests to b, which it has not seen pass"
        );
        rounds.push((accepted, exited));
    }
    stop.store(true, Ordering::Relaxed);
    let report = clients.join().expect("the load");
    assert_eq!(report.errors, 0, "client errors: {:?}", report.samples);
    assert!(report.ok >= 300 * (count as u64 + 1), "{report:?}");
    let (code, backend) = get(addr).expect("the newest process answers");
    assert_eq!((code, backend.as_str()), (200, "a"));
    let admin_answer = get(admin).expect("the admin API answers from the newest process");
    assert_ne!(admin_answer.0, 0);
    eprintln!(
        "upgrades under load: {} requests, {} errors, {} connections; per upgrade, from \
         SIGUSR2, (the new process accepts, the old one has exited): {rounds:?}",
        report.ok, report.errors, report.connections
    );

    signal(pid, "TERM");
    assert_eq!(notify.next(), "STOPPING=1");
    block_until("the last process to exit", || gone(pid));
}

#[test]
fn an_upgrade_to_an_invalid_config_leaves_the_old_process_serving_and_a_later_one_works() {
    let rt = runtime();
    let backends = rt.block_on(async { vec![SimBackend::start("a", any()).await.expect("a")] });
    let text = config_text(&backends);
    let config = TempFile::new("upgrade-bad.toml", &text);
    let mut old = Capataz::spawn(&["run", "--config", config.text()], &[]);
    let addr = old.listening_on("front");
    block_until("an answer", || get(addr).is_ok_and(|(code, _)| code == 200));

    config.write(&format!("{text}\nbogus =\n"));
    let mark = old.line_count();
    old.signal("USR2");
    let (_, failed) = old.wait_line_after(mark, "the failed upgrade", |l| {
        l.contains("upgrade failed, this process keeps serving")
    });
    assert!(
        failed.contains("exited before it was ready (exit status: 2)"),
        "{failed}"
    );
    assert!(
        old.stderr().contains("capataz: invalid configuration"),
        "the new process's own error is shown:\n{}",
        old.stderr()
    );
    assert!(old.exited().is_none(), "the old process stopped");
    for _ in 0..5 {
        assert_eq!(get(addr).expect("the old process answers").0, 200);
    }

    // Fixed, the next upgrade goes through.
    config.write(&text);
    let mark = old.line_count();
    old.signal("USR2");
    let (_, started) = old.wait_line_after(mark, "the new process", |l| {
        l.contains("upgrade: the new process started")
    });
    let new_pid = pid_in(&started);
    old.adopt(new_pid);
    assert!(old.wait_exit().success());
    assert_eq!(get(addr).expect("the new process answers").0, 200);
    signal(new_pid, "TERM");
    block_until("the new process to exit", || gone(new_pid));
}

#[test]
fn run_tells_systemd_ready_reloading_and_stopping() {
    let rt = runtime();
    let backends = rt.block_on(async { vec![SimBackend::start("a", any()).await.expect("a")] });
    let config = TempFile::new("notify.toml", &config_text(&backends));
    let notify = NotifySocket::at_path();
    let mut capataz = Capataz::spawn(
        &["run", "--config", config.text()],
        &[("NOTIFY_SOCKET", notify.name.as_str())],
    );
    let addr = capataz.listening_on("front");
    assert_eq!(notify.next(), "READY=1");
    // Ready means accepting: the first request is answered.
    assert_eq!(get(addr).expect("an answer").0, 200);

    capataz.signal("HUP");
    assert_eq!(notify.next(), "RELOADING=1");
    assert_eq!(notify.next(), "READY=1");

    capataz.signal("TERM");
    assert_eq!(notify.next(), "STOPPING=1");
    assert!(capataz.wait_exit().success());
}

#[test]
fn run_notifies_an_abstract_socket_named_with_an_at_sign() {
    let rt = runtime();
    let backends = rt.block_on(async { vec![SimBackend::start("a", any()).await.expect("a")] });
    let config = TempFile::new("notify-abstract.toml", &config_text(&backends));
    let notify = NotifySocket::abstract_name();
    let mut capataz = Capataz::spawn(
        &["run", "--config", config.text()],
        &[("NOTIFY_SOCKET", notify.name.as_str())],
    );
    assert_eq!(notify.next(), "READY=1");
    capataz.signal("TERM");
    assert_eq!(notify.next(), "STOPPING=1");
    assert!(capataz.wait_exit().success());
}
