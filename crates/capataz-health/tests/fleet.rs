//! Shared probing on simulated time: rendezvous ownership (stable, minimal movement, `k`
//! owners, never nobody) and published verdicts driving the active side of backends another
//! member owns, with ownership moving without a flap.

use std::time::Duration;

use capataz_health::fleet::{owners, score};
use capataz_health::rotation::Event;
use capataz_health::{
    Group, Join, Outcome, Policy, Published, PublishedWhy, Reason, Rotation, Settings, Snippet,
    State,
};
use proptest::prelude::*;

const S: Duration = Duration::from_secs(1);

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|name| name.to_string()).collect()
}

fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("web/10.0.{}.{}:80", i / 250, i % 250))
        .collect()
}

fn owner_set(members: &[String], key: &str, k: usize) -> Vec<String> {
    let mut set: Vec<String> = owners(members, key, k)
        .into_iter()
        .map(|i| members[i].clone())
        .collect();
    set.sort();
    set
}

#[test]
fn scores_are_stable_and_depend_on_both_names() {
    // Pinned: instances of different builds must agree on owners.
    assert_eq!(score("a", "web/10.0.0.1:80"), 14_665_917_727_408_168_047);
    assert_eq!(score("a", "web/10.0.0.1:80"), score("a", "web/10.0.0.1:80"));
    assert_ne!(score("a", "web/10.0.0.1:80"), score("b", "web/10.0.0.1:80"));
    assert_ne!(score("a", "web/10.0.0.1:80"), score("a", "web/10.0.0.2:80"));
    // The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert_ne!(score("ab", "c"), score("a", "bc"));
}

#[test]
fn each_backend_has_k_owners_or_every_member_when_fewer() {
    let members = names(&["a", "b", "c", "d", "e"]);
    for key in keys(200) {
        for k in 1..=7 {
            let set = owner_set(&members, &key, k);
            assert_eq!(set.len(), k.min(5), "{key} k={k}");
            let mut deduped = set.clone();
            deduped.dedup();
            assert_eq!(deduped, set);
        }
    }
}

#[test]
fn owners_do_not_depend_on_the_order_of_members() {
    let one = names(&["a", "b", "c", "d"]);
    let other = names(&["d", "b", "a", "c"]);
    for key in keys(100) {
        assert_eq!(owner_set(&one, &key, 2), owner_set(&other, &key, 2));
    }
}

#[test]
fn probing_is_spread_over_the_members() {
    let members = names(&["a", "b", "c"]);
    let mut owned = [0usize; 3];
    for key in keys(3000) {
        for index in owners(&members, &key, 1) {
            owned[index] += 1;
        }
    }
    for count in owned {
        assert!((800..=1200).contains(&count), "{owned:?}");
    }
}

#[test]
fn a_member_leaving_moves_only_the_backends_it_owned() {
    let before = names(&["a", "b", "c", "d", "e"]);
    let after = names(&["a", "b", "d", "e"]);
    for k in [1, 2, 3] {
        let mut moved = 0;
        for key in keys(500) {
            let old = owner_set(&before, &key, k);
            let new = owner_set(&after, &key, k);
            if old.contains(&"c".to_string()) {
                // One new owner replaces "c"; the others stay.
                let kept = old.iter().filter(|o| new.contains(o)).count();
                assert_eq!(kept, k - 1, "{key} k={k}");
                moved += 1;
            } else {
                assert_eq!(old, new, "{key} k={k}");
            }
        }
        assert!(moved > 0);
    }
}

#[test]
fn a_member_joining_takes_over_at_most_one_place_per_backend() {
    let before = names(&["a", "b", "c"]);
    let after = names(&["a", "b", "c", "z"]);
    for key in keys(500) {
        let old = owner_set(&before, &key, 2);
        let new = owner_set(&after, &key, 2);
        if new.contains(&"z".to_string()) {
            assert_eq!(old.iter().filter(|o| new.contains(o)).count(), 1, "{key}");
        } else {
            assert_eq!(old, new, "{key}");
        }
    }
}

#[test]
fn an_instance_not_among_the_members_probes_everything() {
    // Not joined yet, or cut off: its view of the members lacks itself.
    let group = Group::new(names(&["a", "b"]), "c", 1);
    assert!(!group.joined());
    assert!(keys(50).iter().all(|key| group.owns(key)));
    let alone = Group::new(Vec::new(), "c", 2);
    assert!(keys(50).iter().all(|key| alone.owns(key)));
    // The last member standing owns everything.
    let last = Group::new(names(&["c"]), "c", 2);
    assert!(keys(50).iter().all(|key| last.owns(key)));
}

#[test]
fn decide_agrees_across_members_and_leaves_no_backend_unprobed() {
    let members = names(&["a", "b", "c", "d"]);
    let all = keys(300);
    let decisions: Vec<Vec<bool>> = members
        .iter()
        .map(|me| Group::decide(members.clone(), me, 2, all.iter().map(String::as_str)))
        .collect();
    for (index, key) in all.iter().enumerate() {
        let probers = decisions.iter().filter(|d| d[index]).count();
        assert_eq!(probers, 2, "{key}");
    }
}

#[test]
fn a_new_owner_starts_only_from_a_live_members_verdict() {
    let members = names(&["a", "b", "c"]);
    let group = Group::new(members.clone(), "a", 1);
    let key = "web/127.0.0.1:8080";
    // Someone with etcdctl writes a verdict under a name no instance has: ranking above the
    // real previous owner (or alone), it must not be what the new owner starts from.
    let stranger = (0..1000)
        .map(|i| format!("x{i}"))
        .find(|x| score(x, key) > score("b", key).max(score("c", key)))
        .unwrap();
    let published = vec![
        (stranger.clone(), State::Up),
        ("b".to_owned(), State::Down),
        ("a".to_owned(), State::Up),
    ];
    assert_eq!(
        group
            .handed_over(key, &published)
            .map(|p| (p.0.as_str(), p.1)),
        Some(("b", State::Down))
    );
    assert_eq!(group.handed_over(key, &published[..1]), None);
    // Its own old verdict is not a hand-over, nor is anything before it has joined.
    assert_eq!(group.handed_over(key, &published[2..]), None);
    let alone = Group::new(names(&["b"]), "a", 1);
    assert_eq!(alone.handed_over(key, &published), None);
    // Among live members, the best ranked wins, whatever the order.
    let both = vec![("c".to_owned(), State::Up), ("b".to_owned(), State::Down)];
    let best = if score("b", key) > score("c", key) {
        "b"
    } else {
        "c"
    };
    assert_eq!(
        group.handed_over(key, &both).map(|p| p.0.as_str()),
        Some(best)
    );
    let mut reversed = both.clone();
    reversed.reverse();
    assert_eq!(
        group.handed_over(key, &reversed).map(|p| p.0.as_str()),
        Some(best)
    );
    let _ = members;
}

#[test]
fn a_follower_takes_the_best_ranked_owners_verdict_and_ignores_others() {
    let members = names(&["a", "b", "c", "d"]);
    let key = keys(40)
        .into_iter()
        .find(|key| !Group::new(members.clone(), "d", 2).owns(key))
        .unwrap();
    let group = Group::new(members.clone(), "d", 2);
    let ranked = group.owners(&key);
    let stranger = members
        .iter()
        .find(|m| !ranked.contains(&m.as_str()) && *m != "d")
        .unwrap();
    let published = vec![
        (stranger.clone(), State::Down),
        (ranked[1].to_string(), State::Down),
        (ranked[0].to_string(), State::Up),
    ];
    assert_eq!(
        group.followed(&key, &published).map(|p| p.1),
        Some(State::Up)
    );
    let only_second = &published[..2];
    assert_eq!(
        group.followed(&key, only_second).map(|p| p.0.as_str()),
        Some(ranked[1])
    );
    let only_stranger = &published[..1];
    assert_eq!(group.followed(&key, only_stranger), None);
    // An owner follows nobody.
    let owner = Group::new(members, ranked[0], 2);
    assert_eq!(owner.followed(&key, &published), None);
}

fn rotation(n: usize) -> Rotation {
    Rotation::new(
        Settings::default(),
        Policy::default(),
        (0..n).map(|_| {
            (
                1,
                Join::New {
                    initial: State::Up,
                    warm_up: false,
                },
            )
        }),
        Duration::ZERO,
    )
}

fn transitions(rotation: &mut Rotation) -> Vec<(State, State, Reason)> {
    std::iter::from_fn(|| rotation.poll_event())
        .filter_map(|event| match event {
            Event::Transition(t) => Some((t.from, t.to, t.reason)),
            _ => None,
        })
        .collect()
}

fn published(by: &str, state: State, streak: u32, last: Outcome) -> Published {
    Published {
        by: Snippet::new(by),
        state,
        why: PublishedWhy {
            streak,
            last: Some(last),
        },
    }
}

#[test]
fn a_published_verdict_moves_the_followers_active_side_once_and_says_by_whom() {
    let mut owner = rotation(1);
    let mut follower = rotation(1);
    for i in 0..3 {
        owner.handle_probe(0, Outcome::Refused, i * S);
    }
    let owned = transitions(&mut owner);
    assert_eq!(owned.len(), 1);
    assert_eq!(owner.pool().verdict(0), State::Down);
    // The owner publishes; the follower, twice (a watch may repeat a value): one transition.
    let verdict = published("b", State::Down, 3, Outcome::Refused);
    assert_eq!(follower.handle_published(0, verdict, 3 * S), State::Down);
    assert_eq!(follower.handle_published(0, verdict, 4 * S), State::Down);
    let seen = transitions(&mut follower);
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (from, to, reason) = seen[0];
    assert_eq!((from, to), (State::Up, State::Down));
    assert_eq!(
        reason.to_string(),
        "DOWN as published by instance b (3 consecutive failed probes, last: REFUSED)"
    );
    assert_eq!(reason.last(), Some(Outcome::Refused));
}

#[test]
fn a_new_owner_continues_from_the_published_streaks_without_flapping() {
    let settings = Settings::default();
    let (rise, fall) = (settings.rise.get(), settings.fall.get());
    let mut follower = rotation(2);
    // Backend 0 published DOWN after `fall` failures, backend 1 UP.
    follower.handle_published(0, published("a", State::Down, fall, Outcome::Refused), S);
    follower.handle_published(1, published("a", State::Up, rise, Outcome::Status(200)), S);
    assert_eq!(transitions(&mut follower).len(), 1);
    // "a" dies; this instance owns both now and probes them itself. A passing probe of the
    // DOWN backend does not bring it back before `rise` passes; one failing probe of the UP
    // backend does not take it down before `fall` failures: no transition on the takeover.
    follower.handle_probe(0, Outcome::Status(200), 2 * S);
    follower.handle_probe(1, Outcome::Refused, 2 * S);
    follower.handle_probe(0, Outcome::Refused, 3 * S);
    assert!(transitions(&mut follower).is_empty());
    assert_eq!(follower.pool().verdict(0), State::Down);
    assert_eq!(follower.pool().verdict(1), State::Up);
    // A DOWN backend still failing stays DOWN with its streak continued.
    let active = follower.pool().backend(0).active;
    assert_eq!(active.fail_streak, 1);
    // And real changes still happen, after the configured streaks.
    for i in 0..rise {
        follower.handle_probe(0, Outcome::Status(200), (4 + i) * S);
    }
    assert_eq!(follower.pool().verdict(0), State::Up);
}

#[test]
fn a_published_up_never_empties_a_pool_the_owner_sees_up() {
    // A follower whose only input is published verdicts keeps the backend in rotation as long
    // as the owner says UP, and the all-down policy still applies when it says DOWN.
    let mut follower = rotation(2);
    follower.handle_published(0, published("a", State::Down, 3, Outcome::Timeout), S);
    follower.handle_published(1, published("a", State::Down, 3, Outcome::Timeout), S);
    let eligible = follower.eligible(2 * S);
    assert!(eligible.all_down);
    assert!(
        !eligible.backends.is_empty(),
        "fail-open over proven backends"
    );
    follower.handle_published(1, published("a", State::Up, 2, Outcome::Status(200)), 3 * S);
    assert_eq!(follower.eligible(3 * S).backends, vec![1]);
}

#[test]
fn the_owners_name_is_bounded_in_the_reason() {
    let long = "x".repeat(500);
    let verdict = published(&long, State::Up, 1, Outcome::Status(200));
    let text = Reason::Published(verdict).to_string();
    assert!(text.len() < 120, "{text}");
    assert!(text.starts_with("UP as published by instance xxx"));
    assert!(
        text.ends_with("... (1 passing probe, last: HTTP 200)"),
        "{text}"
    );
}

proptest! {
    #[test]
    fn every_backend_has_min_k_n_owners_agreed_by_all(
        members in proptest::collection::btree_set("[a-z]{1,6}", 1..8),
        k in 1usize..5,
        key in "[a-z0-9./:]{1,30}",
    ) {
        let members: Vec<String> = members.into_iter().collect();
        let probers = members
            .iter()
            .filter(|me| Group::new(members.clone(), me, k).owns(&key))
            .count();
        prop_assert_eq!(probers, k.min(members.len()));
    }
}

#[test]
fn a_fresh_owner_publishes_nothing_before_evidence() {
    use capataz_health::fleet::publishable;
    // Joined DOWN (gated), not probed: nothing to publish.
    let mut fresh = Rotation::new(
        Settings::default(),
        Policy::default(),
        [(
            1,
            Join::New {
                initial: State::Down,
                warm_up: false,
            },
        )],
        Duration::ZERO,
    );
    assert!(!publishable(&fresh.pool().backend(0).active));
    // A passing probe short of `rise`: still only waiting, nothing to publish.
    fresh.handle_probe(0, Outcome::Status(200), S);
    assert!(!publishable(&fresh.pool().backend(0).active));
    // A failing probe is evidence of DOWN; `rise` passes are evidence of UP.
    fresh.handle_probe(0, Outcome::Refused, 2 * S);
    assert!(publishable(&fresh.pool().backend(0).active));
    for i in 0..Settings::default().rise.get() {
        fresh.handle_probe(0, Outcome::Status(200), (3 + i) * S);
    }
    assert_eq!(fresh.pool().verdict(0), State::Up);
    assert!(publishable(&fresh.pool().backend(0).active));
}
