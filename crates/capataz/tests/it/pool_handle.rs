//! The request path's side of a pool (`balance::PoolHandle`) and the health runtime behind it
//! (`health::PoolRt`): outcomes reported on the handle reach the engine, and a handle that
//! outlives its pool (a request still streaming after a reload) neither panics nor keeps the
//! old runtime alive.

use std::sync::Arc;

use capataz::health::{Notice, PoolRt};
use capataz_health::Outcome;
use tokio::sync::broadcast;

use crate::support::balancer::lone_pool;

const TWO_BACKENDS: &str = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
    backends = [{ name = \"a\", address = \"127.0.0.1:9\" }, { name = \"b\", address = \"127.0.0.1:9\" }]\n\
    [pools.web.active]\nkind = \"none\"\n\
    [pools.web.passive]\nconsecutive_errors = 3\n";

fn pool() -> (Arc<PoolRt>, broadcast::Receiver<Notice>) {
    lone_pool(TWO_BACKENDS)
}

#[tokio::test]
async fn errors_observed_on_the_handle_reach_the_engine_and_its_snapshot() {
    let (pool, mut rx) = pool();
    let handle = pool.handle().clone();
    assert_eq!(handle.snapshot().eligible, vec![0, 1]);
    // Good answers take the fast path: nothing changes.
    for _ in 0..10 {
        handle.observe(0, Outcome::Status(200));
    }
    assert!(rx.try_recv().is_err());
    for _ in 0..3 {
        handle.observe(0, Outcome::Reset);
    }
    // The engine ejected backend 0 and published into the handle the request path reads.
    assert_eq!(handle.snapshot().eligible, vec![1]);
    assert_eq!(pool.snapshot().eligible, vec![1]);
    let event = rx.try_recv().expect("a transition event");
    assert_eq!(event.kind(), "transition");
    assert_eq!(handle.backends[0].traffic.recent().len(), 13);
}

#[tokio::test]
async fn a_handle_outliving_its_pool_records_traffic_and_never_panics() {
    let (pool, mut rx) = pool();
    let handle = pool.handle().clone();
    let weak = Arc::downgrade(&pool);
    drop(pool);
    assert!(
        weak.upgrade().is_none(),
        "the handle does not keep the runtime alive"
    );
    for _ in 0..5 {
        handle.observe(0, Outcome::Reset);
    }
    // Recorded in the backend's ring; no engine judges it, so nothing is published.
    assert_eq!(handle.backends[0].traffic.recent(), vec![Outcome::Reset; 5]);
    assert_eq!(handle.snapshot().eligible, vec![0, 1]);
    assert!(matches!(
        rx.try_recv(),
        Err(broadcast::error::TryRecvError::Closed | broadcast::error::TryRecvError::Empty)
    ));
}
