//! A real etcd for the tests: Debian's `etcd-server` (3.4, installed by `.ci/deps/etcd.sh`), a
//! single-node cluster on 127.0.0.1 with ephemeral ports and its own data directory in a
//! temporary directory; the test's child process, killed by PID when dropped.
//!
//! It listens on two client ports: `client` (the one capataz is given) and `admin` (the one
//! the test writes through, with `etcdctl`). [`Etcd::hide`] restarts it on `admin` alone, so
//! the test can change keys (and compact the store) while capataz cannot reach etcd, then
//! [`Etcd::restart`] brings `client` back: what capataz must catch up on is then known.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::require_tool;
use super::DEADLINE;

/// A running etcd and its files.
pub struct Etcd {
    dir: PathBuf,
    /// Its member name, unique to this etcd: [`Etcd::run`] checks that the etcd answering on
    /// the admin port is this one.
    name: String,
    client: u16,
    admin: u16,
    peer: u16,
    /// The three ports, held (see [`free_ports`]).
    _held: [super::ReservedPort; 3],
    child: Option<Child>,
    settings: EtcdSettings,
}

/// How etcd runs beyond the defaults (see `etcd_secure.rs` for the TLS and authentication
/// set-ups made with them).
#[derive(Clone, Debug, Default)]
pub struct EtcdSettings {
    /// The client port (the one capataz is given) serves TLS with this certificate and key,
    /// and asks for a client certificate signed by this CA (`--client-cert-auth`). The admin
    /// port stays plain HTTP.
    pub tls: Option<EtcdServerTls>,
    /// More flags for etcd (`--auth-token-ttl=2`, ...).
    pub flags: Vec<String>,
    /// `etcdctl --user` (`root:PASSWORD`), once authentication is on.
    pub user: Option<String>,
}

/// etcd's TLS files.
#[derive(Clone, Debug)]
pub struct EtcdServerTls {
    /// Its certificate.
    pub cert: String,
    /// Its key.
    pub key: String,
    /// The CA its clients' certificates must be signed by.
    pub client_ca: String,
}

/// Three distinct loopback ports for etcd's client, admin and peer listeners (etcd takes fixed
/// ports, not `:0`), held for the etcd's whole life (see [`super::ReservedPort`]; etcd binds
/// them with `SO_REUSEADDR` all the same): no other test's listener takes one before etcd binds
/// it, or while it is killed and started again on it.
fn free_ports() -> [super::ReservedPort; 3] {
    [
        super::reserve_port(),
        super::reserve_port(),
        super::reserve_port(),
    ]
}

/// How many times [`Etcd::start_with`] picks new ports when one was taken before etcd bound it.
const PORT_ATTEMPTS: usize = 8;

impl Etcd {
    /// A fresh single-node etcd.
    pub async fn start(tag: &str) -> Etcd {
        Etcd::start_with(tag, EtcdSettings::default()).await
    }

    /// A fresh single-node etcd run with `settings`.
    pub async fn start_with(tag: &str, settings: EtcdSettings) -> Etcd {
        let dir = std::env::temp_dir().join(format!(
            "capataz-etcd-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("create the etcd directory");
        let held = free_ports();
        let name = format!("{tag}-{}", fastrand::u64(..));
        let mut etcd = Etcd {
            dir,
            name,
            client: held[0].port,
            admin: held[1].port,
            peer: held[2].port,
            _held: held,
            child: None,
            settings,
        };
        // Released ports were taken before etcd bound them in about one start in ten while the
        // fleet tests ran beside each other; held, none should be. Should one be all the same
        // (a program binding it explicitly), etcd starts on three new ones: nothing has used
        // the ports yet, and the data directory is fresh.
        for _ in 1..PORT_ATTEMPTS {
            match etcd.run(true).await {
                Ok(()) => return etcd,
                Err(log) if log.contains("address already in use") => {
                    let _ = std::fs::remove_dir_all(etcd.dir.join("data"));
                    let held = free_ports();
                    [etcd.client, etcd.admin, etcd.peer] =
                        [held[0].port, held[1].port, held[2].port];
                    etcd._held = held;
                }
                Err(log) => panic!("etcd exited at start: {log}"),
            }
        }
        if let Err(log) = etcd.run(true).await {
            panic!("etcd exited at start on {PORT_ATTEMPTS} sets of ports: {log}");
        }
        etcd
    }

    /// The endpoint capataz is given, `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client)
    }

    /// The settings etcd runs with (a change counts from the next start or `etcdctl` call).
    pub fn settings_mut(&mut self) -> &mut EtcdSettings {
        &mut self.settings
    }

    fn admin_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin)
    }

    /// Starts etcd on the ports chosen and waits until it answers; `Err` with its log when it
    /// exited instead.
    async fn run(&mut self, with_client: bool) -> Result<(), String> {
        let mut listen = self.admin_endpoint();
        if with_client {
            listen = format!("{},{listen}", self.endpoint());
        }
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let log = std::fs::File::create(self.dir.join("etcd.log")).expect("the etcd log");
        let mut command = Command::new(require_tool("etcd", "etcd"));
        if let Some(tls) = &self.settings.tls {
            command
                .arg(format!("--cert-file={}", tls.cert))
                .arg(format!("--key-file={}", tls.key))
                .arg(format!("--trusted-ca-file={}", tls.client_ca))
                .arg("--client-cert-auth");
        }
        command.args(&self.settings.flags);
        let child = command
            .arg(format!("--name={}", self.name))
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={listen}"))
            .arg(format!("--advertise-client-urls={}", self.admin_endpoint()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}={peer}", self.name))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd runs");
        self.child = Some(child);
        let end = Instant::now() + DEADLINE;
        loop {
            // Healthy, and this etcd: an etcd that took the admin port first (one of another
            // test, given the same free port) would answer too, and this one would have exited.
            let healthy = self.ctl(&["endpoint", "health"]).await.is_some()
                && self
                    .ctl(&["member", "list"])
                    .await
                    .is_some_and(|members| members.contains(&format!(", {}, ", self.name)));
            let exited = self.child.as_mut().map(Child::try_wait);
            if healthy && matches!(exited, Some(Ok(None))) {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = exited {
                self.child = None;
                return Err(format!(
                    "({status}): {}",
                    std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
                ));
            }
            assert!(
                Instant::now() < end,
                "etcd did not start within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `etcdctl` on the admin port: its standard output, or `None` when it failed.
    pub async fn ctl(&self, args: &[&str]) -> Option<String> {
        let mut command = tokio::process::Command::new(require_tool("etcdctl", "etcd"));
        if let Some(user) = &self.settings.user {
            command.arg(format!("--user={user}"));
        }
        let output = command
            .arg(format!("--endpoints={}", self.admin_endpoint()))
            .arg("--dial-timeout=2s")
            .arg("--command-timeout=5s")
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .expect("etcdctl runs (install it with .ci/deps/etcd.sh)");
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `etcdctl` on the admin port, which must succeed: its standard output.
    pub async fn must(&self, args: &[&str]) -> String {
        match self.ctl(args).await {
            Some(out) => out,
            None => panic!("etcdctl {args:?} failed"),
        }
    }

    /// Writes `value` at `key`.
    pub async fn put(&self, key: &str, value: &str) {
        self.must(&["put", key, value]).await;
    }

    /// Grants a lease of `ttl_seconds`: its ID, for [`Etcd::put_with_lease`].
    pub async fn grant_lease(&self, ttl_seconds: u32) -> String {
        let out = self
            .must(&["lease", "grant", &ttl_seconds.to_string()])
            .await;
        // "lease 694d7a1b2c3d4e5f granted with TTL(2s)"
        out.split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("a lease ID in {out:?}"))
            .to_owned()
    }

    /// Writes `value` at `key`, attached to `lease`: the key goes when the lease expires.
    pub async fn put_with_lease(&self, key: &str, value: &str, lease: &str) {
        self.must(&["put", &format!("--lease={lease}"), key, value])
            .await;
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) {
        self.must(&["del", key]).await;
    }

    /// Deletes every key starting with `prefix`, in one revision.
    pub async fn delete_prefix(&self, prefix: &str) {
        self.must(&["del", "--prefix", prefix]).await;
    }

    /// The store's revision now.
    pub async fn revision(&self) -> i64 {
        let out = self
            .must(&["get", "/", "--prefix", "--limit=1", "-w", "json"])
            .await;
        let json: serde_json::Value = serde_json::from_str(&out).expect("etcdctl JSON");
        json["header"]["revision"].as_i64().expect("a revision")
    }

    /// Compacts the store up to its revision now: older revisions are gone.
    pub async fn compact(&self) -> i64 {
        let revision = self.revision().await;
        self.must(&["compact", &revision.to_string(), "--physical"])
            .await;
        revision
    }

    /// Kills etcd (SIGKILL, by PID): capataz's connections are cut.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped etcd is killed all the same (SIGKILL needs no SIGCONT).
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops etcd (SIGSTOP) or lets it go on (SIGCONT): stopped, it keeps its connections
    /// and answers nothing.
    pub fn pause(&self, stop: bool) {
        let pid = self.child.as_ref().expect("etcd runs").id();
        let status = Command::new("kill")
            .arg(if stop { "-STOP" } else { "-CONT" })
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -STOP/-CONT {pid} failed");
    }

    /// Kills etcd and starts it again, from its data, on the admin port only: capataz
    /// cannot reach it, the test can.
    pub async fn hide(&mut self) {
        self.kill();
        self.run_again(false).await;
    }

    /// Kills etcd and starts it again, from its data, on both ports.
    pub async fn restart(&mut self) {
        self.kill();
        self.run_again(true).await;
    }

    /// Starts etcd again on its ports (capataz knows the client one): while one of them is
    /// taken by another socket, again after a moment, for at most the deadline.
    async fn run_again(&mut self, with_client: bool) {
        let end = Instant::now() + DEADLINE;
        loop {
            match self.run(with_client).await {
                Ok(()) => return,
                Err(log) if log.contains("address already in use") && Instant::now() < end => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(log) => panic!("etcd exited at its restart: {log}"),
            }
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            // A failed test: what etcd said (slow applies, refused requests) may be why.
            let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("etcd's log (last {} lines):", tail.len());
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
