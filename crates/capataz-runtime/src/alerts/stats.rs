//! The alert counters, per kind of hook.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Kind;

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

    pub(super) fn of(&self, kind: Kind) -> &HookStats {
        match kind {
            Kind::Webhook => &self.webhook,
            Kind::Command => &self.command,
        }
    }
}
