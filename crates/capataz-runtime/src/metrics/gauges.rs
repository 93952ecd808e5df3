//! The gauges of a scrape, read from the live pools as it starts.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet};
use prometheus_client::metrics::MetricType;

use crate::config::CheckKind;
use crate::health::PoolRt;

/// The gauges of one scrape, read from the live pools as it starts, in pool order.
#[derive(Debug)]
pub(super) struct LiveGauges {
    backends: Vec<BackendGauges>,
    pools: Vec<PoolGauges>,
}

/// The labels of a backend's gauges; the names are shared with the runtime, not copied.
#[derive(Debug, EncodeLabelSet)]
struct LiveBackendLabels {
    pool: Arc<str>,
    backend: Arc<str>,
}

#[derive(Debug, EncodeLabelSet)]
struct LivePoolLabels {
    pool: Arc<str>,
}

#[derive(Debug)]
struct BackendGauges {
    labels: LiveBackendLabels,
    up: bool,
    in_flight: usize,
    weight_tenths: u32,
    probe_interval: f64,
    /// Seconds of load-shedding relief left, in a pool with load shedding.
    shedding: Option<f64>,
    /// Latency windows judged slow in a row, in a pool with the latency-outlier detector.
    slow_windows: Option<u32>,
    /// Its limit now, when it has one (`balance::Limits`).
    limit: Option<usize>,
}

#[derive(Debug)]
struct PoolGauges {
    labels: LivePoolLabels,
    healthy: usize,
    all_down: bool,
    on_backups: bool,
    /// Seconds since the pool's source last answered (`None`: a static pool, or no answer
    /// yet).
    membership_age: Option<f64>,
    /// Requests in its queue, in a pool with limits.
    queued: Option<usize>,
}

impl LiveGauges {
    /// How many backends the scrape covers.
    pub(super) fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// Reads every gauge: one lock per pool for eligibility, atomics for the rest.
    pub(super) fn read(pools: &[Arc<PoolRt>]) -> LiveGauges {
        let count = pools.iter().map(|p| p.backends.len()).sum();
        let mut backends = Vec::with_capacity(count);
        let mut pool_gauges = Vec::with_capacity(pools.len());
        for pool in pools {
            let (snapshot, eligible) = pool.eligibility_beside_snapshot();
            let probed = pool.config.active.kind != CheckKind::None;
            let intervals = crate::health::probe_intervals(&pool.config);
            let cadences = pool.cadences();
            let passive = &pool.config.passive;
            let shedding_on = passive.enabled && passive.load_shedding.is_some();
            let latency_on = passive.enabled && passive.latency_outliers.is_some();
            let gray = if shedding_on || latency_on {
                pool.gray_state()
            } else {
                Vec::new()
            };
            for (i, ((backend, &(up, weight_tenths)), &cadence)) in pool
                .backends
                .iter()
                .zip(&eligible)
                .zip(&cadences)
                .enumerate()
            {
                let (shed_left, slow) = gray.get(i).copied().unwrap_or_default();
                let tracks = pool
                    .config
                    .backends
                    .get(i)
                    .is_some_and(|b| b.track.is_some());
                backends.push(BackendGauges {
                    labels: LiveBackendLabels {
                        pool: pool.name.clone(),
                        backend: backend.name.clone(),
                    },
                    up,
                    in_flight: backend.in_flight.load(Ordering::Relaxed),
                    weight_tenths,
                    probe_interval: if probed && !tracks {
                        intervals.of(cadence).as_secs_f64()
                    } else {
                        0.0
                    },
                    shedding: shedding_on.then_some(shed_left.as_secs_f64()),
                    slow_windows: latency_on.then_some(slow),
                    limit: pool
                        .limits
                        .as_ref()
                        .and_then(|limits| limits.limit_weighing(i, weight_tenths, backend.weight)),
                });
            }
            pool_gauges.push(PoolGauges {
                labels: LivePoolLabels {
                    pool: pool.name.clone(),
                },
                healthy: eligible.iter().filter(|(up, _)| *up).count(),
                all_down: snapshot.all_down,
                on_backups: snapshot.on_backups.is_some(),
                membership_age: pool
                    .config
                    .source
                    .is_dynamic()
                    .then(|| pool.source_record.state().confirmed)
                    .flatten()
                    .map(|t| pool.clock().now().saturating_sub(t).as_secs_f64()),
                queued: pool.limits.as_ref().map(|limits| limits.queued()),
            });
        }
        LiveGauges {
            backends,
            pools: pool_gauges,
        }
    }
}

impl Collector for LiveGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let backends = &self.backends;
        encode_gauges(
            &mut encoder,
            "capataz_backend_up",
            "1 when the backend may get new requests (health and overrides), else 0.",
            backends.iter().map(|b| (&b.labels, i64::from(b.up))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_in_flight",
            "Requests sent to the backend whose response has not been read to the end.",
            backends.iter().map(|b| (&b.labels, count(b.in_flight))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_effective_weight",
            "The backend's weight now (below the configured one during slow start).",
            backends
                .iter()
                .map(|b| (&b.labels, f64::from(b.weight_tenths) / 10.0)),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_probe_interval_seconds",
            "The time between the backend's probes now (interval, fast_interval or down_interval by its state; 0 without active checks or with track).",
            backends.iter().map(|b| (&b.labels, b.probe_interval)),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_shedding_seconds",
            "Seconds of load-shedding relief the backend has left (0 when it sheds nothing); only pools with load_shedding.",
            backends
                .iter()
                .filter_map(|b| b.shedding.map(|left| (&b.labels, left))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_slow_windows",
            "Latency windows in a row the backend was judged slow in (windows of them eject); only pools with latency_outliers.",
            backends
                .iter()
                .filter_map(|b| b.slow_windows.map(|n| (&b.labels, i64::from(n)))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_pool_healthy_backends",
            "Backends of the pool that may get new requests.",
            self.pools.iter().map(|p| (&p.labels, count(p.healthy))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_pool_all_down",
            "1 when the pool has no eligible backend and its all-down policy applies, else 0.",
            self.pools
                .iter()
                .map(|p| (&p.labels, i64::from(p.all_down))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_pool_on_backups",
            "1 while no primary is in rotation and the pool's backups serve, else 0.",
            self.pools
                .iter()
                .map(|p| (&p.labels, i64::from(p.on_backups))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_limit",
            "The most requests the backend may hold at once now (max_connections or max_requests, scaled by its weight during slow start); only backends with a limit.",
            backends
                .iter()
                .filter_map(|b| b.limit.map(|limit| (&b.labels, count(limit)))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_pool_queue_length",
            "Requests waiting in the pool's queue for a backend below its limit; only pools with limits.",
            self.pools
                .iter()
                .filter_map(|p| p.queued.map(|n| (&p.labels, count(n)))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_pool_membership_age_seconds",
            "Seconds since the pool's backend source (DNS or etcd) last answered; only pools with a source, once it answered.",
            self.pools
                .iter()
                .filter_map(|p| p.membership_age.map(|age| (&p.labels, age))),
        )
    }
}

/// A count as a gauge's value, at most `i64::MAX`: prometheus-client refuses a `usize` above
/// it with an error that fails the whole scrape, so one wrong count would hide every metric.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Writes one gauge family: its descriptor, then one sample per `(labels, value)`. (`help`
/// ends with a period, as `Registry::register` would add one.)
fn encode_gauges<'a, L, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (&'a L, V)>,
) -> Result<(), fmt::Error>
where
    L: EncodeLabelSet + 'a,
    V: EncodeGaugeValue,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        family.encode_family(labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_past_i64_max_is_written_as_i64_max_not_an_error() {
        let mut out = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        #[derive(Debug)]
        struct Huge;
        impl Collector for Huge {
            fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
                let labels: Vec<(String, String)> = Vec::new();
                encode_gauges(
                    &mut encoder,
                    "huge",
                    "A count.",
                    [(&labels, count(usize::MAX))].into_iter(),
                )
            }
        }
        registry.register_collector(Box::new(Huge));
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encoded");
        assert!(out.contains(&format!("huge {}", i64::MAX)), "{out}");
    }
}
