//! A backend's samples, kept sparse: most backends of a large pool carry no traffic in most
//! samples, and a ring of 180 points per backend is 8 KB (82 MB at 10,000 backends after 15
//! minutes). The times of the samples are kept once for all backends ([`Times`]); a backend
//! keeps only its samples with attempts in them, the samples it has no point in (rebuilt
//! without its past), and where its points begin. Any other sample is an idle point (no attempt,
//! no error, no latency) at the sample's time: the JSON is the one the ring gave.

use std::collections::VecDeque;

use super::series::{Point, SAMPLES};

/// The times of the last samples, oldest first: generation, when (ms since the Unix epoch), and
/// the milliseconds since the previous sample. Twice [`SAMPLES`], so that a backend with gaps
/// still finds the times of its last [`SAMPLES`] points (unless it has more gaps than samples).
#[derive(Debug, Default)]
pub(super) struct Times(VecDeque<(u64, u64, u32)>);

impl Times {
    /// Notes sample `generation`, taken at `at` (ms), `span_ms` after the previous one.
    pub(super) fn push(&mut self, generation: u64, at: u64, span_ms: u32) {
        if self.0.len() == 2 * SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back((generation, at, span_ms));
    }

    /// The oldest generation whose time is kept.
    fn oldest(&self) -> u64 {
        self.0.front().map_or(0, |&(generation, ..)| generation)
    }
}

/// One backend's points, sparse.
#[derive(Debug, Default)]
pub(super) struct Sparse {
    /// The generation of its first point (`None`: none yet).
    since: Option<u64>,
    /// Generations since `since` without a point, oldest first.
    gaps: VecDeque<u64>,
    /// Its points with attempts in them, oldest first.
    busy: VecDeque<(u64, Point)>,
}

impl Sparse {
    /// Notes what sample `generation` gave the backend: a point, or none (its first sample,
    /// or rebuilt without its past); then forgets what is older than its last [`SAMPLES`]
    /// points.
    pub(super) fn push(&mut self, generation: u64, point: Option<Point>, times: &Times) {
        match point {
            None if self.since.is_some() => self.gaps.push_back(generation),
            None => {}
            Some(point) => {
                self.since.get_or_insert(generation);
                if point.requests > 0 || point.errors > 0 || point.latency_us.is_some() {
                    self.busy.push_back((generation, point));
                }
            }
        }
        self.prune(generation, times);
    }

    /// Drops the gaps and points older than the oldest of its last [`SAMPLES`] points (or
    /// than the times kept).
    fn prune(&mut self, newest: u64, times: &Times) {
        let Some(since) = self.since else {
            return;
        };
        let mut start = (newest + 1).saturating_sub(SAMPLES as u64);
        loop {
            let gaps = self.gaps.iter().filter(|&&g| g >= start).count() as u64;
            let wider = (newest + 1).saturating_sub(SAMPLES as u64 + gaps);
            if wider == start {
                break;
            }
            start = wider;
        }
        let start = start.max(since).max(times.oldest());
        while self.gaps.front().is_some_and(|&g| g < start) {
            self.gaps.pop_front();
        }
        while self.busy.front().is_some_and(|&(g, _)| g < start) {
            self.busy.pop_front();
        }
    }

    /// Its last [`SAMPLES`] points, oldest first.
    pub(super) fn points(&self, times: &Times) -> Vec<Point> {
        let Some(since) = self.since else {
            return Vec::new();
        };
        let mut busy = self.busy.iter().rev().peekable();
        let mut gaps = self.gaps.iter().rev().peekable();
        let mut points = Vec::new();
        for &(generation, at, span_ms) in times.0.iter().rev() {
            if generation < since || points.len() == SAMPLES {
                break;
            }
            if gaps.next_if(|&&g| g == generation).is_some() {
                continue;
            }
            match busy.next_if(|&&(g, _)| g == generation) {
                Some(&(_, point)) => points.push(point),
                None => points.push(Point {
                    at,
                    span_ms,
                    requests: 0,
                    errors: 0,
                    latency_us: None,
                }),
            }
        }
        points.reverse();
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring of points the series kept before, for comparison.
    #[derive(Default)]
    struct Ring(VecDeque<Point>);

    impl Ring {
        fn push(&mut self, point: Point) {
            if self.0.len() == SAMPLES {
                self.0.pop_front();
            }
            self.0.push_back(point);
        }
    }

    /// Plays `samples` samples on a backend that joins at sample `joins`, is rebuilt without
    /// its past at the samples `rebuilt`, and has attempts in the samples `busy` says; checks
    /// the sparse points against the ring's at every sample.
    fn check(samples: u64, joins: u64, rebuilt: &[u64], busy: impl Fn(u64) -> bool) {
        let mut times = Times::default();
        let (mut sparse, mut ring) = (Sparse::default(), Ring::default());
        let mut at = 1_700_000_000_000;
        for generation in 1..=samples {
            let span_ms = 5_000 + (generation % 7) as u32;
            at += u64::from(span_ms);
            times.push(generation, at, span_ms);
            if generation < joins {
                continue;
            }
            let point = (generation > joins && !rebuilt.contains(&generation)).then(|| {
                let requests = if busy(generation) {
                    generation as u32
                } else {
                    0
                };
                Point {
                    at,
                    span_ms,
                    requests,
                    errors: requests / 3,
                    latency_us: (requests > 0).then_some((100, 2_000)),
                }
            });
            if let Some(point) = point {
                ring.push(point);
            }
            sparse.push(generation, point, &times);
            let want: Vec<Point> = ring.0.iter().copied().collect();
            assert_eq!(sparse.points(&times), want, "sample {generation}");
        }
        assert!(sparse.busy.len() <= SAMPLES && sparse.gaps.len() <= SAMPLES);
    }

    #[test]
    fn sparse_points_are_the_ring_s_points() {
        check(500, 1, &[], |_| false);
        check(500, 1, &[], |_| true);
        check(500, 30, &[], |g| g % 11 < 3);
        check(700, 3, &[50, 51, 300, 420], |g| g % 5 == 0);
        check(40, 5, &[6, 7, 20], |g| g > 10);
    }

    #[test]
    fn an_idle_backend_keeps_nothing_per_sample() {
        let mut times = Times::default();
        let mut sparse = Sparse::default();
        for generation in 1..=1000 {
            times.push(generation, generation * 5_000, 5_000);
            let idle = Point {
                at: generation * 5_000,
                span_ms: 5_000,
                requests: 0,
                errors: 0,
                latency_us: None,
            };
            sparse.push(generation, (generation > 1).then_some(idle), &times);
        }
        assert!(sparse.busy.is_empty() && sparse.gaps.is_empty());
        assert_eq!(sparse.points(&times).len(), SAMPLES);
        assert_eq!(times.0.len(), 2 * SAMPLES);
    }
}
