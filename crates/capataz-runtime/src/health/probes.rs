//! What a probe came to, as the engine's schedule hands it out ([`Probed`]), to those who keep
//! it: the traffic tap, the backend's metrics, its recent probes (the admin API's history) and
//! a trace line. `record_probe` only feeds the engine; this drains what came out, in order,
//! before the engine's events (`publish`).

use capataz_health::{Outcome, Probed};

use super::{Inner, PoolRt, ProbeRecord};
use crate::balance::tap::Recorded;

impl PoolRt {
    /// Hands every probe the schedule judged since the last call to the tap, the metrics, the
    /// probe history and the traces.
    pub(super) fn publish_probes(&self, inner: &mut Inner) {
        while let Some(probed) = inner.schedule.poll_probed() {
            self.keep_probe(inner, probed);
        }
    }

    fn keep_probe(&self, inner: &mut Inner, probed: Probed) {
        let Probed {
            backend,
            outcome,
            result,
            latency,
            at,
        } = probed;
        let recorded = match outcome.mismatch {
            Some(_) => Outcome::Malformed,
            None => outcome.outcome,
        };
        self.handle.tap.record(backend, Recorded::Probe(recorded));
        self.backends[backend].metrics.probe(result, latency);
        inner.info[backend].probes.push(&ProbeRecord {
            outcome,
            result,
            latency,
            at: self.clock.wall(at),
        });
        tracing::trace!(
            pool = %self.name,
            backend = %self.backends[backend].name,
            outcome = %outcome,
            result = result.as_str(),
            latency_us = latency.as_micros() as u64,
            "probe"
        );
    }
}
