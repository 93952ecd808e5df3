//! The dispatcher: the one task that reads the broadcast channel, debounces, and offers each
//! alert to every hook's queue without ever waiting for one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc};

use super::{Alert, AlertStats, Debouncer, HookStats, Kind};
use crate::events::Notice;

/// A hook as the dispatcher sees it: a queue to offer alerts to.
pub(super) struct Outlet {
    pub(super) kind: Kind,
    pub(super) queue: mpsc::Sender<Arc<Alert>>,
}

/// The task between the broadcast channel and the hooks' queues.
pub(super) struct Dispatcher {
    pub(super) outlets: Vec<Outlet>,
    pub(super) debouncer: Option<Debouncer>,
    pub(super) stats: Arc<AlertStats>,
}

impl Dispatcher {
    pub(super) async fn run(mut self, mut events: broadcast::Receiver<Notice>) {
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
