//! Alert hooks: health events handed to webhooks and commands, without ever holding up the
//! balancer.
//!
//! An alert receiver is someone else's server or script. It can be slow, down, or hang, and a
//! backend that flaps can produce events faster than any pager wants them. None of that may
//! reach the request path or the probes, so alerts run on their own tasks. The only link is the
//! broadcast channel the health runtime already publishes to, and its `send` never waits.
//!
//! One dispatcher task reads the events, debounces them when `[alerts] debounce` is set (see
//! `Debouncer`), and offers each resulting `Alert` to every hook's bounded queue. Each hook
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
//!
//! Files: `stats.rs` (the counters), `debounce.rs` (the pure `Debouncer`), `dispatch.rs` (the
//! task between the broadcast channel and the hooks' queues), `webhook.rs` and `command.rs`
//! (one worker per hook).

use std::io;
use std::net::SocketAddr;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use crate::config::AlertsConfig;
use crate::events::Notice;

mod command;
mod debounce;
mod dispatch;
mod stats;
mod webhook;

#[cfg(test)]
mod tests;

pub(crate) use debounce::Debouncer;
pub use stats::{AlertStats, HookStats};

use command::run_command;
use dispatch::{Dispatcher, Outlet};
use webhook::run_webhook;

/// One alert: an event and how many earlier events debouncing folded into it.
#[derive(Clone, Debug)]
pub(crate) struct Alert {
    /// The event. For a debounce summary, this is the latest event of the window.
    pub event: Notice,
    /// Events of the same pool and backend that were not sent on their own and are summed up
    /// by this alert. Zero for an ordinary alert.
    pub suppressed: u64,
}

impl Alert {
    /// An ordinary alert for `event`.
    pub(crate) fn new(event: Notice) -> Alert {
        Alert {
            event,
            suppressed: 0,
        }
    }

    /// The event's JSON (see [`Notice::to_json`]) plus `"suppressed": N` when N > 0.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let mut value = self.event.to_json();
        if self.suppressed > 0 {
            if let Some(object) = value.as_object_mut() {
                object.insert("suppressed".into(), self.suppressed.into());
            }
        }
        value
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
    pub fn start(config: &AlertsConfig, events: broadcast::Receiver<Notice>) -> Alerts {
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

/// The kinds of hook, for counting.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Webhook,
    Command,
}

/// Why one delivery did not count as delivered.
#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    #[error("connecting to {addr} failed: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("the HTTP exchange failed: {0}")]
    Http(#[source] crate::oneshot::Error),
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
