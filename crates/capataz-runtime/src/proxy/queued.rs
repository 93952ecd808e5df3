//! The picking phase of an attempt in a pool with limits: a slot on a backend below its limit
//! (`balance::Limits`), waited for in the pool's queue by a first attempt, taken at once or
//! not at all by a retry (HAProxy queues a redispatched request again; here the request has
//! already waited its turn once, and a retry that found no slot would hold it longer than the
//! failure it answers: Envoy's retry overflow is refused the same way). The 503 a refusal
//! answers is `pages.rs`'s [`Refusal`]. Nothing here is an outcome of a backend: the passive checks never hear of it.

use http::Response;
use std::sync::Arc;

use super::affinity::Affinity;
use super::pages::{failure_page, reject_page, Failure, Refusal};
use super::plan::Planner;
use super::tally::Tally;
use crate::access_log::Phase;
use crate::balance::{Admission, Admit, Limits, PoolHandle};
use crate::body::RespBody;

/// A slot on a backend of `pool` the request has not tried (noted in `plan`), waited for in
/// the queue if need be (the time noted in the access log record); or the answer: the pool's
/// rejection or the last failure when no backend is left, the queue's refusal. The backend
/// the request's `affinity` names (its sticky backend, or its key's on the ring) is taken if
/// it has a free slot and nobody waits; else the request goes the queue's way like any other
/// (a sticky client then moves, counted as `at_limit`).
pub(super) async fn admit<'a>(
    pool: &'a Arc<PoolHandle>,
    limits: &Limits,
    plan: &mut Planner,
    tally: &mut Tally,
    affinity: &mut Affinity,
) -> Result<(usize, Option<Admission<'a>>), Response<RespBody>> {
    let preferred = affinity
        .pick(pool, &pool.snapshot(), plan.tried())
        .flatten();
    if let Some(index) = preferred {
        match limits.admit_on(pool, index) {
            Some(admission) => {
                plan.picked(index);
                return Ok((index, Some(admission)));
            }
            None => affinity.at_limit(index),
        }
    }
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
