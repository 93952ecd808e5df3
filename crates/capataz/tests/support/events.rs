//! Recording the balancer's events: wait for one that matches, count what has come.

use capataz::health::Notice;
use capataz_health::{State, Transition};
use tokio::sync::broadcast;

use super::DEADLINE;

/// Waits for the first event matching `want`, failing after [`DEADLINE`]. Lagging is not an
/// error: the test only cares about the event it waits for.
pub async fn wait_for(
    rx: &mut broadcast::Receiver<Notice>,
    what: &str,
    want: impl Fn(&Notice) -> bool,
) -> Notice {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(end, rx.recv()).await {
            Ok(Ok(event)) if want(&event) => return event,
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
            Ok(Err(e)) => panic!("event stream ended while waiting for {what}: {e}"),
            Err(_) => panic!("no {what} within {DEADLINE:?}"),
        }
    }
}

/// Whether `event` is a transition of `backend` to `to`.
pub fn is_transition(event: &Notice, backend: &str, to: State) -> bool {
    transition_of(event, backend, to).is_some()
}

/// The transition of `backend` to `to` that `event` is, if it is one.
pub fn transition_of<'a>(event: &'a Notice, backend: &str, to: State) -> Option<&'a Transition> {
    match event {
        Notice::Transition {
            backend: b,
            transition,
            ..
        } if &**b == backend && transition.to == to => Some(transition),
        _ => None,
    }
}

/// How many transitions are waiting in `rx`, consuming everything waiting.
pub fn count_transitions(rx: &mut broadcast::Receiver<Notice>) -> usize {
    let mut n = 0;
    while let Ok(event) = rx.try_recv() {
        if matches!(event, Notice::Transition { .. }) {
            n += 1;
        }
    }
    n
}
