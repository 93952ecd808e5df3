//! A real authoritative DNS server for the tests: Knot DNS (`knotd`, Debian's `knot`, installed
//! by `.ci/deps/knot.sh`) on 127.0.0.1 and an ephemeral port, serving one zone `test.` from a
//! zone file in a temporary directory. The test's child process, killed by PID when dropped.
//! Records change by rewriting the zone file (with a higher serial) and `knotc zone-reload`;
//! the zone stops being served (REFUSED) by rewriting the config without it and `knotc reload`.

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::require_tool;
use super::DEADLINE;

/// A running `knotd` and its files.
pub struct Knot {
    dir: PathBuf,
    port: u16,
    /// The TCP port, held for knotd's whole life (see [`super::ReservedPort`]): a restart
    /// finds it free, not taken by another test's listener meanwhile.
    _tcp: super::ReservedPort,
    serial: u32,
    child: Option<Child>,
    /// A TSIG key (name, base64 secret) allowed to update the zone (RFC 2136), if any.
    update_key: Option<(String, String)>,
}

impl Knot {
    /// `knotd` serving zone `test.` with `records` (zone-file lines after the SOA and NS).
    pub fn start(tag: &str, records: &str) -> Knot {
        Knot::start_with(tag, records, None)
    }

    /// As [`Knot::start`], accepting dynamic updates (RFC 2136) of zone `test.` signed with
    /// the hmac-sha256 TSIG key `key` (name, base64 secret).
    pub fn start_updatable(tag: &str, records: &str, key: (&str, &str)) -> Knot {
        Knot::start_with(tag, records, Some((key.0.to_owned(), key.1.to_owned())))
    }

    fn start_with(tag: &str, records: &str, update_key: Option<(String, String)>) -> Knot {
        let dir = std::env::temp_dir().join(format!(
            "capataz-knot-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(dir.join("db")).expect("create the knot directory");
        // A free port for both UDP and TCP, handed to knotd. Chosen by TCP (on a busy machine
        // many TCP ports are taken by connections a UDP bind does not see, and knotd cannot
        // listen on those) and held for knotd's life (knotd binds it with SO_REUSEADDR all the
        // same), then checked free for UDP too. A restart on a port released meanwhile failed
        // ("cannot bind address ... TCP (address already in use)", five times).
        let tcp = (0..100)
            .find_map(|_| {
                let tcp = super::reserve_port();
                UdpSocket::bind(("127.0.0.1", tcp.port)).ok().map(|_| tcp)
            })
            .expect("a port free for UDP and TCP");
        let mut knot = Knot {
            dir,
            port: tcp.port,
            _tcp: tcp,
            serial: 0,
            child: None,
            update_key,
        };
        knot.write_config(true);
        knot.write_zone(records);
        knot.run();
        knot
    }

    /// The server's address, for `resolver = "..."`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("knot.conf")
    }

    fn write_config(&self, with_zone: bool) {
        let dir = self.dir.display();
        let mut text = format!(
            "server:\n    rundir: \"{dir}\"\n    listen: 127.0.0.1@{port}\n\
             control:\n    listen: \"{dir}/knot.sock\"\n\
             database:\n    storage: \"{dir}/db\"\n\
             log:\n  - target: stderr\n    any: warning\n\
             template:\n  - id: default\n    storage: \"{dir}\"\n    file: \"%s.zone\"\n    \
             zonefile-sync: -1\n    journal-content: none\n",
            port = self.port
        );
        if let Some((name, secret)) = &self.update_key {
            text.push_str(&format!(
                "key:\n  - id: {name}\n    algorithm: hmac-sha256\n    secret: {secret}\n\
                 acl:\n  - id: update\n    key: {name}\n    action: update\n"
            ));
        }
        if with_zone {
            text.push_str("zone:\n  - domain: test.\n");
            if self.update_key.is_some() {
                text.push_str("    acl: update\n");
            }
        }
        std::fs::write(self.conf(), text).expect("write knot.conf");
    }

    fn write_zone(&mut self, records: &str) {
        self.serial += 1;
        let text = format!(
            "$ORIGIN test.\n$TTL 1\n@ 1 IN SOA ns.test. admin.test. {} 60 60 600 1\n\
             @ 1 IN NS ns.test.\nns 1 IN A 127.0.0.1\n{records}\n",
            self.serial
        );
        std::fs::write(self.dir.join("test.zone"), text).expect("write the zone file");
    }

    fn run(&mut self) {
        // A knotd killed a moment ago leaves its PID file and control socket behind, and a
        // restart on a loaded machine may find them (or its port) not yet free: a knotd that
        // exits at once is started again, a few times, before the test gives up.
        let end = Instant::now() + DEADLINE;
        for attempt in 1.. {
            let _ = std::fs::remove_file(self.dir.join("knot.pid"));
            let _ = std::fs::remove_file(self.dir.join("knot.sock"));
            let mut child = Command::new(require_tool("knotd", "knot"))
                .arg("-c")
                .arg(self.conf())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("knotd runs");
            // Ready once the control socket answers.
            loop {
                if self.knotc(&["status"]) {
                    self.child = Some(child);
                    return;
                }
                if let Ok(Some(status)) = child.try_wait() {
                    assert!(
                        attempt < 5 && Instant::now() < end,
                        "knotd exited at start ({status}), {attempt} times"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                    break;
                }
                if Instant::now() >= end {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("knotd did not start within {DEADLINE:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn knotc(&self, args: &[&str]) -> bool {
        Command::new(require_tool("knotc", "knot"))
            .arg("-c")
            .arg(self.conf())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The zone's records at `owner` (relative to `test.`) of type `kind`, as `knotc zone-read`
    /// prints them (one a line; empty when there is none: knotc fails with "no such node").
    pub fn zone_read(&self, owner: &str, kind: &str) -> String {
        let output = Command::new(require_tool("knotc", "knot"))
            .arg("-c")
            .arg(self.conf())
            .args(["zone-read", "test.", owner, kind])
            .stderr(Stdio::null())
            .output()
            .expect("knotc runs");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() || !text.contains("no such node") {
            text
        } else {
            String::new()
        }
    }

    /// Replaces the zone's records and has knotd load them.
    pub fn set_records(&mut self, records: &str) {
        self.write_zone(records);
        assert!(
            self.knotc(&["zone-reload", "test."]),
            "knotc zone-reload failed"
        );
    }

    /// Stops serving the zone (queries are REFUSED), or serves it again.
    pub fn serve_zone(&self, serve: bool) {
        self.write_config(serve);
        assert!(self.knotc(&["reload"]), "knotc reload failed");
    }

    /// Kills knotd (the server becomes unreachable: queries time out).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts knotd again on the same port and files.
    pub fn restart(&mut self) {
        self.kill();
        self.run();
    }
}

impl Drop for Knot {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
