//! What `/status` and the explain sentence say of a pool's limits: the queue (length, size,
//! timeout) and each backend's limit now, the one the picker enforces (its configured limit
//! scaled by the weight of the snapshot the view was copied from).

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use crate::health::{BackendView, PoolRt};

/// The pool's queue: `length` (requests waiting now), `size` (`queue_size`), `timeout_ms`
/// (`queue_timeout`), and since the start `refused_full` and `refused_timeout` (requests the
/// queue refused, read from `capataz_queue_rejected_total`'s own counters); `null` for a pool
/// without limits.
pub(super) fn queue_json(pool: &PoolRt) -> Value {
    match &pool.limits {
        None => Value::Null,
        Some(limits) => {
            let (full, timeout) = limits.refused();
            json!({
                "length": limits.queued(),
                "size": limits.queue_size(),
                "timeout_ms": limits.queue_timeout().as_millis() as u64,
                "refused_full": full,
                "refused_timeout": timeout,
            })
        }
    }
}

/// The backend's limit now (`None`: it has none).
pub(super) fn limit_of(pool: &PoolRt, view: &BackendView) -> Option<usize> {
    pool.limits.as_ref()?.limit_weighing(
        view.index,
        view.effective_weight_tenths,
        view.backend.weight,
    )
}

/// The clause the explain sentence ends with while the backend, serving, holds its limit (one
/// that gets no new requests anyway says why in its own sentence).
pub(super) fn limit_clause(pool: &PoolRt, view: &BackendView) -> Option<String> {
    if !view.serving {
        return None;
    }
    let limit = limit_of(pool, view)?;
    let in_flight = view.backend.in_flight.load(Ordering::Relaxed);
    if in_flight < limit {
        return None;
    }
    let queued = pool.limits.as_ref().map_or(0, |l| l.queued());
    let ramp = if limit < configured_limit(pool, view) {
        " (ramping with its weight)"
    } else {
        ""
    };
    Some(format!(
        "; at its limit: {in_flight} of {limit} requests in use{ramp}, new requests go to \
         other backends or wait in the pool's queue ({queued} waiting); not a health matter"
    ))
}

/// The backend's limit at its full weight.
fn configured_limit(pool: &PoolRt, view: &BackendView) -> usize {
    let full = capataz_health::rotation::ramp::full_tenths(view.backend.weight);
    pool.limits
        .as_ref()
        .and_then(|l| l.limit_weighing(view.index, full, view.backend.weight))
        .unwrap_or(0)
}
