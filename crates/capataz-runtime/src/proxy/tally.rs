//! What a request's answer is counted and logged under, and where the request is when its
//! client goes away.

use std::sync::Arc;

use crate::access_log::{AccessLog, AccessRecord, Phase, Termination};
use crate::instruments::AnsweredBy;

use super::pages::Failure;

/// What a request's answer is counted under: the route that took it (none: refused before
/// routing, or no route matched) and who wrote the answer; and, with an access log, what its
/// record needs: the last backend tried, the attempts, the last failure, where the request is
/// (for a client that goes away), and the record itself.
pub(super) struct Tally {
    pub(super) route: Option<usize>,
    pub(super) by: AnsweredBy,
    pub(super) backend: Option<usize>,
    pub(super) attempts: u32,
    pub(super) failure: Option<Failure>,
    pub(super) stage: Stage,
    /// The access log record (`None` without an access log): emitted when the answer's body
    /// ends, or, if the request is dropped first (the client went away), when the tally is.
    pub(super) record: Option<(Box<AccessRecord>, Arc<AccessLog>, Arc<PoolNames>)>,
    /// Why capataz refused the request by a rule of its own (the access log's `reason`).
    pub(super) reason: Option<&'static str>,
    /// The request's id, when the listener gives ids (`request_id`).
    pub(super) request_id: Option<http::HeaderValue>,
    /// How the answering backend stands to the one affinity named (the access log's
    /// `affinity=`), on a pool with affinity: `-` until a backend's answer is relayed.
    pub(super) affinity: Option<&'static str>,
}

/// The names an access log record takes from the proxy (`None` unless logging).
#[derive(Debug)]
pub(super) struct PoolNames {
    /// Per route: its label, and its pool's name (none for a redirect) and backends' names.
    pub(super) routes: Vec<RouteNames>,
}

/// A route's label, its pool's name (none for a redirect) and its backends' names.
pub(super) type RouteNames = (String, Option<Arc<str>>, Vec<Arc<str>>);

/// Where a request is: the phase a client going away ends it in.
#[derive(Clone, Copy)]
pub(super) struct Stage {
    pub(super) now: Phase,
    /// The phase once connected: `Headers` for a bodiless request (its head goes out at
    /// once), else `Send` (its body may still be flowing).
    pub(super) connected: Phase,
}

impl Tally {
    /// Fills `record` with the route, pool, backend, attempts and status.
    pub(super) fn fill(&self, record: &mut AccessRecord, names: &PoolNames, status: Option<u16>) {
        record.status = status;
        record.attempts = self.attempts;
        record.reason = self.reason;
        record.affinity = self.affinity;
        if let Some((label, pool, backends)) = self.route.and_then(|r| names.routes.get(r)) {
            record.route = Some(label.clone());
            record.pool = pool.clone();
            record.backend = self.backend.and_then(|b| backends.get(b)).cloned();
        }
    }

    /// Who ended a request whose answer is the one now written, if already decided: capataz's
    /// own page after a failure, or before any attempt. A backend's answer is decided when its
    /// body ends.
    pub(super) fn ending(&self) -> Option<Termination> {
        if self.by == AnsweredBy::Backend {
            return None;
        }
        Some(match self.failure {
            Some(Failure::Attempt(error)) => Termination::of(error),
            Some(Failure::Status(_)) => Termination {
                ended_by: crate::access_log::EndedBy::Backend,
                phase: Phase::Headers,
            },
            Some(Failure::Queue(_)) => Termination {
                ended_by: crate::access_log::EndedBy::Capataz,
                phase: Phase::Queue,
            },
            None => Termination::REFUSED,
        })
    }

    /// Notes the request's id, for its record too.
    pub(super) fn set_request_id(&mut self, id: http::HeaderValue) {
        if let Some((record, ..)) = &mut self.record {
            record.set_request_id(&id);
        }
        self.request_id = Some(id);
    }

    /// Notes an attempt on backend `index` starting.
    pub(super) fn attempt(&mut self, index: usize) {
        self.backend = Some(index);
        self.attempts += 1;
        self.stage.now = Phase::Connect;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        // Still here: the request was dropped before its answer (the client went away).
        if let Some((mut record, log, names)) = self.record.take() {
            self.fill(&mut record, &names, None);
            record.termination = Termination::client_gone(self.stage.now);
            log.emit(record);
        }
    }
}
