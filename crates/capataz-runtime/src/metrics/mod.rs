//! The `GET /metrics` exposition of one balancer: the counters and histograms its runtime
//! updates (registered into its own [`Registry`] by [`Families::register`]), the balancer's own
//! (build, config reloads), then gauges read from the live pools at scrape time, the alert
//! hooks' counters and the process's figures (`process.rs`, from `/proc` on Linux).
//!
//! Two formats, chosen by the scraper's `Accept` ([`Format::negotiate`]): OpenMetrics when it
//! asks for it, as Prometheus does, and the classic Prometheus text format (0.0.4) otherwise,
//! which `promtool check metrics`, older scrapers and `curl` read. They differ in what the
//! classic parsers need: there a counter's `# HELP` and `# TYPE` carry its sample name (with
//! `_total`), and there is no `# UNIT` nor `# EOF`. prometheus-client writes both from the same
//! registries.
//!
//! Registered, not global: every `Balancer` (the binary's `server` module) owns one [`Metrics`],
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
//! - An OpenMetrics scrape is one exposition ending in exactly one `# EOF`; a classic one has
//!   no `# EOF`, and names every family by its samples' name.
//! - Names follow Prometheus conventions: `capataz_` prefix (`process_` for the process's),
//!   snake case, `_total` on counters, seconds and bytes as units. Labels are `pool`,
//!   `backend`, `class`, `result`, `to`, `hook`, `listener`, `route`, `method`,
//!   `answered_by`, `version`.
//! - Series of a removed backend keep their last value until its counters are swept
//!   (`instruments::counters`); its gauges disappear at once.

mod gauges;
mod process;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use prometheus_client::encoding::{prometheus_text, text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::alerts::AlertStats;
use crate::fleet::FleetCounters;
use crate::health::PoolRt;
pub use crate::instruments::{Families, HistogramScope};
use gauges::LiveGauges;
use process::ProcessStats;

/// The `Content-Type` of the OpenMetrics exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of the classic Prometheus text exposition.
pub(crate) const CLASSIC_CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A first guess at the exposition's length per backend, before a scrape has measured it: 14
/// lines of about 65 bytes with per-pool histograms, and room for longer names.
const GUESS_PER_BACKEND: usize = 1200;

/// The text format of a scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Classic,
}

impl Format {
    /// The format a scraper asks for with `accept` (its `Accept` header, if any): OpenMetrics
    /// when an `application/openmetrics-text` range (version 1.0.0, 0.0.1 or none) has a
    /// quality above zero and at least that of every range the classic format matches
    /// (`text/plain`, `text/*`, `*/*`); the classic format otherwise, and when the header is
    /// absent or unreadable.
    pub fn negotiate(accept: Option<&[u8]>) -> Format {
        let Some(accept) = accept.and_then(|a| std::str::from_utf8(a).ok()) else {
            return Format::Classic;
        };
        let mut open_metrics = 0u16;
        let mut classic = 0u16;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let mut quality = 1000;
            let mut version = None;
            for parameter in parts {
                let Some((key, value)) = parameter.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                match key.trim().to_ascii_lowercase().as_str() {
                    "q" => quality = parse_quality(value),
                    "version" => version = Some(value),
                    _ => {}
                }
            }
            if media.eq_ignore_ascii_case("application/openmetrics-text") {
                if matches!(version, None | Some("1.0.0") | Some("0.0.1")) {
                    open_metrics = open_metrics.max(quality);
                }
            } else if media.eq_ignore_ascii_case("text/plain")
                || media.eq_ignore_ascii_case("text/*")
                || media == "*/*"
            {
                classic = classic.max(quality);
            }
        }
        if open_metrics > 0 && open_metrics >= classic {
            Format::OpenMetrics
        } else {
            Format::Classic
        }
    }

    /// The `Content-Type` of a scrape in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => CONTENT_TYPE,
            Format::Classic => CLASSIC_CONTENT_TYPE,
        }
    }
}

/// An RFC 9110 quality value (`0` to `1` with at most three decimals) in thousandths; anything
/// else counts as 0, so a malformed range is never preferred.
fn parse_quality(value: &str) -> u16 {
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    let thousandths = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u16, |n, digit| n * 10 + u16::from(digit - b'0'));
    match whole {
        "0" => thousandths,
        "1" if thousandths == 0 => 1000,
        _ => 0,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    hook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// One balancer's metrics: the registry its families are registered in, and what a scrape
/// reads.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    families: Families,
    reloads_ok: Counter,
    reloads_failed: Counter,
    last_reload: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The length of the last exposition, so the next one is written into a buffer allocated
    /// once.
    last_length: AtomicUsize,
    /// Shared probing's counters, while `[fleet]` is on.
    fleet: std::sync::Mutex<Option<Arc<FleetCounters>>>,
}

impl Metrics {
    /// A registry with every family of the runtime registered, latency histograms labelled as
    /// `scope` says. The configuration it starts with counts as the last one loaded.
    pub fn new(scope: HistogramScope) -> Metrics {
        let mut registry = Registry::default();
        let families = Families::register(&mut registry, scope);
        let build = Family::<VersionLabels, Gauge>::default();
        build
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "capataz_build_info",
            "Always 1, labelled with the version of capataz running",
            build,
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        let reloads_ok = reloads.get_or_create_owned(&ResultLabels { result: "success" });
        let reloads_failed = reloads.get_or_create_owned(&ResultLabels { result: "failure" });
        registry.register(
            "capataz_config_reloads",
            "Configuration reloads asked for (SIGHUP, POST /reload), by result",
            reloads,
        );
        let last_reload = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        last_reload.set(unix_seconds(SystemTime::now()));
        registry.register_with_unit(
            "capataz_config_last_reload_success_timestamp",
            "When the configuration in force was loaded (at start, or by the last successful \
             reload), in seconds since the epoch",
            Unit::Seconds,
            last_reload.clone(),
        );
        Metrics {
            registry,
            families,
            reloads_ok,
            reloads_failed,
            last_reload,
            last_length: AtomicUsize::new(0),
            fleet: std::sync::Mutex::new(None),
        }
    }

    /// Shows shared probing's gauges and counter from `counters` (`None`: `[fleet]` is off,
    /// none are shown).
    pub(crate) fn set_fleet(&self, counters: Option<Arc<FleetCounters>>) {
        *self.fleet.lock().unwrap_or_else(|e| e.into_inner()) = counters;
    }

    /// Counts a reload: applied (`true`, also stamping the time) or refused.
    pub fn reloaded(&self, applied: bool) {
        if applied {
            self.reloads_ok.inc();
            self.last_reload.set(unix_seconds(SystemTime::now()));
        } else {
            self.reloads_failed.inc();
        }
    }

    /// The families pools take their handles from.
    pub fn families(&self) -> &Families {
        &self.families
    }

    /// The metrics as one text exposition in `format`: the counters and histograms, then
    /// gauges read now from `pools` (and the alert counters, when hooks run), then the
    /// process's figures.
    pub fn render(
        &self,
        pools: &[Arc<PoolRt>],
        alerts: Option<&AlertStats>,
        format: Format,
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
        let mut live = Registry::default();
        live.register_collector(Box::new(gauges));
        if let Some(stats) = alerts {
            register_alerts(&mut live, stats);
        }
        let fleet = self.fleet.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(counters) = fleet {
            register_fleet(&mut live, &counters);
        }
        live.register_collector(Box::new(ProcessStats::read()));
        match format {
            Format::OpenMetrics => {
                text::encode_registry(&mut out, &self.registry)?;
                text::encode_registry(&mut out, &live)?;
                text::encode_eof(&mut out)?;
            }
            Format::Classic => {
                prometheus_text::encode(&mut out, &self.registry)?;
                prometheus_text::encode(&mut out, &live)?;
            }
        }
        self.last_length.store(out.len(), Ordering::Relaxed);
        Ok(out)
    }
}

/// Seconds since the epoch (0 for a clock set before it).
fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

fn register_fleet(registry: &mut Registry, counters: &FleetCounters) {
    let gauge = |value: usize| {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        gauge
    };
    registry.register(
        "capataz_fleet_members",
        "Live members of this instance's fleet group, itself included (0 while not joined or cut off)",
        gauge(counters.members.load(Ordering::Relaxed)),
    );
    registry.register(
        "capataz_fleet_owned_backends",
        "Backends this instance probes (all of them while cut off from etcd)",
        gauge(counters.owned.load(Ordering::Relaxed)),
    );
    registry.register(
        "capataz_fleet_cut_off",
        "1 while this instance cannot reach etcd for longer than its lease and probes every backend itself, else 0",
        gauge(usize::from(counters.cut_off.load(Ordering::Relaxed))),
    );
    let published = Counter::<u64>::default();
    published.inc_by(counters.published.load(Ordering::Relaxed));
    registry.register(
        "capataz_fleet_published",
        "Active verdicts this instance published to etcd for backends it owns",
        published,
    );
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
        let _idle = idle.families().pool("p").backend(&"a".into());
        busy.families()
            .pool("p")
            .backend(&"a".into())
            .answered(200, Duration::from_millis(1));
        let line = "capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"}";
        let busy = busy.render(&[], None, Format::OpenMetrics).unwrap();
        let idle = idle.render(&[], None, Format::OpenMetrics).unwrap();
        assert!(busy.contains(&format!("{line} 1\n")), "{busy}");
        assert!(idle.contains(&format!("{line} 0\n")), "{idle}");
        assert!(idle.ends_with("# EOF\n"));
    }

    #[test]
    fn negotiation_gives_open_metrics_only_to_who_asks_for_it() {
        let negotiate = |accept: &str| Format::negotiate(Some(accept.as_bytes()));
        // Prometheus 2.x.
        assert_eq!(
            negotiate(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                 version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            ),
            Format::OpenMetrics
        );
        assert_eq!(
            negotiate("application/openmetrics-text"),
            Format::OpenMetrics
        );
        assert_eq!(
            negotiate("Application/OpenMetrics-Text; Version=\"1.0.0\"; q=1.0"),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(None), Format::Classic);
        assert_eq!(Format::negotiate(Some(b"\xff\xfe")), Format::Classic);
        for classic in [
            "*/*",
            "text/plain",
            "text/plain;version=0.0.4",
            "",
            "application/json",
            // A version capataz does not write, a refusal, a classic preference.
            "application/openmetrics-text;version=2.0.0",
            "application/openmetrics-text;q=0",
            "application/openmetrics-text;q=0.4,text/plain;q=0.5",
            // Malformed qualities count as zero.
            "application/openmetrics-text;q=1.5",
            "application/openmetrics-text;q=0.1234",
            "application/openmetrics-text;q=-1",
        ] {
            assert_eq!(negotiate(classic), Format::Classic, "{classic:?}");
        }
        assert_eq!(
            negotiate("text/plain;q=0.5, application/openmetrics-text;q=0.5"),
            Format::OpenMetrics,
            "a tie goes to OpenMetrics"
        );
    }

    proptest::proptest! {
        /// Whatever a scraper sends as `Accept`, negotiation answers with one of the two
        /// formats, and never panics.
        #[test]
        fn any_accept_header_gets_a_format(accept in proptest::collection::vec(
            proptest::prelude::any::<u8>(), 0..200,
        )) {
            let _ = Format::negotiate(Some(&accept));
        }

        #[test]
        fn any_quality_text_is_read_without_panic(text in "[0-9.q=;, ]{0,12}") {
            proptest::prop_assert!(parse_quality(&text) <= 1000);
        }
    }

    #[test]
    fn quality_values_are_read_in_thousandths() {
        assert_eq!(parse_quality("1"), 1000);
        assert_eq!(parse_quality("1.000"), 1000);
        assert_eq!(parse_quality("0.5"), 500);
        assert_eq!(parse_quality("0.001"), 1);
        assert_eq!(parse_quality("0"), 0);
        for bad in ["1.001", "2", "", ".5", "0.x", "0.5000", "+0.5"] {
            assert_eq!(parse_quality(bad), 0, "{bad:?}");
        }
    }

    #[test]
    fn a_classic_scrape_names_counters_by_their_samples_and_has_no_eof() {
        let metrics = Metrics::new(HistogramScope::Pool);
        metrics
            .families()
            .pool("p")
            .backend(&"a".into())
            .answered(200, Duration::from_millis(1));
        let page = metrics.render(&[], None, Format::Classic).unwrap();
        assert!(
            page.contains("# TYPE capataz_requests_total counter\n"),
            "{page}"
        );
        assert!(page.contains("# HELP capataz_requests_total "), "{page}");
        assert!(!page.contains("# EOF"), "{page}");
        assert!(!page.contains("# UNIT"), "{page}");
        let open = metrics.render(&[], None, Format::OpenMetrics).unwrap();
        assert!(open.contains("# TYPE capataz_requests counter\n"), "{open}");
        assert!(open.contains("# UNIT capataz_upstream_response_seconds seconds\n"));
    }

    #[test]
    fn reloads_are_counted_and_a_success_is_stamped() {
        let metrics = Metrics::new(HistogramScope::Pool);
        metrics.reloaded(false);
        metrics.reloaded(true);
        metrics.reloaded(true);
        let page = metrics.render(&[], None, Format::Classic).unwrap();
        assert!(
            page.contains("capataz_config_reloads_total{result=\"success\"} 2\n"),
            "{page}"
        );
        assert!(
            page.contains("capataz_config_reloads_total{result=\"failure\"} 1\n"),
            "{page}"
        );
        assert!(page.contains("capataz_build_info{version=\""), "{page}");
        let stamp = page
            .lines()
            .find_map(|l| l.strip_prefix("capataz_config_last_reload_success_timestamp_seconds "))
            .and_then(|v| v.parse::<f64>().ok())
            .expect("the timestamp");
        assert!(stamp > 1.7e9, "{stamp}");
    }
}
