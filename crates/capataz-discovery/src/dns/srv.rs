//! SRV records to backends, pure: the targets the records name ([`targets`]), where each one
//! stands once its addresses are looked up ([`place`]), and what changed for the targets
//! since the last answer ([`changes`]).
//!
//! One target's trouble never costs the others: a target without an address (NXDOMAIN, no A
//! or AAAA record) is left out; a target whose lookup failed stays at its last known address,
//! or is left out while none is known. Either way the other targets are the membership, and
//! the target is asked again with them, on the answer's TTL.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};

use hickory_resolver::proto::rr::rdata::SRV;

use super::lookup::Found;
use super::{finish, member};
use capataz_config::BackendConfig;
use capataz_events::{MembershipChange, TargetTrouble, Unresolved};

/// One backend the SRV records name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    /// `host:port`, the host without its final dot: the backend's name.
    pub(super) name: String,
    /// The target as the record says it, to look up.
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) weight: u16,
    pub(super) priority: u16,
}

/// The targets of `records`, sorted by name: a target and port is one backend, the record of
/// the lowest priority naming it wins. A record whose target is `.` says the service is not
/// offered there (RFC 2782): it names no backend.
pub(super) fn targets(records: &[SRV]) -> Vec<Target> {
    let mut records: Vec<&SRV> = records.iter().filter(|s| !s.target.is_root()).collect();
    records.sort_by_key(|s| s.priority);
    let mut by_name: BTreeMap<String, Target> = BTreeMap::new();
    for srv in records {
        let host = srv.target.to_ascii();
        let name = format!("{}:{}", host.trim_end_matches('.'), srv.port);
        by_name.entry(name.clone()).or_insert(Target {
            name,
            host,
            port: srv.port,
            weight: srv.weight,
            priority: srv.priority,
        });
    }
    by_name.into_values().collect()
}

/// Where the targets stand after one answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Placed {
    /// The backends, sorted by name.
    pub(super) members: Vec<BackendConfig>,
    /// The targets without an address from this answer, sorted by name.
    pub(super) unresolved: Vec<Unresolved>,
    /// The smallest TTL of the targets' address records (`None`: no target resolved).
    pub(super) ttl: Option<u32>,
}

/// Places `targets` at the addresses `found` for their hosts (a host missing there counts as
/// a failed lookup), each at its first address; a failed target at its address in `known`
/// (the last answer's backends, by name) if it has one. The lowest priority placed serves,
/// the others are backups; SRV weights become 1-1000.
pub(super) fn place(
    targets: Vec<Target>,
    found: &BTreeMap<String, Found<IpAddr>>,
    known: &HashMap<String, SocketAddr>,
) -> Placed {
    let mut placed = Placed::default();
    let mut members = Vec::with_capacity(targets.len());
    for target in targets {
        let trouble = match found.get(&target.host) {
            // `Records` is never empty (see `Found`).
            Some(Found::Records(ips, ttl)) if !ips.is_empty() => {
                placed.ttl = Some(placed.ttl.map_or(*ttl, |t| t.min(*ttl)));
                let address = SocketAddr::new(ips[0], target.port);
                let weight = u32::from(target.weight).clamp(1, 1000);
                members.push((member(target.name, address, weight, false), target.priority));
                continue;
            }
            Some(Found::Records(..) | Found::NoData) => TargetTrouble::NoRecords,
            Some(Found::NxDomain) => TargetTrouble::NxDomain,
            Some(Found::Failed(error)) => TargetTrouble::Failed(error.clone()),
            None => TargetTrouble::Failed("the lookup did not finish".to_owned()),
        };
        let kept = match trouble {
            TargetTrouble::Failed(_) => known.get(&target.name).copied(),
            TargetTrouble::NxDomain | TargetTrouble::NoRecords => None,
        };
        placed.unresolved.push(Unresolved {
            target: target.name.clone(),
            trouble,
            kept,
        });
        let Some(address) = kept else { continue };
        let weight = u32::from(target.weight).clamp(1, 1000);
        members.push((member(target.name, address, weight, false), target.priority));
    }
    // The lowest priority with an address serves; the others stand by as backups.
    let lowest = members.iter().map(|(_, p)| *p).min().unwrap_or(0);
    placed.members = finish(
        members
            .into_iter()
            .map(|(mut m, priority)| {
                m.backup = priority != lowest;
                m
            })
            .collect(),
    );
    placed
}

/// What to tell about the targets, going from `before` to `now` (both sorted by target):
/// a target whose standing changed (left out, failing, and why, as a kind) is told; one that
/// was unresolved and is among `members` now, restored. A target whose record is gone is not
/// told (the membership update says it).
pub(super) fn changes(
    before: &[Unresolved],
    now: &[Unresolved],
    members: &[BackendConfig],
) -> Vec<MembershipChange> {
    let standing = |u: &Unresolved| (std::mem::discriminant(&u.trouble), u.kept.is_some());
    let mut told = Vec::new();
    for u in now {
        let was = before.iter().find(|b| b.target == u.target);
        if was.is_some_and(|b| standing(b) == standing(u)) {
            continue;
        }
        told.push(match (u.kept, &u.trouble) {
            (Some(kept), TargetTrouble::Failed(error)) => MembershipChange::TargetFailing {
                target: u.target.clone(),
                error: error.clone(),
                kept,
            },
            _ => MembershipChange::TargetLeftOut {
                target: u.target.clone(),
                trouble: u.trouble.clone(),
            },
        });
    }
    for b in before {
        if now.iter().any(|u| u.target == b.target) {
            continue;
        }
        if let Some(m) = members.iter().find(|m| m.name == b.target) {
            told.push(MembershipChange::TargetRestored {
                target: b.target.clone(),
                address: m.socket_addr,
            });
        }
    }
    told
}

#[cfg(test)]
mod tests {
    use hickory_resolver::proto::rr::Name;

    use super::*;

    fn srv(priority: u16, weight: u16, port: u16, host: &str) -> SRV {
        SRV::new(
            priority,
            weight,
            port,
            Name::from_ascii(host).expect("a name"),
        )
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn at(last: u8, port: u16) -> SocketAddr {
        SocketAddr::new(ip(last), port)
    }

    /// `a.test.` at 10.0.0.1, `b.test.` as `b`, `c.test.` as `c`.
    fn found(b: Found<IpAddr>, c: Found<IpAddr>) -> BTreeMap<String, Found<IpAddr>> {
        BTreeMap::from([
            ("a.test.".to_owned(), Found::Records(vec![ip(1)], 30)),
            ("b.test.".to_owned(), b),
            ("c.test.".to_owned(), c),
        ])
    }

    fn three() -> Vec<Target> {
        targets(&[
            srv(0, 10, 80, "a.test."),
            srv(0, 20, 80, "b.test."),
            srv(5, 0, 80, "c.test."),
        ])
    }

    fn summary(placed: &Placed) -> Vec<(String, SocketAddr, u32, bool)> {
        placed
            .members
            .iter()
            .map(|m| (m.name.clone(), m.socket_addr, m.weight, m.backup))
            .collect()
    }

    #[test]
    fn a_target_without_an_address_is_left_out_and_the_others_stay() {
        let placed = place(
            three(),
            &found(Found::NxDomain, Found::Records(vec![ip(3), ip(2)], 7)),
            &HashMap::new(),
        );
        assert_eq!(
            summary(&placed),
            vec![
                ("a.test:80".into(), at(1, 80), 10, false),
                ("c.test:80".into(), at(3, 80), 1, true),
            ]
        );
        assert_eq!(
            placed.unresolved,
            vec![Unresolved {
                target: "b.test:80".into(),
                trouble: TargetTrouble::NxDomain,
                kept: None
            }]
        );
        assert_eq!(placed.ttl, Some(7));
        // NODATA on both: left out too; the backup is the only one left with an address at
        // priority 5, so it serves.
        let placed = place(
            three(),
            &BTreeMap::from([
                ("a.test.".to_owned(), Found::NoData),
                ("b.test.".to_owned(), Found::NxDomain),
                ("c.test.".to_owned(), Found::Records(vec![ip(3)], 7)),
            ]),
            &HashMap::new(),
        );
        assert_eq!(
            summary(&placed),
            vec![("c.test:80".into(), at(3, 80), 1, false)]
        );
        assert_eq!(placed.unresolved[0].trouble, TargetTrouble::NoRecords);
    }

    #[test]
    fn a_target_whose_lookup_fails_keeps_its_last_address_or_is_left_out_without_one() {
        let failed = || Found::Failed("A: request timed out".to_owned());
        let known = HashMap::from([("b.test:80".to_owned(), at(9, 80))]);
        let placed = place(three(), &found(failed(), failed()), &known);
        assert_eq!(
            summary(&placed),
            vec![
                ("a.test:80".into(), at(1, 80), 10, false),
                ("b.test:80".into(), at(9, 80), 20, false),
            ]
        );
        let trouble = TargetTrouble::Failed("A: request timed out".into());
        assert_eq!(
            placed.unresolved,
            vec![
                Unresolved {
                    target: "b.test:80".into(),
                    trouble: trouble.clone(),
                    kept: Some(at(9, 80))
                },
                Unresolved {
                    target: "c.test:80".into(),
                    trouble,
                    kept: None
                },
            ]
        );
        // A host the lookups never reported counts as failed, never as absent.
        let placed = place(three(), &BTreeMap::new(), &known);
        assert_eq!(
            summary(&placed),
            vec![("b.test:80".into(), at(9, 80), 20, false)]
        );
        assert_eq!(placed.ttl, None);
    }

    #[test]
    fn the_lowest_priority_record_of_a_target_and_port_wins_and_the_root_is_no_target() {
        assert!(targets(&[srv(0, 1, 80, ".")]).is_empty());
        let got = targets(&[
            srv(3, 1, 80, "a.test."),
            srv(1, 2, 80, "a.test."),
            srv(2, 3, 81, "a.test."),
        ]);
        let got: Vec<(&str, u16, u16)> = got
            .iter()
            .map(|t| (&*t.name, t.weight, t.priority))
            .collect();
        assert_eq!(got, vec![("a.test:80", 2, 1), ("a.test:81", 3, 2)]);
    }

    #[test]
    fn targets_are_told_when_their_standing_changes_and_when_they_come_back() {
        let u = |target: &str, trouble: TargetTrouble, kept: Option<SocketAddr>| Unresolved {
            target: target.into(),
            trouble,
            kept,
        };
        let failed = |e: &str| TargetTrouble::Failed(e.into());
        let left = vec![u("b.test:80", TargetTrouble::NxDomain, None)];
        let members = place(
            three(),
            &found(Found::Records(vec![ip(2)], 5), Found::NoData),
            &HashMap::new(),
        )
        .members;
        assert_eq!(
            changes(&[], &left, &[]),
            vec![MembershipChange::TargetLeftOut {
                target: "b.test:80".into(),
                trouble: TargetTrouble::NxDomain
            }]
        );
        // The same standing again: nothing. Another failure text of the same kind: nothing.
        assert!(changes(&left, &left, &[]).is_empty());
        let slow = vec![u(
            "b.test:80",
            failed("A: request timed out"),
            Some(at(2, 80)),
        )];
        let slower = vec![u(
            "b.test:80",
            failed("AAAA: request timed out"),
            Some(at(2, 80)),
        )];
        assert!(changes(&slow, &slower, &[]).is_empty());
        assert_eq!(
            changes(&left, &slow, &[]),
            vec![MembershipChange::TargetFailing {
                target: "b.test:80".into(),
                error: "A: request timed out".into(),
                kept: at(2, 80)
            }]
        );
        assert_eq!(
            changes(&slow, &[], &members),
            vec![MembershipChange::TargetRestored {
                target: "b.test:80".into(),
                address: at(2, 80)
            }]
        );
        // Gone from the records: the update says it, not a target event.
        assert!(changes(&left, &[], &[]).is_empty());
    }
}
