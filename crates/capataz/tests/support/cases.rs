//! Table-driven tests: one body run over named cases. Every case runs, even after one fails; a
//! failing case's panic message is printed as it happens, and the test then fails naming every
//! case that did, so a failure says which input broke without a test per input. Cases run one
//! after the other ([`each`], [`each_sync`]), or side by side on the test's runtime where each
//! mostly waits on its own sockets and servers ([`concurrently`]), as separate tests would.
//! Tasks a failed case spawned may outlive it until the test ends: the cases after a failure
//! are reported, but a test with a failed case fails whatever they say.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::task::Poll;

/// Runs the async `body` on each case in turn (`(name, case)`); panics after the last one,
/// naming the cases whose body panicked.
pub async fn each<C, F, Fut>(cases: impl IntoIterator<Item = (&'static str, C)>, mut body: F)
where
    F: FnMut(C) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut failed = Vec::new();
    for (name, case) in cases {
        let mut run = pin!(body(case));
        // A panic while polling the case's future is caught here; the future is dropped at the
        // end of this turn (its sockets and balancer with it).
        let outcome = std::future::poll_fn(|cx| {
            match catch_unwind(AssertUnwindSafe(|| run.as_mut().poll(cx))) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(())) => Poll::Ready(true),
                Err(_) => Poll::Ready(false),
            }
        })
        .await;
        if !outcome {
            eprintln!("case {name:?} failed (its panic is above)");
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "failed cases: {failed:?}");
}

/// Runs the async `body` on every case at once, each case's future polled in turn on the
/// test's task; panics once all have ended, naming the cases whose body panicked.
pub async fn concurrently<C, F, Fut>(
    cases: impl IntoIterator<Item = (&'static str, C)>,
    mut body: F,
) where
    F: FnMut(C) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut running: Vec<(&'static str, Option<Pin<Box<Fut>>>)> = cases
        .into_iter()
        .map(|(name, case)| (name, Some(Box::pin(body(case)))))
        .collect();
    let mut failed = Vec::new();
    std::future::poll_fn(|cx| {
        for (name, slot) in &mut running {
            let Some(run) = slot else { continue };
            match catch_unwind(AssertUnwindSafe(|| run.as_mut().poll(cx))) {
                Ok(Poll::Pending) => continue,
                Ok(Poll::Ready(())) => {}
                Err(_) => {
                    eprintln!("case {name:?} failed (its panic is above)");
                    failed.push(*name);
                }
            }
            *slot = None;
        }
        if running.iter().all(|(_, slot)| slot.is_none()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    assert!(failed.is_empty(), "failed cases: {failed:?}");
}

/// Runs `body` on each case in turn (`(name, case)`); panics after the last one, naming the
/// cases whose body panicked.
pub fn each_sync<C>(cases: impl IntoIterator<Item = (&'static str, C)>, mut body: impl FnMut(C)) {
    let mut failed = Vec::new();
    for (name, case) in cases {
        if catch_unwind(AssertUnwindSafe(|| body(case))).is_err() {
            eprintln!("case {name:?} failed (its panic is above)");
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "failed cases: {failed:?}");
}
