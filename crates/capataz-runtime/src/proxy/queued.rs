//! The picking phase of an attempt in a pool with limits: a slot on a backend below its limit
//! (`balance::Limits`), waited for in the pool's queue by a first attempt, taken at once or
//! not at all by a retry (HAProxy queues a redispatched request again; here the request has
//! already waited its turn once, and a retry that found no slot would hold it longer than the
//! failure it answers: Envoy's retry overflow is refused the same way); and the 503 a refusal
//! answers. Nothing here is an outcome of a backend: the passive checks never hear of it.

use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};

use super::pages::{error_page, failure_page, reject_page, Failure};
use super::plan::Planner;
use super::tally::Tally;
use crate::access_log::Phase;
use crate::balance::{Admission, Admit, Limits, PoolHandle};
use crate::body::RespBody;

/// Why the queue refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The queue held `queue_size` requests already.
    Full { size: usize },
    /// The request waited `queue_timeout` without a slot.
    Timeout { timeout: Duration },
}

impl Refusal {
    /// The answer: 503, saying why, without `Retry-After` (as HAProxy's queue timeout and
    /// Envoy's overflow: a slot may free in milliseconds, not seconds).
    pub(super) fn page(self) -> Response<RespBody> {
        let text = match self {
            Refusal::Full { size } => format!(
                "every eligible backend is at its connection limit and the queue is full \
                 ({size} requests waiting)"
            ),
            Refusal::Timeout { timeout } => format!(
                "every eligible backend stayed at its connection limit for the queue timeout \
                 ({} ms)",
                timeout.as_millis()
            ),
        };
        error_page(StatusCode::SERVICE_UNAVAILABLE, &text)
    }
}

/// A slot on a backend of `pool` the request has not tried (noted in `plan`), waited for in
/// the queue if need be (the time noted in the access log record); or the answer: the pool's
/// rejection or the last failure when no backend is left, the queue's refusal.
pub(super) async fn admit<'a>(
    pool: &'a Arc<PoolHandle>,
    limits: &Limits,
    plan: &mut Planner,
    tally: &mut Tally,
) -> Result<(usize, Option<Admission<'a>>), Response<RespBody>> {
    let before = tally.stage.now;
    tally.stage.now = Phase::Queue;
    let admitted = limits.admit(pool, plan.tried()).await;
    tally.stage.now = before;
    let waited = match &admitted {
        Admit::Granted(_, waited) | Admit::NoBackend(waited) => *waited,
        Admit::TimedOut(waited) => Some(*waited),
        Admit::Busy | Admit::QueueFull => None,
    };
    if let (Some(waited), Some((record, ..))) = (waited, &mut tally.record) {
        record.queued = Some(waited);
    }
    let refusal = match admitted {
        Admit::Granted(admission, _) => {
            let index = admission.index();
            plan.picked(index);
            return Ok((index, Some(admission)));
        }
        Admit::NoBackend(_) | Admit::Busy => {
            return Err(match plan.failure() {
                Some(failure) => failure_page(failure),
                None => {
                    pool.metrics.reject();
                    reject_page(pool, pool.snapshot().all_down)
                }
            });
        }
        Admit::QueueFull => Refusal::Full {
            size: limits.queue_size(),
        },
        Admit::TimedOut(_) => Refusal::Timeout {
            timeout: limits.queue_timeout(),
        },
    };
    tracing::debug!(pool = %pool.name, ?refusal, "refused by the queue");
    tally.failure = Some(Failure::Queue(refusal));
    Err(refusal.page())
}
