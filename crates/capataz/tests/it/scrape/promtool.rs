//! `promtool check metrics` on the classic exposition: no finding at all.
//!
//! promtool reads only the classic text format (its parser is the classic one), so it is run
//! on what a scraper gets without asking for OpenMetrics. The OpenMetrics exposition is
//! checked by a Prometheus server scraping it (`prometheus.rs`): promtool would report every
//! OpenMetrics counter, whose `# TYPE` names the family without `_total` as that format
//! requires, as a family without help.

use super::{busy, scrape};
use crate::support::prometheus::promtool_check;

#[tokio::test]
async fn promtool_finds_nothing_to_say_about_the_classic_exposition() {
    let busy = busy().await;
    let (content_type, page) = scrape(busy.admin, None).await;
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let (code, findings) = promtool_check(&page);
    assert_eq!(
        (code, findings.trim()),
        (0, ""),
        "promtool check metrics:\n{findings}\non:\n{page}"
    );
    // The page covered every family: each kind of traffic left its series.
    for name in [
        "capataz_client_requests_total",
        "capataz_client_request_duration_seconds_bucket",
        "capataz_requests_total",
        "capataz_config_reloads_total",
        "capataz_alerts_failed_total",
        "capataz_backend_up",
        "capataz_backend_shedding_seconds",
        "capataz_backend_slow_windows",
    ] {
        assert!(
            page.contains(&format!("\n{name}{{")),
            "{name} missing:\n{page}"
        );
    }
}

/// Regression: the classic parsers split every counter into an untyped `_total`
/// family without help, because its `# HELP` and `# TYPE` named it without `_total`.
#[tokio::test]
async fn classic_counters_carry_their_total_name_in_help_and_type() {
    let busy = busy().await;
    let (_, page) = scrape(busy.admin, None).await;
    for line in page.lines().filter(|l| l.starts_with("# TYPE ")) {
        if line.ends_with(" counter") {
            let name = line.split(' ').nth(2).unwrap();
            assert!(name.ends_with("_total"), "{line}");
            assert!(
                page.contains(&format!("# HELP {name} ")),
                "{name} has no help"
            );
        }
    }
    drop(busy.balancer);
}
