//! A backend's recent probes as the runtime keeps them ([`ProbeRing`]): at most [`HISTORY`],
//! 32 bytes each, where the [`ProbeRecord`] the admin API reads is 136 (the content rule an
//! answer broke, rare, is boxed here rather than carried inline in every record). With 10,000
//! probed backends that is 6.4 MB instead of 27 MB; the records are expanded only when a view
//! is copied out.

use std::collections::VecDeque;
use std::time::{Duration, UNIX_EPOCH};

use capataz_health::{Mismatch, Outcome, ProbeOutcome, ProbeResult};

use super::{ProbeRecord, HISTORY};

/// A backend's recent probes, oldest first; allocated at its first probe.
#[derive(Clone, Debug, Default)]
pub(super) struct ProbeRing(VecDeque<Kept>);

/// One probe, kept small.
#[derive(Clone, Debug)]
struct Kept {
    outcome: Outcome,
    result: ProbeResult,
    mismatch: Option<Box<Mismatch>>,
    latency_ns: u64,
    /// When it ended, in nanoseconds since the Unix epoch (saturating in the year 2554).
    at_ns: u64,
}

impl ProbeRing {
    /// Keeps `record`, dropping the oldest past [`HISTORY`].
    pub(super) fn push(&mut self, record: &ProbeRecord) {
        if self.0.len() == HISTORY {
            self.0.pop_front();
        }
        if self.0.capacity() == 0 {
            self.0.reserve_exact(HISTORY);
        }
        let at = record.at.duration_since(UNIX_EPOCH).unwrap_or_default();
        self.0.push_back(Kept {
            outcome: record.outcome.outcome,
            result: record.result,
            mismatch: record.outcome.mismatch.map(Box::new),
            latency_ns: nanos(record.latency),
            at_ns: nanos(at),
        });
    }

    /// The last probe's outcome, if any.
    pub(super) fn last_outcome(&self) -> Option<Outcome> {
        self.0.back().map(|kept| kept.outcome)
    }

    /// The last record, if any.
    pub(super) fn last_record(&self) -> Option<ProbeRecord> {
        self.0.back().map(Kept::record)
    }

    /// The records, oldest first, as the admin API reads them.
    pub(super) fn records(&self) -> VecDeque<ProbeRecord> {
        self.0.iter().map(Kept::record).collect()
    }
}

impl Kept {
    fn record(&self) -> ProbeRecord {
        ProbeRecord {
            outcome: ProbeOutcome {
                outcome: self.outcome,
                mismatch: self.mismatch.as_deref().copied(),
            },
            result: self.result,
            latency: Duration::from_nanos(self.latency_ns),
            at: UNIX_EPOCH + Duration::from_nanos(self.at_ns),
        }
    }
}

/// A duration in nanoseconds, saturating (at over 500 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use capataz_health::Snippet;

    use super::*;

    fn record(n: u64, mismatch: Option<Mismatch>) -> ProbeRecord {
        ProbeRecord {
            outcome: ProbeOutcome {
                outcome: Outcome::Status(200 + n as u16),
                mismatch,
            },
            result: ProbeResult::Pass,
            latency: Duration::from_nanos(1_234_567 + n),
            at: UNIX_EPOCH + Duration::from_nanos(1_733_000_000_123_456_789 + n),
        }
    }

    #[test]
    fn the_ring_gives_back_the_last_records_exactly() {
        let mut ring = ProbeRing::default();
        assert!(ring.records().is_empty() && ring.last_outcome().is_none());
        let lacks = Mismatch::BodyLacks(Snippet::new("ok"));
        let all: Vec<ProbeRecord> = (0..25)
            .map(|n| record(n, (n % 3 == 0).then_some(lacks)))
            .collect();
        for r in &all {
            ring.push(r);
        }
        let kept: Vec<ProbeRecord> = ring.records().into_iter().collect();
        assert_eq!(kept.len(), HISTORY);
        for (got, want) in kept.iter().zip(&all[25 - HISTORY..]) {
            assert_eq!(got.outcome, want.outcome);
            assert_eq!(got.result, want.result);
            assert_eq!(got.latency, want.latency);
            assert_eq!(got.at, want.at);
        }
        assert_eq!(ring.last_outcome(), Some(Outcome::Status(224)));
        let last = ring.last_record().expect("a record");
        assert_eq!((last.outcome, last.at), (all[24].outcome, all[24].at));
        assert_eq!(std::mem::size_of::<Kept>(), 32);
    }
}
