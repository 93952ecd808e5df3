//! `capataz demo`: the whole mission on one machine, with no files.
//!
//! Four in-process backends on loopback, each showing one thing health checking must get right,
//! and a real balancer in front of them built from an embedded config:
//!
//! - `steady` always answers 200.
//! - `flaky` fails its `/healthz` now and then, never three times in a row: hysteresis keeps it.
//! - `crashy` crashes and comes back on a cycle: active checks take it out after `fall` failed
//!   probes and readmit it after `rise` passes.
//! - `liar` says 200 on `/healthz` while real requests get 500s: only passive checks catch it
//!   (seed 001), and it keeps coming back on probation and being ejected again, for longer.
//!
//! A light traffic generator gives the passive side something to see, and prints a summary of
//! where requests went every ten seconds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::config::{self, ConfigError};
use crate::oneshot;
use crate::server::{Balancer, StartError};
use crate::sim::{Mode, SimBackend};

/// How the demo runs.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// The balancer's listener (default 127.0.0.1:8080).
    pub listen: SocketAddr,
    /// The admin API and dashboard (default 127.0.0.1:9901).
    pub admin: SocketAddr,
    /// Requests per second the built-in client sends (0 for none; default 5).
    pub rate: u32,
    /// Stop after this long (run until Ctrl-C when `None`).
    pub duration: Option<Duration>,
    /// A second listener terminating TLS with a self-signed certificate generated at start
    /// (`--tls`, default 127.0.0.1:8443), if wanted.
    pub tls: Option<SocketAddr>,
    /// The worker threads that serve the balancer's connections.
    pub workers: crate::workers::Workers,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A demo backend could not start.
    #[error("cannot start demo backend {name}: {source}")]
    Backend {
        /// The backend.
        name: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The self-signed certificate could not be generated or written.
    #[error("cannot write the demo's self-signed certificate to {dir}: {why}")]
    Certificate {
        /// Where it was to be written.
        dir: String,
        /// What failed.
        why: String,
    },
    /// The embedded config did not validate (a bug).
    #[error("embedded demo config: {0}")]
    Config(#[from] ConfigError),
    /// The balancer could not start (e.g. port 8080 or 9901 in use: try `--listen 127.0.0.1:8081`
    /// or `--admin 127.0.0.1:9902`).
    #[error(transparent)]
    Start(#[from] StartError),
}

/// The embedded config; `{listen}` and `{steady}` ... `{liar}` are filled in at start.
const DEMO_CONFIG: &str = r#"
[log]
format = "text"
level = "info"

[admin]
address = "{admin}"

[[listeners]]
name = "demo"
address = "{listen}"

[pools.demo]
algorithm = "round_robin"
when_all_down = "fail_open"
backends = [
    { name = "steady", address = "{steady}" },
    { name = "flaky", address = "{flaky}" },
    { name = "crashy", address = "{crashy}" },
    { name = "liar", address = "{liar}" },
]

[pools.demo.active]
kind = "http"
path = "/healthz"
interval = "1s"
timeout = "500ms"
rise = 2
fall = 3
jitter = "10%"

[pools.demo.passive]
consecutive_errors = 3
ejection_time = "10s"
max_ejection_time = "60s"
max_ejected_percent = 50

[pools.demo.retries]
attempts = 1

[pools.demo.timeouts]
connect = "500ms"
response_header = "5s"
"#;

/// The demo's config text for the given addresses.
pub fn demo_config_text(
    listen: SocketAddr,
    admin: SocketAddr,
    backends: &[(&str, SocketAddr)],
) -> String {
    let mut text = DEMO_CONFIG
        .replace("{listen}", &listen.to_string())
        .replace("{admin}", &admin.to_string());
    for (name, addr) in backends {
        text = text.replace(&format!("{{{name}}}"), &addr.to_string());
    }
    text
}

/// Runs the demo until Ctrl-C (or `options.duration`).
pub async fn run(options: DemoOptions) -> Result<(), DemoError> {
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut backends = Vec::new();
    for name in ["steady", "flaky", "crashy", "liar"] {
        let backend = SimBackend::start(name, any)
            .await
            .map_err(|source| DemoError::Backend { name, source })?;
        backends.push((name, backend));
    }
    let [(_, _steady), (_, flaky), _, (_, liar)] = &backends[..] else {
        unreachable!("four backends were started above");
    };
    // flaky: isolated failures and pairs, never three in a row.
    flaky.set_health_pattern(vec![
        Mode::Status(200),
        Mode::Status(503),
        Mode::Status(200),
        Mode::Status(200),
        Mode::Status(503),
        Mode::Status(503),
        Mode::Status(200),
        Mode::Status(200),
        Mode::Status(200),
        Mode::Status(200),
    ]);
    liar.set_health(Mode::Status(200));
    liar.set_traffic(Mode::Status(500));
    let addrs: Vec<(&str, SocketAddr)> = backends.iter().map(|(n, b)| (*n, b.addr())).collect();
    let mut text = demo_config_text(options.listen, options.admin, &addrs);
    let certificate_dir = match options.tls {
        Some(address) => {
            let dir = std::env::temp_dir().join(format!("capataz-demo-{}", std::process::id()));
            text.push_str(&write_demo_certificate(&dir, address)?);
            Some(dir)
        }
        None => None,
    };
    let config = config::parse_str(&text, "<demo>")?;
    let (events, _) = broadcast::channel(1024);
    let balancer = Balancer::start_taking_over(&config, events, None, (None, options.workers))
        .await
        .map_err(|error| match error {
            // The demo's addresses come from its flags, not from a file.
            StartError::Bind {
                name,
                key,
                address,
                error,
            } => StartError::Bind {
                key: match key.as_str() {
                    "admin.address" => "--admin".into(),
                    "listeners[0].address" => "--listen".into(),
                    _ => "--tls".into(),
                },
                name,
                address,
                error,
            },
            other => other,
        })?;
    let listen = balancer.local_addrs()[0];
    let this_binary = ThisBinary::find();
    let admin = balancer
        .admin_addr()
        .map_or_else(|| "-".to_string(), |a| a.to_string());
    println!(
        "capataz demo: balancer on http://{listen}/ in front of four backends:\n\
         \x20 steady  always fine\n\
         \x20 flaky   /healthz fails now and then, never 3 in a row: hysteresis keeps it in\n\
         \x20 crashy  crashes for 8 s every 20 s: active checks take it out and bring it back\n\
         \x20 liar    /healthz says 200, real requests get 500: only passive checks catch it\n\
         probes every 1 s (rise 2, fall 3); 3 traffic errors in a row eject for 10 s x n.\n\
         Every state change is logged below. Try: curl http://{listen}/   (Ctrl-C to stop)\n\
         Dashboard: http://{admin}/   status: {capataz} status --admin {admin}\n{where_it_is}",
        capataz = this_binary.command,
        where_it_is = this_binary.note,
    );
    if let (Some(tls), Some(dir)) = (balancer.local_addrs().get(1), &certificate_dir) {
        println!(
            "TLS: https://{tls}/ with a self-signed certificate for localhost and 127.0.0.1, \
             written to {}.\n  Try: curl -k https://{tls}/   or   curl --cacert {} \
             --resolve localhost:{}:127.0.0.1 https://localhost:{}/\n",
            dir.display(),
            dir.join("cert.pem").display(),
            tls.port(),
            tls.port()
        );
    }
    let crash_cycle = tokio::spawn(crash_cycle(Arc::new(backends.remove(2).1)));
    let (stop_traffic, stop) = tokio::sync::oneshot::channel();
    let traffic = (options.rate > 0).then(|| tokio::spawn(traffic(listen, options.rate, stop)));
    let why = match options.duration {
        Some(duration) => {
            tokio::select! {
                _ = tokio::time::sleep(duration) => format!("its {} s are over", duration.as_secs()),
                _ = tokio::signal::ctrl_c() => "Ctrl-C".to_owned(),
            }
        }
        None => {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C".to_owned()
        }
    };
    tracing::info!("demo: stopping ({why}): the traffic, the balancer and the backends");
    crash_cycle.abort();
    let _ = stop_traffic.send(());
    if let Some(traffic) = traffic {
        let _ = traffic.await;
    }
    balancer.shutdown(Duration::from_secs(2)).await;
    drop(backends);
    if let Some(dir) = certificate_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    tracing::info!("demo: stopped");
    Ok(())
}

/// Generates a self-signed certificate for `localhost` and 127.0.0.1 into `dir` (created
/// private to the user) and returns the config text of a TLS listener on `address` using it.
/// How to run this binary's other commands from the shell the demo was started in: `capataz`
/// when that is this binary on PATH, otherwise its path (`target/debug/capataz` after `cargo
/// run`), with a line saying how to put it on PATH.
struct ThisBinary {
    command: String,
    note: String,
}

impl ThisBinary {
    fn find() -> ThisBinary {
        let Ok(exe) = std::env::current_exe() else {
            return ThisBinary {
                command: "capataz".to_owned(),
                note: String::new(),
            };
        };
        let same = |path: &std::path::Path| {
            std::fs::canonicalize(path)
                .is_ok_and(|p| std::fs::canonicalize(&exe).is_ok_and(|e| e == p))
        };
        let found = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("capataz"))
                .find(|path| path.is_file())
        });
        if found.as_deref().is_some_and(same) {
            return ThisBinary {
                command: "capataz".to_owned(),
                note: String::new(),
            };
        }
        let shown = std::env::current_dir()
            .ok()
            .and_then(|cwd| exe.strip_prefix(cwd).ok().map(std::path::Path::to_path_buf))
            .unwrap_or_else(|| exe.clone());
        let command = shown.display().to_string();
        let why = match found {
            Some(other) => format!("the capataz on PATH is {}", other.display()),
            None => "capataz is not on PATH".to_owned(),
        };
        ThisBinary {
            note: format!(
                "{why}: this binary is {command}; `cargo install --locked --path crates/capataz` installs it in ~/.cargo/bin\n"
            ),
            command,
        }
    }
}

fn write_demo_certificate(dir: &std::path::Path, address: SocketAddr) -> Result<String, DemoError> {
    let fail = |why: String| DemoError::Certificate {
        dir: dir.display().to_string(),
        why,
    };
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| (d.as_secs() / 86_400) as i64);
    let (cert, key) = crate::tls::self_signed(&["localhost", "127.0.0.1"], today)
        .map_err(|e| fail(e.to_string()))?;
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| fail(e.to_string()))?;
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, cert).map_err(|e| fail(e.to_string()))?;
    std::fs::write(&key_path, key).map_err(|e| fail(e.to_string()))?;
    let quoted = |path: std::path::PathBuf| toml::Value::String(path.display().to_string());
    Ok(format!(
        "\n[[listeners]]\nname = \"demo-tls\"\naddress = \"{address}\"\n\
         [listeners.tls]\ncertificates = [{{ cert = {}, key = {} }}]\n",
        quoted(cert_path),
        quoted(key_path)
    ))
}

/// How long crashy runs before each crash, and how long it stays down.
const CRASHY_UP: Duration = Duration::from_secs(12);
const CRASHY_DOWN: Duration = Duration::from_secs(8);

/// Crashes `crashy` for [`CRASHY_DOWN`] after every [`CRASHY_UP`] of running, forever.
async fn crash_cycle(crashy: Arc<SimBackend>) {
    loop {
        tokio::time::sleep(CRASHY_UP).await;
        tracing::info!("demo: crashy crashes (listener closed, connections reset)");
        crashy.crash();
        tokio::time::sleep(CRASHY_DOWN).await;
        tracing::info!("demo: crashy restarts");
        if let Err(error) = crashy.restart().await {
            tracing::warn!(%error, "demo: crashy could not restart; trying again next cycle");
        }
    }
}

/// Where the demo's requests went over a period, for its summary line.
#[derive(Debug, Default)]
struct Tally {
    /// Requests sent.
    sent: u64,
    /// Answers below 500, by the backend that wrote them (`capataz` when none did).
    answered: BTreeMap<String, u64>,
    /// Errors by who answered (a backend, or capataz itself for its own 5xx pages) and what.
    errors: BTreeMap<(String, String), u64>,
    /// Requests that got no answer at all.
    unanswered: u64,
}

impl Tally {
    fn count(&mut self, answer: Option<(u16, Option<String>)>) {
        self.sent += 1;
        match answer {
            Some((status, backend)) if status < 500 => {
                let who = backend.unwrap_or_else(|| format!("capataz (HTTP {status})"));
                *self.answered.entry(who).or_default() += 1;
            }
            Some((status, backend)) => {
                let key = match backend {
                    Some(backend) => (backend, format!("HTTP {status}")),
                    None => ("capataz".into(), format!("HTTP {status} of its own")),
                };
                *self.errors.entry(key).or_default() += 1;
            }
            None => self.unanswered += 1,
        }
    }

    /// `12 requests; answered by steady 5, flaky 4; errors seen: liar 2 x HTTP 500, capataz 1 x
    /// HTTP 502 of its own`: who answered, and each error with its count and what it was.
    fn summary(&self) -> String {
        if self.sent == 0 {
            return "no requests".into();
        }
        let mut text = match self.sent {
            1 => "1 request".to_owned(),
            n => format!("{n} requests"),
        };
        if !self.answered.is_empty() {
            let answered: Vec<String> = self
                .answered
                .iter()
                .map(|(who, n)| format!("{who} {n}"))
                .collect();
            text.push_str(&format!("; answered by {}", answered.join(", ")));
        }
        let mut errors: Vec<String> = self
            .errors
            .iter()
            .map(|((who, what), n)| format!("{who} {n} x {what}"))
            .collect();
        if self.unanswered > 0 {
            errors.push(format!(
                "{} x no answer (connection failed)",
                self.unanswered
            ));
        }
        match errors.is_empty() {
            true => text.push_str("; no errors"),
            false => text.push_str(&format!("; errors seen: {}", errors.join(", "))),
        }
        text
    }
}

/// Logs the traffic summary of the time since `since`, when the demo stops.
fn log_last(since: tokio::time::Instant, tally: &Tally) {
    tracing::info!(
        "demo traffic, last {} s: {}",
        since.elapsed().as_secs(),
        tally.summary()
    );
}

/// Sends `rate` GET requests per second over one keep-alive connection (reconnecting when it
/// breaks) and logs every ten seconds where they went, and once more, for the time since the
/// last summary, when `stop` fires.
async fn traffic(listen: SocketAddr, rate: u32, stop: tokio::sync::oneshot::Receiver<()>) {
    let period = Duration::from_secs(1) / rate.max(1);
    let mut tick = tokio::time::interval(period);
    let mut report = tokio::time::interval(Duration::from_secs(10));
    report.tick().await;
    let mut since = tokio::time::Instant::now();
    let mut connection: Option<oneshot::Connection<Empty<Bytes>>> = None;
    let mut tally = Tally::default();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => {
                log_last(since, &tally);
                return;
            }
            _ = report.tick() => {
                tracing::info!("demo traffic, last 10 s: {}", tally.summary());
                tally = Tally::default();
                since = tokio::time::Instant::now();
            }
            _ = tick.tick() => {
                let answer = tokio::select! {
                    answer = one_request(listen, &mut connection) => answer,
                    _ = &mut stop => {
                        log_last(since, &tally);
                        return;
                    }
                };
                tally.count(answer);
            }
        }
    }
}

/// How long one demo request may take, connecting and body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer body the demo reads (the simulated backends answer a few bytes).
const MAX_ANSWER: usize = 1 << 20;

/// One GET over `connection` (connected first if there is none or it closed); the answer's
/// status and `x-backend`, or `None` when it failed (the connection is then dropped).
async fn one_request(
    listen: SocketAddr,
    connection: &mut Option<oneshot::Connection<Empty<Bytes>>>,
) -> Option<(u16, Option<String>)> {
    let by = Instant::now() + REQUEST_TIMEOUT;
    if connection.as_ref().is_none_or(|c| c.is_closed()) {
        *connection = Some(oneshot::connect(listen, None, by).await.ok()?);
    }
    let c = connection.as_mut()?;
    let request = http::Request::get("/")
        .header(http::header::HOST, listen.to_string())
        .body(Empty::new())
        .ok()?;
    let Ok(response) = c.send(request, by).await else {
        *connection = None;
        return None;
    };
    let status = response.status().as_u16();
    let backend = response
        .headers()
        .get("x-backend")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if oneshot::read_body(response.into_body(), MAX_ANSWER, by)
        .await
        .is_err()
    {
        *connection = None;
    }
    Some((status, backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the summary read "HTTP 500 from liar 3, crashy 16, ...", as if every count
    /// were a 500.
    #[test]
    fn the_traffic_summary_names_each_error_with_its_count() {
        let mut tally = Tally::default();
        for _ in 0..3 {
            tally.count(Some((200, Some("steady".into()))));
        }
        tally.count(Some((200, Some("crashy".into()))));
        tally.count(Some((500, Some("liar".into()))));
        tally.count(Some((500, Some("liar".into()))));
        tally.count(Some((502, None)));
        tally.count(None);
        assert_eq!(
            tally.summary(),
            "8 requests; answered by crashy 1, steady 3; errors seen: capataz 1 x HTTP 502 of its \
             own, liar 2 x HTTP 500, 1 x no answer (connection failed)"
        );
        assert_eq!(Tally::default().summary(), "no requests");
        let mut fine = Tally::default();
        fine.count(Some((200, Some("steady".into()))));
        assert_eq!(fine.summary(), "1 request; answered by steady 1; no errors");
    }

    /// Sleeps until `at` after `start` and says whether crashy is running then.
    async fn running_at(crashy: &SimBackend, start: tokio::time::Instant, at: u64) -> bool {
        tokio::time::sleep_until(start + Duration::from_millis(at)).await;
        crashy.is_running()
    }

    #[tokio::test(start_paused = true)]
    async fn crashy_is_down_for_8_s_of_every_20() {
        let crashy = Arc::new(
            SimBackend::start("crashy", SocketAddr::from(([127, 0, 0, 1], 0)))
                .await
                .unwrap(),
        );
        let start = tokio::time::Instant::now();
        let cycle = tokio::spawn(crash_cycle(crashy.clone()));
        for (at, running) in [
            (11_900, true),
            (12_100, false),
            (19_900, false),
            (20_100, true),
            (31_900, true),
            (32_100, false),
            (40_100, true),
        ] {
            assert_eq!(running_at(&crashy, start, at).await, running, "at {at} ms");
        }
        cycle.abort();
        let _ = cycle.await;
        assert_eq!(Arc::strong_count(&crashy), 1, "the cycle let go of crashy");
    }
}
