//! The per-backend counter families (`capataz_requests_total`, `capataz_probes_total`,
//! `capataz_transitions_total`, `capataz_ejections_total`, `capataz_outlier_ejections_total`),
//! kept as one block of atomics per backend ([`Counts`], as HAProxy keeps a server's counters
//! in its own struct) found by pool and backend name ([`BackendCounters`]), and encoded at
//! scrape time by one [`Series`] per family, registered where the family was.
//!
//! Why not prometheus-client's `Family`: it holds, per series, a label set with its own two
//! strings, a hash-table slot and a counter of its own; eleven series per backend came to
//! about 1.8 KB, 18 MB at 10,000 backends. A block is about 130 bytes, and the names are the
//! runtime's own `Arc<str>`s. What a scrape shows is the same: the same families, labels and
//! values; the drain probes' and the outlier detectors' series appear with their first count,
//! and the counters of a backend rebuilt under the same names are kept.
//!
//! Counters of a backend no longer held by any pool (removed by a reload or by its DNS or
//! etcd source, and done with its last request) are forgotten: a source whose backends come
//! and go under new names (pods rescheduled at new addresses) must not grow the map, and the
//! scrape, forever. The map is swept when it has doubled since its last sweep, so a sweep
//! costs O(1) per backend added, amortized; until then a removed backend's series keep their
//! last value.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::handles::CLASSES;
use super::{BackendLabels, OutlierLabels, ProbeLabels, RequestLabels, TransitionLabels};

/// The probe results counted, in the order of [`Counts`]' probe counters.
const RESULTS: [&str; 3] = ["pass", "fail", "drain"];

/// The outlier detectors, in the order of [`Counts`]' outlier counters.
pub(super) const DETECTORS: [&str; 2] = ["latency", "success_rate"];

/// Which of a backend's series that appear on first use exist: bit 0 the drain probes', bits
/// 1 and 2 the detectors'.
const DRAIN_SHOWN: u8 = 1;

/// One backend's counters.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// By answer class, in the order of [`CLASSES`].
    pub(super) requests: [AtomicU64; 6],
    /// By probe result, in the order of [`RESULTS`].
    pub(super) probes: [AtomicU64; 3],
    /// Verdict changes to UP, then to DOWN.
    pub(super) transitions: [AtomicU64; 2],
    pub(super) ejections: AtomicU64,
    /// By detector, in the order of [`DETECTORS`].
    pub(super) outliers: [AtomicU64; 2],
    shown: AtomicU8,
}

impl Counts {
    /// Counts a drain probe (its series appears with the first).
    pub(super) fn drain(&self) {
        self.shown.fetch_or(DRAIN_SHOWN, Ordering::Relaxed);
        self.probes[2].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an ejection by detector `slot` (its series appears with the first).
    pub(super) fn outlier(&self, slot: usize) {
        self.shown
            .fetch_or(DRAIN_SHOWN << (slot + 1), Ordering::Relaxed);
        self.outliers[slot].fetch_add(1, Ordering::Relaxed);
    }

    fn shown(&self, bit: u8) -> bool {
        self.shown.load(Ordering::Relaxed) & bit != 0
    }
}

/// The counters by pool and backend name.
type ByName = BTreeMap<(Arc<str>, Arc<str>), Arc<Counts>>;

/// The smallest map size that is swept.
const MIN_SWEEP: usize = 64;

/// The counters, and the size past which they are swept next.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    by_name: ByName,
    sweep_at: usize,
}

/// Every backend's counters of one balancer, by pool and backend name. Clones share them.
#[derive(Clone, Debug, Default)]
pub(crate) struct BackendCounters(Arc<RwLock<Counters>>);

impl BackendCounters {
    /// The counters of backend `backend` of pool `pool`: the ones a backend of the same names
    /// had, or new ones. Adding one may sweep the map: `forgotten` hears the names of the
    /// backends whose counters went.
    pub(super) fn of(
        &self,
        pool: &Arc<str>,
        backend: &Arc<str>,
        forgotten: impl FnMut(&str, &str),
    ) -> Arc<Counts> {
        let key = (pool.clone(), backend.clone());
        if let Some(counts) = self.read().by_name.get(&key) {
            return counts.clone();
        }
        let mut counters = self.0.write().unwrap_or_else(|e| e.into_inner());
        if counters.by_name.len() >= counters.sweep_at {
            counters.sweep(forgotten);
        }
        counters.by_name.entry(key).or_default().clone()
    }

    fn read(&self) -> RwLockReadGuard<'_, Counters> {
        // Writers only insert or remove whole entries: poison is harmless.
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The family `family` of these counters, to register.
    pub(super) fn series(&self, family: Family) -> Series {
        Series {
            counters: self.clone(),
            family,
        }
    }
}

impl Counters {
    /// Forgets the counters no backend holds any more (the map's own reference is the only
    /// one left), telling `forgotten` their names; the next sweep comes when the map has
    /// doubled.
    fn sweep(&mut self, mut forgotten: impl FnMut(&str, &str)) {
        self.by_name.retain(|(pool, backend), counts| {
            let held = Arc::strong_count(counts) > 1;
            if !held {
                forgotten(pool, backend);
            }
            held
        });
        self.sweep_at = (self.by_name.len() * 2).max(MIN_SWEEP);
    }
}

/// A family of the per-backend counters.
#[derive(Clone, Copy, Debug)]
pub(super) enum Family {
    Requests,
    Probes,
    Transitions,
    Ejections,
    Outliers,
}

/// One family's view of the counters, as the registry encodes it.
#[derive(Debug)]
pub(super) struct Series {
    counters: BackendCounters,
    family: Family,
}

/// Writes one counter sample labelled `labels`.
fn sample(
    encoder: &mut MetricEncoder,
    labels: &impl prometheus_client::encoding::EncodeLabelSet,
    value: &AtomicU64,
) -> Result<(), std::fmt::Error> {
    encoder
        .encode_family(labels)?
        .encode_counter::<NoLabelSet, _, u64>(&value.load(Ordering::Relaxed), None)
}

impl EncodeMetric for Series {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for ((pool, backend), counts) in self.counters.read().by_name.iter() {
            let e = &mut encoder;
            match self.family {
                Family::Requests => {
                    for (class, value) in CLASSES.into_iter().zip(&counts.requests) {
                        let (pool, backend) = (pool.clone(), backend.clone());
                        sample(
                            e,
                            &RequestLabels {
                                pool,
                                backend,
                                class,
                            },
                            value,
                        )?;
                    }
                }
                Family::Probes => {
                    let shown = if counts.shown(DRAIN_SHOWN) { 3 } else { 2 };
                    for (result, value) in RESULTS.into_iter().zip(&counts.probes).take(shown) {
                        let (pool, backend) = (pool.clone(), backend.clone());
                        sample(
                            e,
                            &ProbeLabels {
                                pool,
                                backend,
                                result,
                            },
                            value,
                        )?;
                    }
                }
                Family::Transitions => {
                    for (to, value) in ["up", "down"].into_iter().zip(&counts.transitions) {
                        let (pool, backend) = (pool.clone(), backend.clone());
                        sample(e, &TransitionLabels { pool, backend, to }, value)?;
                    }
                }
                Family::Ejections => {
                    let (pool, backend) = (pool.clone(), backend.clone());
                    sample(e, &BackendLabels { pool, backend }, &counts.ejections)?;
                }
                Family::Outliers => {
                    for (slot, detector) in DETECTORS.into_iter().enumerate() {
                        if counts.shown(DRAIN_SHOWN << (slot + 1)) {
                            let (pool, backend) = (pool.clone(), backend.clone());
                            let labels = OutlierLabels {
                                pool,
                                backend,
                                detector,
                            };
                            sample(e, &labels, &counts.outliers[slot])?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }

    fn is_empty(&self) -> bool {
        let map = &self.counters.read().by_name;
        match self.family {
            // Like a family whose series appear on first use: no descriptor without one.
            Family::Outliers => !map.values().any(|c| c.shown(!DRAIN_SHOWN)),
            _ => map.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::{prometheus_text, text};
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family as Labelled;
    use prometheus_client::registry::Registry;

    use super::*;

    /// Both expositions of `registry`, each with its lines sorted (a family's series come in
    /// no particular order).
    fn expositions(registry: &Registry) -> (Vec<String>, Vec<String>) {
        let sorted = |text: String| {
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            lines.sort();
            lines
        };
        let (mut open, mut classic) = (String::new(), String::new());
        text::encode(&mut open, registry).expect("encoded");
        prometheus_text::encode(&mut classic, registry).expect("encoded");
        (sorted(open), sorted(classic))
    }

    /// The blocks' families show what prometheus-client's families of the same series show,
    /// in both formats: names, help, types, labels, values, and the series that appear on
    /// first use.
    #[test]
    fn the_blocks_expose_what_labelled_families_exposed() {
        let names: Vec<(Arc<str>, Arc<str>)> = [("web", "a"), ("web", "b"), ("api", "a")]
            .into_iter()
            .map(|(p, b)| (p.into(), b.into()))
            .collect();
        let blocks = BackendCounters::default();
        let requests = Labelled::<RequestLabels, Counter>::default();
        let probes = Labelled::<ProbeLabels, Counter>::default();
        let transitions = Labelled::<TransitionLabels, Counter>::default();
        let ejections = Labelled::<BackendLabels, Counter>::default();
        let outliers = Labelled::<OutlierLabels, Counter>::default();
        for (n, (pool, backend)) in names.iter().enumerate() {
            let counts = blocks.of(pool, backend, |_, _| {});
            let (pool, backend) = (pool.clone(), backend.clone());
            for (i, class) in CLASSES.into_iter().enumerate() {
                let labels = RequestLabels {
                    pool: pool.clone(),
                    backend: backend.clone(),
                    class,
                };
                requests.get_or_create(&labels).inc_by((n * 10 + i) as u64);
                counts.requests[i].fetch_add((n * 10 + i) as u64, Ordering::Relaxed);
            }
            for (i, result) in RESULTS.into_iter().enumerate().take(2) {
                let labels = ProbeLabels {
                    pool: pool.clone(),
                    backend: backend.clone(),
                    result,
                };
                probes.get_or_create(&labels).inc_by((n + i) as u64);
                counts.probes[i].fetch_add((n + i) as u64, Ordering::Relaxed);
            }
            for (i, to) in ["up", "down"].into_iter().enumerate() {
                let labels = TransitionLabels {
                    pool: pool.clone(),
                    backend: backend.clone(),
                    to,
                };
                transitions.get_or_create(&labels).inc_by((n * i) as u64);
                counts.transitions[i].fetch_add((n * i) as u64, Ordering::Relaxed);
            }
            let labels = BackendLabels {
                pool: pool.clone(),
                backend: backend.clone(),
            };
            ejections.get_or_create(&labels).inc_by(n as u64);
            counts.ejections.fetch_add(n as u64, Ordering::Relaxed);
            if n == 1 {
                let labels = ProbeLabels {
                    pool: pool.clone(),
                    backend: backend.clone(),
                    result: "drain",
                };
                probes.get_or_create(&labels).inc();
                counts.drain();
                let labels = OutlierLabels {
                    pool: pool.clone(),
                    backend: backend.clone(),
                    detector: "success_rate",
                };
                outliers.get_or_create(&labels).inc();
                counts.outlier(1);
            }
        }
        let mut before = Registry::default();
        before.register("capataz_requests", "requests", requests);
        before.register("capataz_probes", "probes", probes);
        before.register("capataz_transitions", "transitions", transitions);
        before.register("capataz_ejections", "ejections", ejections);
        before.register("capataz_outlier_ejections", "outliers", outliers);
        let mut after = Registry::default();
        after.register(
            "capataz_requests",
            "requests",
            blocks.series(Family::Requests),
        );
        after.register("capataz_probes", "probes", blocks.series(Family::Probes));
        let transitions = blocks.series(Family::Transitions);
        after.register("capataz_transitions", "transitions", transitions);
        after.register(
            "capataz_ejections",
            "ejections",
            blocks.series(Family::Ejections),
        );
        let outliers = blocks.series(Family::Outliers);
        after.register("capataz_outlier_ejections", "outliers", outliers);
        let want = expositions(&before);
        assert!(want.0.len() > 40, "{:?}", want.0);
        assert_eq!(expositions(&after), want);

        // Without any outlier ejection, no outlier family at all (as an empty family).
        let quiet = BackendCounters::default();
        quiet.of(&names[0].0, &names[0].1, |_, _| {});
        let mut registry = Registry::default();
        registry.register(
            "capataz_outlier_ejections",
            "outliers",
            quiet.series(Family::Outliers),
        );
        let mut open = String::new();
        text::encode(&mut open, &registry).expect("encoded");
        assert_eq!(open, "# EOF\n");
    }

    #[test]
    fn a_backend_of_the_same_names_gets_the_same_block() {
        let blocks = BackendCounters::default();
        let (pool, a): (Arc<str>, Arc<str>) = ("web".into(), "a".into());
        let first = blocks.of(&pool, &a, |_, _| {});
        let again = blocks.of(&"web".into(), &"a".into(), |_, _| {});
        assert!(Arc::ptr_eq(&first, &again));
        assert!(!Arc::ptr_eq(
            &first,
            &blocks.of(&pool, &"b".into(), |_, _| {})
        ));
    }
}
