//! The membership guard: failures keep the membership, large drops wait for confirmation.

use std::net::SocketAddr;

use super::{Guard, Verdict};
use capataz_config::BackendConfig;
use capataz_events::MembershipChange;

fn members(n: usize) -> Vec<BackendConfig> {
    (0..n)
        .map(|i| {
            let address: SocketAddr = format!("127.0.0.1:{}", 9000 + i).parse().expect("address");
            BackendConfig {
                name: address.to_string(),
                address: address.to_string(),
                socket_addr: address,
                weight: 1,
                backup: false,
                agent_port: None,
                track: None,
                limit: None,
            }
        })
        .collect()
}

#[test]
fn the_first_answer_is_applied_whatever_it_says() {
    let mut guard = Guard::new(None, 50);
    let verdict = guard.handle_members(Vec::new());
    assert_eq!(verdict.apply, Some(Vec::new()));
    assert!(verdict.changes.is_empty());
}

#[test]
fn an_unchanged_answer_changes_nothing() {
    let mut guard = Guard::new(Some(members(3)), 50);
    assert_eq!(guard.handle_members(members(3)), Verdict::default());
}

#[test]
fn a_drop_within_the_share_is_applied_at_once() {
    let mut guard = Guard::new(Some(members(4)), 50);
    let verdict = guard.handle_members(members(2));
    assert_eq!(verdict.apply, Some(members(2)));
    assert!(verdict.changes.is_empty());
}

#[test]
fn a_drop_beyond_the_share_is_held_until_the_next_answer_confirms_it() {
    let mut guard = Guard::new(Some(members(4)), 50);
    let held = guard.handle_members(members(1));
    assert_eq!(held.apply, None);
    assert_eq!(
        held.changes,
        vec![MembershipChange::DropHeld { from: 4, to: 1 }]
    );
    assert!(guard.holding());
    let confirmed = guard.handle_members(members(1));
    assert_eq!(confirmed.apply, Some(members(1)));
    assert_eq!(
        confirmed.changes,
        vec![MembershipChange::DropConfirmed { from: 4, to: 1 }]
    );
    assert!(!guard.holding());
}

#[test]
fn a_held_drop_that_the_next_answer_undoes_is_forgotten() {
    let mut guard = Guard::new(Some(members(4)), 50);
    assert_eq!(guard.handle_members(Vec::new()).apply, None);
    assert_eq!(guard.handle_members(members(4)), Verdict::default());
    assert!(!guard.holding());
    // A later drop is held again, not taken as confirmed.
    assert_eq!(guard.handle_members(Vec::new()).apply, None);
}

#[test]
fn failures_keep_the_membership_and_are_said_once_then_the_recovery() {
    let mut guard = Guard::new(Some(members(2)), 50);
    let first = guard.handle_failure("timed out".into());
    assert_eq!(first.apply, None);
    assert_eq!(
        first.changes,
        vec![MembershipChange::Failing {
            error: "timed out".into(),
            kept: 2
        }]
    );
    assert_eq!(guard.handle_failure("timed out".into()), Verdict::default());
    let back = guard.handle_members(members(3));
    assert_eq!(back.apply, Some(members(3)));
    assert_eq!(back.changes, vec![MembershipChange::Restored { kept: 2 }]);
}

#[test]
fn max_drop_percent_100_never_holds_and_0_holds_any_drop() {
    let mut open = Guard::new(Some(members(4)), 100);
    assert_eq!(open.handle_members(Vec::new()).apply, Some(Vec::new()));
    let mut strict = Guard::new(Some(members(4)), 0);
    assert_eq!(strict.handle_members(members(3)).apply, None);
    // Growth is never held.
    assert_eq!(strict.handle_members(members(5)).apply, Some(members(5)));
}

#[test]
fn the_wait_follows_the_ttl_within_the_floor_and_the_ceiling() {
    use std::time::Duration;

    use capataz_config::{DnsRecord, DnsSource};
    let resolver = super::DnsResolver::new(&DnsSource {
        name: "web.test.".into(),
        record: DnsRecord::Address { port: 80 },
        resolver: Some("127.0.0.1:53".parse().expect("address")),
        ttl_min: Duration::from_secs(2),
        ttl_max: Duration::from_secs(60),
        timeout: Duration::from_secs(1),
        max_drop_percent: 50,
    })
    .expect("a resolver");
    assert_eq!(resolver.wait_for(Some(30)), Duration::from_secs(30));
    assert_eq!(resolver.wait_for(Some(0)), Duration::from_secs(2));
    assert_eq!(resolver.wait_for(Some(86_400)), Duration::from_secs(60));
    // After a failure: the floor.
    assert_eq!(resolver.wait_for(None), Duration::from_secs(2));
}
