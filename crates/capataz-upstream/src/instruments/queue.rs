//! The queue's families: how long requests waited in a pool's queue
//! (`capataz_queue_wait_seconds{pool}`) and the requests it refused
//! (`capataz_queue_rejected_total{pool,reason}`, `reason` = `full` or `timeout`). The queue's
//! length and each backend's limit are gauges read at scrape time (the runtime's `metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::{latency_histogram, PoolLabels, PoolMetrics};

type Waits = Family<PoolLabels, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabels {
    pool: String,
    reason: &'static str,
}

/// The queue's families.
#[derive(Clone, Debug)]
pub(super) struct QueueFamilies {
    wait: Waits,
    rejected: Family<RejectLabels, Counter>,
}

impl QueueFamilies {
    pub(super) fn register(registry: &mut Registry) -> QueueFamilies {
        let wait = Waits::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "capataz_queue_wait",
            "Time a request waited in its pool's queue for a backend below its limit, observed when it left the queue",
            Unit::Seconds,
            wait.clone(),
        );
        let rejected = Family::default();
        registry.register(
            "capataz_queue_rejected",
            "Requests answered 503 because every eligible backend was at its limit: the queue was full (reason = full) or the wait reached queue_timeout (reason = timeout)",
            rejected.clone(),
        );
        QueueFamilies { wait, rejected }
    }
}

/// One pool's queue handles.
#[derive(Debug)]
pub struct QueueMetrics {
    /// Time spent queued, per request that queued.
    pub wait: Histogram,
    /// Requests refused because the queue was full.
    pub full: Counter,
    /// Requests refused after `queue_timeout`.
    pub timeout: Counter,
}

impl PoolMetrics {
    /// The handles of the pool's queue (made only for a pool with limits: a pool without them
    /// shows no queue series).
    pub fn queue(&self) -> QueueMetrics {
        let families = &self.families.queue;
        let pool = self.pool.to_string();
        let rejected = |reason| {
            families.rejected.get_or_create_owned(&RejectLabels {
                pool: pool.clone(),
                reason,
            })
        };
        QueueMetrics {
            wait: families
                .wait
                .get_or_create_owned(&PoolLabels { pool: pool.clone() }),
            full: rejected("full"),
            timeout: rejected("timeout"),
        }
    }
}
