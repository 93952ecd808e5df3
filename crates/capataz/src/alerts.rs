//! Alert hooks: health events handed to webhooks and commands, without ever holding up the
//! balancer.
//!
//! An alert receiver is someone else's server or script. It can be slow, down, or hang, and a
//! backend that flaps can produce events faster than any pager wants them. None of that may
//! reach the request path or the probes, so alerts run on their own tasks. The only link is the
//! broadcast channel the health runtime already publishes to, and its `send` never waits.
//!
//! One dispatcher task reads the events, debounces them when `[alerts] debounce` is set (see
//! [`Debouncer`]), and offers each resulting [`Alert`] to every hook's bounded queue. Each hook
//! has one worker task that delivers its queue in order: a webhook POSTs the alert's JSON and
//! retries with exponential backoff; a command runs with the alert in `CAPATAZ_*` variables.
//!
//! Invariants:
//! - The dispatcher never awaits a hook: it offers alerts with `try_send`, and a full queue
//!   drops the alert and counts it. A slow hook delays only its own queue.
//! - The counters in [`AlertStats`] count per hook. An alert offered to two webhooks counts twice.
//!   Each alert offered to a hook ends in exactly one of `delivered`, `failed` or `dropped`. The
//!   exception is an alert still in flight when [`Alerts`] is dropped, which is counted nowhere.
//!   Events the broadcast channel skipped because the dispatcher lagged count as `dropped`.
//!   Events folded away by debouncing count as `suppressed`.
//! - With debouncing, a pool and backend get at most one alert per window, and the first event
//!   of a quiet period is never delayed.
//! - Dropping [`Alerts`] aborts every task it started. Commands still running are killed.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, HOST, USER_AGENT};
use http::StatusCode;
use http_body_util::Full;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use crate::config::{AlertsConfig, CommandConfig, WebhookConfig};
use crate::events::Event;

/// The `User-Agent` of webhook requests.
const AGENT: &str = concat!("capataz/", env!("CARGO_PKG_VERSION"));

/// The longest wait between two webhook attempts, unless `backoff` itself is longer.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// One alert: an event and how many earlier events debouncing folded into it.
#[derive(Clone, Debug)]
pub struct Alert {
    /// The event. For a debounce summary, this is the latest event of the window.
    pub event: Event,
    /// Events of the same pool and backend that were not sent on their own and are summed up
    /// by this alert. Zero for an ordinary alert.
    pub suppressed: u64,
}

impl Alert {
    /// An ordinary alert for `event`.
    pub fn new(event: Event) -> Alert {
        Alert {
            event,
            suppressed: 0,
        }
    }

    /// The event's JSON (see [`Event::to_json`]) plus `"suppressed": N` when N > 0.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = self.event.to_json();
        if self.suppressed > 0 {
            if let Some(object) = value.as_object_mut() {
                object.insert("suppressed".into(), self.suppressed.into());
            }
        }
        value
    }
}

/// Counters of one kind of hook, summed over the hooks of that kind. Safe to read at any time.
#[derive(Debug, Default)]
pub struct HookStats {
    /// Alerts a hook accepted: a 2xx answer, or a command that exited 0.
    pub delivered: AtomicU64,
    /// Alerts a hook did not accept. A webhook fails after its retries; a command fails once.
    pub failed: AtomicU64,
    /// Alerts and events lost before delivery, because a queue was full or the dispatcher lagged.
    pub dropped: AtomicU64,
    /// Events debouncing folded away instead of alerting on their own.
    pub suppressed: AtomicU64,
}

impl HookStats {
    /// Alerts delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Alerts given up on so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Alerts and events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events folded by debouncing so far.
    pub fn suppressed(&self) -> u64 {
        self.suppressed.load(Ordering::Relaxed)
    }
}

/// Alert counters per kind of hook, for metrics.
#[derive(Debug, Default)]
pub struct AlertStats {
    /// Webhooks.
    pub webhook: HookStats,
    /// Commands.
    pub command: HookStats,
}

impl AlertStats {
    /// Each kind with its metrics label, `webhook` or `command`.
    pub fn hooks(&self) -> [(&'static str, &HookStats); 2] {
        [("webhook", &self.webhook), ("command", &self.command)]
    }

    fn of(&self, kind: Kind) -> &HookStats {
        match kind {
            Kind::Webhook => &self.webhook,
            Kind::Command => &self.command,
        }
    }
}

/// The running alert hooks. Dropping this value stops them.
#[derive(Debug)]
pub struct Alerts {
    stats: Arc<AlertStats>,
    tasks: Vec<JoinHandle<()>>,
}

impl Alerts {
    /// Starts one worker per hook in `config` and a dispatcher that reads `events`.
    ///
    /// This must be called inside a tokio runtime. With no hooks configured, it starts nothing
    /// and drops `events`. When the sending side closes, pending debounce summaries still go
    /// out when their windows end. Then the queues drain and the tasks end.
    pub fn start(config: &AlertsConfig, events: broadcast::Receiver<Event>) -> Alerts {
        let stats = Arc::new(AlertStats::default());
        let mut tasks = Vec::new();
        let mut outlets = Vec::new();
        for hook in &config.webhooks {
            let (queue, rx) = mpsc::channel(hook.queue.max(1));
            outlets.push(Outlet {
                kind: Kind::Webhook,
                queue,
            });
            tasks.push(tokio::spawn(run_webhook(hook.clone(), rx, stats.clone())));
        }
        for hook in &config.commands {
            let (queue, rx) = mpsc::channel(hook.queue.max(1));
            outlets.push(Outlet {
                kind: Kind::Command,
                queue,
            });
            tasks.push(tokio::spawn(run_command(hook.clone(), rx, stats.clone())));
        }
        if !outlets.is_empty() {
            let debouncer = config.debounce.map(Debouncer::new);
            let dispatcher = Dispatcher {
                outlets,
                debouncer,
                stats: stats.clone(),
            };
            tasks.push(tokio::spawn(dispatcher.run(events)));
        }
        Alerts { stats, tasks }
    }

    /// The counters, shared with the running tasks.
    pub fn stats(&self) -> Arc<AlertStats> {
        self.stats.clone()
    }
}

impl Drop for Alerts {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Debouncing per pool and backend, as a pure state machine: time is an argument.
///
/// Each pool and backend key has its own window. Pool-level events use the backend `""`. When a
/// key has no open window, an event alerts at once and opens a window of `window`. Events that
/// arrive while it is open are folded in, and only the latest one is kept. When the window
/// ends, [`Debouncer::flush_due`] checks whether the latest state differs from the last one
/// alerted. If it does, one summary alert goes out carrying the latest event and the number of
/// events folded, and it opens a new window. If it does not, the key goes quiet. So a backend
/// that flaps gets at most one alert per window, and the summary always ends on its current
/// state.
///
/// A state is a backend's `to` state (`UP`, `DOWN`, `DRAINING`, ...), or the event type for
/// pool-level events (`all_down`, `recovered`).
#[derive(Debug)]
pub struct Debouncer {
    window: Duration,
    keys: BTreeMap<(String, String), Window>,
}

/// An open window of one key.
#[derive(Debug)]
struct Window {
    ends: Instant,
    alerted: &'static str,
    latest: Option<Event>,
    folded: u64,
}

impl Debouncer {
    /// A debouncer with windows of `window`.
    pub fn new(window: Duration) -> Debouncer {
        Debouncer {
            window,
            keys: BTreeMap::new(),
        }
    }

    /// Takes `event` at `now`. Returns it as an alert to send at once, or `None` when it is
    /// folded into its key's open window.
    ///
    /// A window that has ended but not been flushed yet still counts as open. Call
    /// [`Debouncer::flush_due`] first, so `event` can open a fresh window.
    pub fn offer(&mut self, event: Event, now: Instant) -> Option<Alert> {
        let key = (
            event.pool().to_owned(),
            event.backend().unwrap_or_default().to_owned(),
        );
        if let Some(window) = self.keys.get_mut(&key) {
            window.latest = Some(event);
            window.folded += 1;
            return None;
        }
        self.keys.insert(
            key,
            Window {
                ends: now + self.window,
                alerted: state(&event),
                latest: None,
                folded: 0,
            },
        );
        Some(Alert::new(event))
    }

    /// Closes every window that ended at or before `now`. Returns the summaries to send, ordered
    /// by pool and backend.
    pub fn flush_due(&mut self, now: Instant) -> Vec<Alert> {
        let mut due = Vec::new();
        let window_length = self.window;
        self.keys.retain(|_, window| {
            if window.ends > now {
                return true;
            }
            match window.latest.take() {
                Some(event) if state(&event) != window.alerted => {
                    window.alerted = state(&event);
                    window.ends = now + window_length;
                    due.push(Alert {
                        event,
                        suppressed: window.folded,
                    });
                    window.folded = 0;
                    true
                }
                _ => false,
            }
        });
        due
    }

    /// When the earliest open window ends, and `flush_due` should next be called. Returns
    /// `None` when no window is open.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.keys.values().map(|window| window.ends).min()
    }
}

/// The state an event leaves its key in, for deciding whether a summary is worth sending.
fn state(event: &Event) -> &'static str {
    match event {
        Event::Transition { transition, .. } => transition.to.as_str(),
        Event::Override { to, .. } => to,
        Event::AllDown { .. } | Event::Recovered { .. } => event.kind(),
    }
}

/// The kinds of hook, for counting.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Webhook,
    Command,
}

/// A hook as the dispatcher sees it: a queue to offer alerts to.
struct Outlet {
    kind: Kind,
    queue: mpsc::Sender<Arc<Alert>>,
}

/// The task between the broadcast channel and the hooks' queues.
struct Dispatcher {
    outlets: Vec<Outlet>,
    debouncer: Option<Debouncer>,
    stats: Arc<AlertStats>,
}

impl Dispatcher {
    async fn run(mut self, mut events: broadcast::Receiver<Event>) {
        let mut open = true;
        loop {
            let deadline = self.debouncer.as_ref().and_then(Debouncer::next_deadline);
            if !open && deadline.is_none() {
                return;
            }
            let received = tokio::select! {
                received = events.recv(), if open => Some(received),
                () = sleep_until(deadline) => None,
            };
            // The clock is read here only.
            let now = tokio::time::Instant::now().into_std();
            if let Some(debouncer) = self.debouncer.as_mut() {
                for alert in debouncer.flush_due(now) {
                    self.offer(alert);
                }
            }
            match received {
                Some(Ok(event)) => match self.debouncer.as_mut() {
                    None => self.offer(Alert::new(event)),
                    Some(debouncer) => match debouncer.offer(event, now) {
                        Some(alert) => self.offer(alert),
                        None => self.count(|stats| &stats.suppressed, 1),
                    },
                },
                Some(Err(RecvError::Lagged(missed))) => {
                    tracing::debug!(missed, "alert dispatcher lagged; events dropped");
                    self.count(|stats| &stats.dropped, missed);
                }
                Some(Err(RecvError::Closed)) => open = false,
                None => {}
            }
        }
    }

    /// Offers `alert` to every hook, without waiting.
    fn offer(&self, alert: Alert) {
        let alert = Arc::new(alert);
        for outlet in &self.outlets {
            // `Closed` means the worker is gone, so the alert is dropped like a full queue.
            if outlet.queue.try_send(alert.clone()).is_err() {
                tracing::debug!(kind = ?outlet.kind, "alert queue full; alert dropped");
                self.stats
                    .of(outlet.kind)
                    .dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Adds `n` to one counter of every hook.
    fn count(&self, counter: impl Fn(&HookStats) -> &AtomicU64, n: u64) {
        for outlet in &self.outlets {
            counter(self.stats.of(outlet.kind)).fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Waits until `deadline`, or forever when there is none.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// Why one delivery did not count as delivered.
#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    #[error("connecting to {addr} failed: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("the HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("the request could not be built: {0}")]
    Request(#[from] http::Error),
    #[error("the receiver answered {0}")]
    Status(StatusCode),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the command has no program to run")]
    NoProgram,
    #[error("the command could not be started: {0}")]
    Spawn(io::Error),
    #[error("waiting for the command failed: {0}")]
    Wait(io::Error),
    #[error("the command {0}")]
    Exit(ExitStatus),
    #[error("the command was killed after running for {0:?}")]
    Killed(Duration),
}

async fn run_webhook(
    hook: WebhookConfig,
    mut queue: mpsc::Receiver<Arc<Alert>>,
    stats: Arc<AlertStats>,
) {
    while let Some(alert) = queue.recv().await {
        let body = Bytes::from(alert.to_json().to_string());
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            let attempt = tokio::time::timeout(hook.timeout, post(&hook, body.clone())).await;
            let error = match attempt {
                Ok(Ok(())) => break Ok(()),
                Ok(Err(error)) => error,
                Err(_) => DeliveryError::Timeout(hook.timeout),
            };
            if attempts > hook.retries {
                break Err(error);
            }
            let delay = retry_delay(hook.backoff, attempts);
            tracing::debug!(webhook = %hook.url, attempts, %error, ?delay, "alert webhook retrying");
            tokio::time::sleep(delay).await;
        };
        match outcome {
            Ok(()) => {
                stats.webhook.delivered.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(webhook = %hook.url, attempts, "alert delivered");
            }
            Err(error) => {
                stats.webhook.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    webhook = %hook.url,
                    attempts,
                    %error,
                    event = %alert.event.sentence(),
                    "alert webhook failed; giving up on this alert"
                );
            }
        }
    }
}

/// The wait before retry `retry` (1 for the first): `backoff`, doubled for each retry after the
/// first, capped at [`MAX_BACKOFF`] (or `backoff` itself when that is longer).
fn retry_delay(backoff: Duration, retry: u32) -> Duration {
    let factor = 1u32 << retry.saturating_sub(1).min(20);
    backoff.saturating_mul(factor).min(MAX_BACKOFF.max(backoff))
}

/// One POST over a fresh connection. A 2xx answer is success.
async fn post(hook: &WebhookConfig, body: Bytes) -> Result<(), DeliveryError> {
    let stream = TcpStream::connect(hook.socket_addr)
        .await
        .map_err(|source| DeliveryError::Connect {
            addr: hook.socket_addr,
            source,
        })?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    // The connection runs beside the request. The guard stops it when this attempt ends,
    // including when its timeout drops this future.
    let _connection = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let request = http::Request::post(&hook.path)
        .header(HOST, &hook.host)
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, AGENT)
        .header(CONNECTION, "close")
        .body(Full::new(body))?;
    let response = sender.send_request(request).await?;
    match response.status() {
        status if status.is_success() => Ok(()),
        status => Err(DeliveryError::Status(status)),
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run_command(
    hook: CommandConfig,
    mut queue: mpsc::Receiver<Arc<Alert>>,
    stats: Arc<AlertStats>,
) {
    let program = hook.argv.first().map_or("", String::as_str);
    while let Some(alert) = queue.recv().await {
        match execute(&hook, &alert).await {
            Ok(()) => {
                stats.command.delivered.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(command = program, "alert command succeeded");
            }
            Err(error) => {
                stats.command.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    command = program,
                    %error,
                    event = %alert.event.sentence(),
                    "alert command failed"
                );
            }
        }
    }
}

/// Runs the command once for `alert`. Its stdin and stdout are null. Its stderr is the
/// balancer's, so its complaints land beside the logs. On timeout it is killed, but processes
/// it started itself are not.
async fn execute(hook: &CommandConfig, alert: &Alert) -> Result<(), DeliveryError> {
    let (program, args) = hook.argv.split_first().ok_or(DeliveryError::NoProgram)?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .envs(command_env(alert))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(DeliveryError::Spawn)?;
    match tokio::time::timeout(hook.timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(DeliveryError::Exit(status)),
        Ok(Err(error)) => Err(DeliveryError::Wait(error)),
        Err(_) => {
            // Kill and reap it now, rather than leaving that to `kill_on_drop`.
            let _ = child.kill().await;
            Err(DeliveryError::Killed(hook.timeout))
        }
    }
}

/// The `CAPATAZ_*` variables a command gets. A value the event does not have is empty.
fn command_env(alert: &Alert) -> Vec<(&'static str, String)> {
    let json = alert.to_json();
    let event = &alert.event;
    let (from, to, reason) = event
        .change()
        .map(|(from, to, reason)| (from.to_owned(), to.to_owned(), reason))
        .unwrap_or_default();
    let time = json["time"].as_str().unwrap_or_default().to_owned();
    vec![
        ("CAPATAZ_EVENT", event.kind().to_owned()),
        ("CAPATAZ_POOL", event.pool().to_owned()),
        (
            "CAPATAZ_BACKEND",
            event.backend().unwrap_or_default().to_owned(),
        ),
        ("CAPATAZ_FROM", from),
        ("CAPATAZ_TO", to),
        ("CAPATAZ_REASON", reason),
        ("CAPATAZ_TIME", time),
        ("CAPATAZ_SENTENCE", event.sentence()),
        ("CAPATAZ_SUPPRESSED", alert.suppressed.to_string()),
        ("CAPATAZ_JSON", json.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use capataz_health::{Outcome, Reason, State, Transition};

    use super::*;

    fn transition(backend: &str, to: State) -> Event {
        let from = match to {
            State::Up => State::Down,
            State::Down => State::Up,
        };
        Event::Transition {
            pool: "web".into(),
            backend: backend.into(),
            transition: Transition {
                backend: 0,
                from,
                to,
                reason: Reason::ProbesFailed {
                    streak: 3,
                    last: Outcome::Timeout,
                },
                at: Duration::ZERO,
                healthy_after: 1,
            },
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_500),
        }
    }

    /// Plays `script` through a debouncer with a 300 ms window and compares what it alerts
    /// with `expected`.
    ///
    /// Script lines are `<ms> <backend> UP|DOWN` (a transition), `<ms> pool down|up` (all down
    /// or recovered), or `<ms> flush`. Output lines are `<ms> <backend or pool> <state>`, with
    /// ` +N` for a summary that folded N events.
    fn check(script: &str, expected: &str) {
        let start = Instant::now();
        let mut debouncer = Debouncer::new(Duration::from_millis(300));
        let mut out = Vec::new();
        for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let ms: u64 = words[0].parse().unwrap();
            let now = start + Duration::from_millis(ms);
            let alerts = match words[1..] {
                ["flush"] => debouncer.flush_due(now),
                ["pool", what] => {
                    let event = match what {
                        "down" => Event::AllDown {
                            pool: "web".into(),
                            policy: capataz_health::AllDown::Reject,
                            time: SystemTime::UNIX_EPOCH,
                        },
                        _ => Event::Recovered {
                            pool: "web".into(),
                            time: SystemTime::UNIX_EPOCH,
                        },
                    };
                    debouncer.offer(event, now).into_iter().collect()
                }
                [backend, to] => {
                    let to = if to == "UP" { State::Up } else { State::Down };
                    debouncer
                        .offer(transition(backend, to), now)
                        .into_iter()
                        .collect()
                }
                _ => panic!("bad script line {line:?}"),
            };
            for alert in alerts {
                let who = alert.event.backend().unwrap_or("pool");
                let mut text = format!("{ms} {who} {}", state(&alert.event));
                if alert.suppressed > 0 {
                    text.push_str(&format!(" +{}", alert.suppressed));
                }
                out.push(text);
            }
        }
        let expected: Vec<&str> = expected
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(out, expected, "script:\n{script}");
    }

    #[test]
    fn a_lone_event_alerts_at_once_and_the_window_closes_quietly() {
        check(
            "0 b1 DOWN
             300 flush
             301 b1 UP",
            "0 b1 DOWN
             301 b1 UP",
        );
    }

    #[test]
    fn a_flapping_backend_gets_one_alert_and_one_summary_per_window() {
        check(
            "0 b1 DOWN
             10 b1 UP
             20 b1 DOWN
             30 b1 UP
             40 b1 DOWN
             50 b1 UP
             60 b1 DOWN
             70 b1 UP
             80 b1 DOWN
             90 b1 UP
             299 flush
             300 flush",
            "0 b1 DOWN
             300 b1 UP +9",
        );
    }

    #[test]
    fn no_summary_when_the_window_ends_where_it_started() {
        check(
            "0 b1 DOWN
             10 b1 UP
             20 b1 DOWN
             300 flush
             310 b1 UP",
            "0 b1 DOWN
             310 b1 UP",
        );
    }

    #[test]
    fn a_summary_opens_a_new_window() {
        check(
            "0 b1 DOWN
             10 b1 UP
             300 flush
             350 b1 DOWN
             400 flush
             600 flush
             601 b1 UP
             900 flush
             1200 flush
             1201 b1 DOWN",
            "0 b1 DOWN
             300 b1 UP +1
             600 b1 DOWN +1
             900 b1 UP +1
             1201 b1 DOWN",
        );
    }

    #[test]
    fn keys_are_independent_and_pool_events_have_their_own() {
        check(
            "0 b1 DOWN
             5 b2 DOWN
             6 pool down
             7 b1 UP
             8 pool up
             300 flush
             306 flush",
            "0 b1 DOWN
             5 b2 DOWN
             6 pool all_down
             300 b1 UP +1
             306 pool recovered +1",
        );
    }

    #[test]
    fn an_ended_window_stays_open_until_flushed() {
        check(
            "0 b1 DOWN
             400 b1 UP
             400 flush",
            "0 b1 DOWN
             400 b1 UP +1",
        );
    }

    #[test]
    fn next_deadline_is_the_earliest_open_window() {
        let start = Instant::now();
        let ms = |n| start + Duration::from_millis(n);
        let mut debouncer = Debouncer::new(Duration::from_millis(300));
        assert_eq!(debouncer.next_deadline(), None);
        debouncer.offer(transition("b1", State::Down), ms(0));
        debouncer.offer(transition("b2", State::Down), ms(100));
        assert_eq!(debouncer.next_deadline(), Some(ms(300)));
        assert!(debouncer.flush_due(ms(300)).is_empty());
        assert_eq!(debouncer.next_deadline(), Some(ms(400)));
        assert!(debouncer.flush_due(ms(400)).is_empty());
        assert_eq!(debouncer.next_deadline(), None);
    }

    #[test]
    fn alert_json_carries_suppressed_only_when_some_were() {
        let mut alert = Alert::new(transition("b1", State::Down));
        assert!(alert.to_json().get("suppressed").is_none());
        alert.suppressed = 4;
        assert_eq!(alert.to_json()["suppressed"], 4);
        assert_eq!(alert.to_json()["backend"], "b1");
    }

    #[test]
    fn retry_delay_doubles_up_to_the_cap() {
        let ms = Duration::from_millis;
        assert_eq!(retry_delay(ms(500), 1), ms(500));
        assert_eq!(retry_delay(ms(500), 2), ms(1_000));
        assert_eq!(retry_delay(ms(500), 4), ms(4_000));
        assert_eq!(retry_delay(ms(500), 10), MAX_BACKOFF);
        assert_eq!(retry_delay(ms(500), u32::MAX), MAX_BACKOFF);
        assert_eq!(retry_delay(ms(60_000), 3), ms(60_000));
    }

    #[test]
    fn command_env_names_every_field_and_leaves_missing_ones_empty() {
        let env: BTreeMap<_, _> = command_env(&Alert {
            event: transition("b1", State::Down),
            suppressed: 2,
        })
        .into_iter()
        .collect();
        assert_eq!(env["CAPATAZ_EVENT"], "transition");
        assert_eq!(env["CAPATAZ_POOL"], "web");
        assert_eq!(env["CAPATAZ_BACKEND"], "b1");
        assert_eq!(env["CAPATAZ_FROM"], "UP");
        assert_eq!(env["CAPATAZ_TO"], "DOWN");
        assert_eq!(
            env["CAPATAZ_REASON"],
            "3 consecutive failed probes, last: TIMEOUT"
        );
        assert_eq!(env["CAPATAZ_TIME"], "1970-01-01T00:00:01.500Z");
        assert_eq!(env["CAPATAZ_SUPPRESSED"], "2");
        let json: serde_json::Value = serde_json::from_str(&env["CAPATAZ_JSON"]).unwrap();
        assert_eq!(json["suppressed"], 2);

        let env: BTreeMap<_, _> = command_env(&Alert::new(Event::Recovered {
            pool: "web".into(),
            time: SystemTime::UNIX_EPOCH,
        }))
        .into_iter()
        .collect();
        assert_eq!(env["CAPATAZ_EVENT"], "recovered");
        assert_eq!(env["CAPATAZ_BACKEND"], "");
        assert_eq!(env["CAPATAZ_FROM"], "");
        assert_eq!(env["CAPATAZ_REASON"], "");
    }
}
