//! The `GET /metrics` exposition of one balancer: the counters and histograms its runtime
//! updates (registered into its own [`Registry`] by [`Families::register`]), then gauges read
//! from the live pools at scrape time, then the alert hooks' counters.
//!
//! Registered, not global: every [`Balancer`](crate::server::Balancer) owns one [`Metrics`],
//! so two balancers in one process never share a counter, and a scrape shows only the pools of
//! the balancer that answers it.
//!
//! Everything that describes the present (is a backend eligible, how many requests are in
//! flight, its weight, is the pool all down) is a gauge read from the live pools at scrape
//! time, so it costs nothing between scrapes and cannot drift from the state it reports. So
//! are the alert hooks' counters, which `alerts` keeps as plain atomics. A scrape reads those
//! gauges with one short lock per pool and writes them straight out, in pool order, without
//! building a label map; the exposition goes into one buffer sized from the last one.
//!
//! This module sits at the top of the crate: it reads `health` and `alerts`, and only the
//! admin API and the server use it. The handles the runtime updates live in `instruments`,
//! below `health`, so nothing below reads back up here.
//!
//! Invariants:
//! - A scrape is one OpenMetrics text exposition ending in exactly one `# EOF`.
//! - Names follow Prometheus conventions: `capataz_` prefix, snake case, `_total` on counters,
//!   seconds as the time unit. Labels are `pool`, `backend`, `class`, `result`, `to`, `hook`.
//! - Series of a backend removed by a reload keep their last value; its gauges disappear.

mod gauges;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::alerts::AlertStats;
use crate::health::PoolRt;
pub use crate::instruments::{Families, HistogramScope};
use gauges::LiveGauges;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A first guess at the exposition's length per backend, before a scrape has measured it: 14
/// lines of about 65 bytes with per-pool histograms, and room for longer names.
const GUESS_PER_BACKEND: usize = 1200;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    hook: &'static str,
}

/// One balancer's metrics: the registry its families are registered in, and what a scrape
/// reads.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    families: Families,
    /// The length of the last exposition, so the next one is written into a buffer allocated
    /// once.
    last_length: AtomicUsize,
}

impl Metrics {
    /// A registry with every family of the runtime registered, latency histograms labelled as
    /// `scope` says.
    pub fn new(scope: HistogramScope) -> Metrics {
        let mut registry = Registry::default();
        let families = Families::register(&mut registry, scope);
        Metrics {
            registry,
            families,
            last_length: AtomicUsize::new(0),
        }
    }

    /// The families pools take their handles from.
    pub fn families(&self) -> &Families {
        &self.families
    }

    /// The metrics as one OpenMetrics text exposition: the counters and histograms, then gauges
    /// read now from `pools` (and the alert counters, when hooks run).
    pub fn render(
        &self,
        pools: &[Arc<PoolRt>],
        alerts: Option<&AlertStats>,
    ) -> Result<String, fmt::Error> {
        let gauges = LiveGauges::read(pools);
        // The last exposition's length plus an eighth covers backends added since and growing
        // counter values; before the first one, a guess from the backend count.
        let last = self.last_length.load(Ordering::Relaxed);
        let capacity = if last > 0 {
            last + last / 8
        } else {
            16 * 1024 + gauges.backend_count() * GUESS_PER_BACKEND
        };
        let mut out = String::with_capacity(capacity);
        text::encode_registry(&mut out, &self.registry)?;
        let mut live = Registry::default();
        live.register_collector(Box::new(gauges));
        if let Some(stats) = alerts {
            register_alerts(&mut live, stats);
        }
        text::encode_registry(&mut out, &live)?;
        text::encode_eof(&mut out)?;
        self.last_length.store(out.len(), Ordering::Relaxed);
        Ok(out)
    }
}

fn register_alerts(registry: &mut Registry, stats: &AlertStats) {
    let delivered = Family::<HookLabels, Counter>::default();
    let failed = Family::<HookLabels, Counter>::default();
    let dropped = Family::<HookLabels, Counter>::default();
    let suppressed = Family::<HookLabels, Counter>::default();
    for (hook, counts) in stats.hooks() {
        let labels = HookLabels { hook };
        delivered.get_or_create(&labels).inc_by(counts.delivered());
        failed.get_or_create(&labels).inc_by(counts.failed());
        dropped.get_or_create(&labels).inc_by(counts.dropped());
        suppressed
            .get_or_create(&labels)
            .inc_by(counts.suppressed());
    }
    registry.register(
        "capataz_alerts_delivered",
        "Alerts a hook accepted",
        delivered,
    );
    registry.register(
        "capataz_alerts_failed",
        "Alerts a hook did not accept after its retries",
        failed,
    );
    registry.register(
        "capataz_alerts_dropped",
        "Alerts lost before delivery (a full queue, or a lagging dispatcher)",
        dropped,
    );
    // Per hook, like the stats: debouncing counts a folded event once for each hook it
    // would have reached, so an unlabelled sum would count it several times.
    registry.register(
        "capataz_alerts_suppressed",
        "Events folded away by debouncing instead of alerting on their own",
        suppressed,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_scrape_shows_only_its_own_registry() {
        let busy = Metrics::new(HistogramScope::Pool);
        let idle = Metrics::new(HistogramScope::Pool);
        let _idle = idle.families().pool("p").backend("a");
        busy.families()
            .pool("p")
            .backend("a")
            .answered(200, Duration::from_millis(1));
        let line = "capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"}";
        let busy = busy.render(&[], None).unwrap();
        let idle = idle.render(&[], None).unwrap();
        assert!(busy.contains(&format!("{line} 1\n")), "{busy}");
        assert!(idle.contains(&format!("{line} 0\n")), "{idle}");
        assert!(idle.ends_with("# EOF\n"));
    }
}
