//! Backups take over when no primary is in rotation, and hand back.

use capataz::sim::Mode;
use capataz_health::State;

use super::*;
use crate::support::balancer::backends;
use crate::support::events::is_transition;

#[tokio::test]
async fn backups_take_over_and_hand_back() {
    let b = backends(&["main", "spare1", "spare2"]).await;
    let text = config(
        &[
            (&b[0], ""),
            (&b[1], "backup = true"),
            (&b[2], "backup = true"),
        ],
        "",
        "",
    );
    let mut r = Running::start(&text).await;
    assert_eq!(r.traffic(6).await.get("main"), Some(&6), "backups stand by");
    let spare = r.backend("spare1").await;
    assert_eq!(spare["role"], "backup");
    assert_eq!(spare["serving"], false);
    assert!(
        spare["explain"]
            .as_str()
            .unwrap_or_default()
            .ends_with("backup: standing by while a primary is in rotation"),
        "{spare}"
    );

    b[0].set_health(Mode::Status(500));
    r.wait_for("main DOWN", |e| is_transition(e, "main", State::Down))
        .await;
    let event = r
        .wait_for("backups take over", |e| backups_of(e).is_some())
        .await;
    assert_eq!(backups_of(&event), Some((vec!["spare1".into()], false)));
    assert_eq!(
        event.sentence(),
        "pool=web has no primary backend in rotation: backup spare1 takes over"
    );
    assert_eq!(event.to_json()["backups"], serde_json::json!(["spare1"]));
    assert_eq!(
        r.traffic(6).await.get("spare1"),
        Some(&6),
        "the first backup only, by default"
    );
    assert!(r
        .metrics()
        .await
        .contains("capataz_pool_on_backups{pool=\"web\"} 1\n"));
    let pool = r.pool().await;
    assert_eq!(pool["on_backups"], serde_json::json!(["spare1"]));
    assert_eq!(pool["all_down"], false);
    assert_eq!(
        pool["explain"],
        "no primary backend in rotation: served by its backup spare1"
    );

    b[0].set_health(Mode::Status(200));
    r.wait_for("main UP", |e| is_transition(e, "main", State::Up))
        .await;
    let event = r
        .wait_for("backups hand back", |e| backups_of(e).is_some())
        .await;
    assert_eq!(backups_of(&event), Some((vec![], true)));
    assert_eq!(r.traffic(6).await.get("main"), Some(&6));
    assert!(r.pool().await["on_backups"].is_null());
    assert!(r
        .metrics()
        .await
        .contains("capataz_pool_on_backups{pool=\"web\"} 0\n"));
    r.balancer.shutdown(std::time::Duration::from_secs(1)).await;
}
