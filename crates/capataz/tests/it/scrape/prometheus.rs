//! A real Prometheus server (Debian `prometheus`) scraping a balancer's `/metrics` over
//! loopback: it negotiates OpenMetrics, scrapes it without error, keeps its metadata (types
//! and units), and every metric added for the operator's edition answers a query.

use std::time::Duration;

use super::busy;
use crate::support::prometheus::Prometheus;
use crate::support::DEADLINE;

/// A query per metric of the Prometheus exposition, each of which must return data.
const QUERIES: [&str; 16] = [
    "capataz_client_requests_total{answered_by=\"backend\"}",
    "capataz_client_requests_total{answered_by=\"capataz\"}",
    "capataz_client_request_duration_seconds_bucket",
    "capataz_client_request_duration_seconds_count",
    "capataz_client_connections_accepted_total",
    "capataz_client_connections_open",
    "capataz_client_received_bytes_total",
    "capataz_client_sent_bytes_total",
    "capataz_build_info",
    "capataz_config_reloads_total{result=\"failure\"}",
    "capataz_config_last_reload_success_timestamp_seconds",
    "capataz_alerts_failed_total > 0",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds / process_max_fds",
    "process_start_time_seconds",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_open_metrics_and_every_new_metric_answers_a_query() {
    let busy = busy().await;
    let prometheus = Prometheus::start(busy.admin, Duration::from_millis(200)).await;
    // Each query may need a scrape or two after the server started.
    let end = tokio::time::Instant::now() + DEADLINE;
    for query in QUERIES {
        loop {
            if !prometheus.query(query).await.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "no data for {query} within {DEADLINE:?}\n{}",
                prometheus.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let targets = prometheus.api("/api/v1/targets").await;
    let target = &targets["activeTargets"][0];
    assert_eq!(target["health"], "up", "{target}");
    assert_eq!(target["lastError"], "", "{target}");

    // Units come only with OpenMetrics: Prometheus read that format.
    let metadata = prometheus
        .api("/api/v1/metadata?metric=capataz_client_received_bytes")
        .await;
    let entry = &metadata["capataz_client_received_bytes"][0];
    assert_eq!(entry["type"], "counter", "{metadata}");
    assert_eq!(entry["unit"], "bytes", "{metadata}");
    let metadata = prometheus
        .api("/api/v1/metadata?metric=capataz_client_request_duration_seconds")
        .await;
    let entry = &metadata["capataz_client_request_duration_seconds"][0];
    assert_eq!(entry["type"], "histogram", "{metadata}");
    assert_eq!(entry["unit"], "seconds", "{metadata}");
    // The scraped values are capataz's: four GETs relayed on route /api/.
    let relayed = prometheus
        .query(
            "capataz_client_requests_total{route=\"/api/\",method=\"GET\",class=\"2xx\",\
             answered_by=\"backend\"}",
        )
        .await;
    assert_eq!(relayed.len(), 1, "{relayed:?}");
    assert_eq!(relayed[0]["value"][1], "4", "{relayed:?}");
}
