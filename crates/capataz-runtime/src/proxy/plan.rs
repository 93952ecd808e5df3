//! The attempt planner: what a request does after each attempt, given what the attempt came to,
//! whether the request can be sent again, and what it has left to spend. Pure: no IO, no
//! clock; the pool's retry budget is asked through a closure, only when a retry is otherwise
//! allowed. One planner serves HTTP/1.1 and HTTP/2 backends alike.
//!
//! The rules: a request that did not reach the backend goes elsewhere (it comes back intact);
//! one that was sent goes elsewhere only if the failure allows it (`AttemptError::retry_safe`)
//! and it can be sent again (replayable: bodiless, idempotent, no upgrade; or nothing of it was
//! sent and it can be rebuilt); an answer of 502, 503 or 504 to a replayable request is retried
//! instead of relayed. Each retry needs one of the request's `retries`, room in [`Tried`], a
//! backend not yet tried and a token of the pool's budget; without them the last answer is
//! relayed, or the last failure answered.

use http::Method;

use super::pages::Failure;
use crate::upstream::AttemptError;

/// The most backends one request may try (first attempt plus retries).
pub(super) const MAX_TRIES: usize = 11;

/// The backends one request has tried, without a heap allocation.
#[derive(Default)]
pub(super) struct Tried {
    backends: [usize; MAX_TRIES],
    len: usize,
}

impl Tried {
    fn push(&mut self, backend: usize) {
        if self.len < MAX_TRIES {
            self.backends[self.len] = backend;
            self.len += 1;
        }
    }

    fn has_room(&self) -> bool {
        self.len < MAX_TRIES
    }

    pub(super) fn as_slice(&self) -> &[usize] {
        &self.backends[..self.len]
    }
}

/// What one attempt came to, as the planner needs it (the answer itself stays with the
/// caller: moving a response costs a copy of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attempted {
    /// The backend answered with this status.
    Answered(u16),
    /// Nothing reached the backend; the request is back, intact.
    NotSent(AttemptError),
    /// The request was sent, at least in part, and no usable answer came.
    Failed(AttemptError),
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Relay the answer.
    Relay,
    /// Pick another backend and try again.
    Retry,
    /// Answer the client with this failure.
    Fail(Failure),
}

/// One request's attempts.
pub(super) struct Planner {
    /// Bodiless, idempotent and not an upgrade: it may be sent again after it was sent.
    replayable: bool,
    /// It can be rebuilt for another backend if nothing of it was sent (an HTTP/2 bodiless
    /// request, whatever its method, after a stream refused unprocessed).
    rebuildable: bool,
    retries_left: u32,
    tried: Tried,
    failure: Option<Failure>,
}

impl Planner {
    /// The plan of a request that may be retried `retries` times.
    pub(super) fn new(replayable: bool, rebuildable: bool, retries: u32) -> Planner {
        Planner {
            replayable,
            rebuildable,
            retries_left: retries,
            tried: Tried::default(),
            failure: None,
        }
    }

    /// The backends tried so far.
    pub(super) fn tried(&self) -> &[usize] {
        self.tried.as_slice()
    }

    /// The last failure that was not relayed (an attempt's, or a retried 5xx answer's).
    pub(super) fn failure(&self) -> Option<Failure> {
        self.failure
    }

    /// Notes an attempt on `backend`.
    pub(super) fn picked(&mut self, backend: usize) {
        self.tried.push(backend);
    }

    /// What to do after an attempt. `affordable` is asked (with the backends tried) only when
    /// a retry is wanted and the request has one left and room to try another backend; it
    /// says whether a backend is left and the pool's budget pays, spending a token if so.
    pub(super) fn after(
        &mut self,
        attempted: Attempted,
        affordable: impl FnOnce(&[usize]) -> bool,
    ) -> Next {
        let (wanted, retried_status, otherwise) = match attempted {
            Attempted::Answered(status) => (
                matches!(status, 502..=504) && self.replayable,
                Some(status),
                Next::Relay,
            ),
            Attempted::NotSent(why) => {
                self.failure = Some(Failure::Attempt(why));
                (true, None, Next::Fail(Failure::Attempt(why)))
            }
            Attempted::Failed(why) => {
                self.failure = Some(Failure::Attempt(why));
                let again = why.retry_safe(self.replayable)
                    && (self.replayable || (why.nothing_sent() && self.rebuildable));
                (again, None, Next::Fail(Failure::Attempt(why)))
            }
        };
        if !(wanted
            && self.retries_left > 0
            && self.tried.has_room()
            && affordable(self.tried.as_slice()))
        {
            return otherwise;
        }
        self.retries_left -= 1;
        if let Some(status) = retried_status {
            self.failure = Some(Failure::Status(status));
        }
        Next::Retry
    }
}

/// Whether a request with this method may be sent twice (RFC 9110 section 9.2.2).
pub(super) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: AttemptError = AttemptError::HeadTimeout;
    const REFUSED: AttemptError = AttemptError::ConnectRefused;

    /// A budget that always pays, and one that never does.
    fn pays(_: &[usize]) -> bool {
        true
    }
    fn broke(_: &[usize]) -> bool {
        false
    }

    #[test]
    fn idempotent_methods() {
        assert!(is_idempotent(&Method::GET));
        assert!(is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST));
        assert!(!is_idempotent(&Method::PATCH));
    }

    #[test]
    fn an_answer_is_relayed_unless_a_replayable_request_got_a_gateway_error() {
        for status in [200, 404, 500, 501, 505] {
            let mut plan = Planner::new(true, true, 3);
            assert_eq!(plan.after(Attempted::Answered(status), pays), Next::Relay);
            assert_eq!(plan.failure(), None);
        }
        for status in [502, 503, 504] {
            let mut plan = Planner::new(true, true, 3);
            assert_eq!(plan.after(Attempted::Answered(status), pays), Next::Retry);
            assert_eq!(plan.failure(), Some(Failure::Status(status)));
            let mut plan = Planner::new(false, true, 3);
            assert_eq!(plan.after(Attempted::Answered(status), pays), Next::Relay);
        }
    }

    #[test]
    fn a_request_that_was_not_sent_goes_elsewhere_whatever_it_is() {
        let mut plan = Planner::new(false, false, 1);
        assert_eq!(plan.after(Attempted::NotSent(REFUSED), pays), Next::Retry);
        assert_eq!(plan.failure(), Some(Failure::Attempt(REFUSED)));
        // No retry left: the failure is the answer.
        assert_eq!(
            plan.after(Attempted::NotSent(REFUSED), pays),
            Next::Fail(Failure::Attempt(REFUSED))
        );
    }

    #[test]
    fn a_sent_request_goes_elsewhere_only_if_replayable_or_rebuildable_and_unsent() {
        let mut plan = Planner::new(true, true, 1);
        assert_eq!(plan.after(Attempted::Failed(TIMEOUT), pays), Next::Retry);
        let mut plan = Planner::new(false, true, 1);
        assert_eq!(
            plan.after(Attempted::Failed(TIMEOUT), pays),
            Next::Fail(Failure::Attempt(TIMEOUT))
        );
        // An HTTP/2 stream refused unprocessed: nothing sent, rebuilt for another backend.
        let refused = AttemptError::StreamRefused;
        let mut plan = Planner::new(false, true, 1);
        assert_eq!(plan.after(Attempted::Failed(refused), pays), Next::Retry);
        let mut plan = Planner::new(false, false, 1);
        assert_eq!(
            plan.after(Attempted::Failed(refused), pays),
            Next::Fail(Failure::Attempt(refused))
        );
        // A body that broke after the head was relayed never goes elsewhere.
        let mut plan = Planner::new(true, true, 1);
        assert_eq!(
            plan.after(Attempted::Failed(AttemptError::BodyBroken), pays),
            Next::Fail(Failure::Attempt(AttemptError::BodyBroken))
        );
        // Nor the client's own fault.
        let mut plan = Planner::new(true, true, 1);
        assert_eq!(
            plan.after(Attempted::Failed(AttemptError::ClientGone), pays),
            Next::Fail(Failure::Attempt(AttemptError::ClientGone))
        );
    }

    #[test]
    fn the_budget_is_asked_only_when_a_retry_is_otherwise_allowed() {
        let asked = std::cell::Cell::new(0);
        let mut plan = Planner::new(true, true, 1);
        let ask = |_: &[usize]| {
            asked.set(asked.get() + 1);
            false
        };
        assert_eq!(plan.after(Attempted::Answered(200), ask), Next::Relay);
        assert_eq!(plan.after(Attempted::Answered(503), ask), Next::Relay);
        assert_eq!(asked.get(), 1, "asked for the 503 only");
        // Refused by the budget: the answer is relayed and the failure not recorded.
        assert_eq!(plan.failure(), None);
        assert_eq!(plan.after(Attempted::Answered(503), pays), Next::Retry);
        // The one retry is spent: no more asking.
        assert_eq!(plan.after(Attempted::Answered(503), ask), Next::Relay);
        assert_eq!(asked.get(), 1, "not asked once the retries are spent");
    }

    #[test]
    fn at_most_max_tries_backends_whatever_the_retries() {
        let mut plan = Planner::new(true, true, 100);
        let mut retries = 0;
        for backend in 0..100 {
            plan.picked(backend);
            match plan.after(Attempted::NotSent(REFUSED), pays) {
                Next::Retry => retries += 1,
                Next::Fail(_) => break,
                Next::Relay => unreachable!(),
            }
        }
        assert_eq!(retries, MAX_TRIES - 1);
        assert_eq!(plan.tried().len(), MAX_TRIES);
        assert_eq!(
            plan.after(Attempted::Answered(503), broke),
            Next::Relay,
            "no room: the answer is relayed"
        );
    }

    #[test]
    fn the_budget_sees_the_backends_tried() {
        let mut plan = Planner::new(true, true, 2);
        plan.picked(4);
        plan.picked(7);
        let mut seen = Vec::new();
        plan.after(Attempted::Failed(TIMEOUT), |tried| {
            seen = tried.to_vec();
            true
        });
        assert_eq!(seen, [4, 7]);
    }
}
