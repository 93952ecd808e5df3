//! Shared probing across a group of balancers: who probes which backend, and what the others
//! learn from the owners.
//!
//! Each backend is probed by `k` of the group's live members, chosen by rendezvous
//! (highest-random-weight) hashing of the backend's key over the members' names: every member
//! computes the same owners from the same member list, with no coordination beyond that list,
//! and a member joining or leaving moves only the backends it gains or loses. Owners publish
//! their active verdicts; the other members feed them in as the active side of backends they do
//! not own ([`Rotation::handle_published`](crate::Rotation::handle_published)), with a
//! [`Reason::Published`](crate::Reason::Published) naming the owner.
//!
//! Invariants: pure (no IO, no clock); an instance that is not among the members it is given
//! (not yet joined, or cut off) owns every backend, so a backend is never left unprobed by
//! everyone; ownership moves never touch a backend's health: a new owner starts from the state
//! and streaks the published verdicts left.

use std::fmt;

use crate::pool::Active;
use crate::probe::Snippet;
use crate::settings::State;
use crate::status::Outcome;

/// The score of `member` for the backend `key` (rendezvous hashing): the members with the
/// highest scores own the backend. Stable across processes and versions (FNV-1a over both
/// names, then a 64-bit finalizer), never the standard library's seeded hasher.
pub fn score(member: &str, key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member
        .as_bytes()
        .iter()
        .chain(std::iter::once(&0xff))
        .chain(key.as_bytes())
    {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finalizer: FNV alone mixes the last bytes poorly.
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// The owners of the backend `key` among `members`: the indices of the `k` members with the
/// highest [`score`] (all of them if there are fewer), best first. Ties (equal scores) go to
/// the smaller name, so the order is the same whatever order `members` come in.
pub fn owners(members: &[String], key: &str, k: usize) -> Vec<usize> {
    let mut ranked: Vec<(u64, usize)> = members
        .iter()
        .enumerate()
        .map(|(index, member)| (score(member, key), index))
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| members[a.1].cmp(&members[b.1])));
    ranked.truncate(k);
    ranked.into_iter().map(|(_, index)| index).collect()
}

/// A group's view from one member: the live members (sorted, without duplicates), this
/// instance's name and `k`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    members: Vec<String>,
    me: String,
    k: usize,
}

/// Who probes one backend, as one member sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// Whether this instance probes the backend.
    pub mine: bool,
    /// The owners' names, best first.
    pub owners: Vec<String>,
}

impl Group {
    /// The group of `members` seen from `me`, each backend owned by `k` of them (at least 1).
    pub fn new(members: impl IntoIterator<Item = String>, me: &str, k: usize) -> Group {
        let mut members: Vec<String> = members.into_iter().collect();
        members.sort();
        members.dedup();
        Group {
            members,
            me: me.to_owned(),
            k: k.max(1),
        }
    }

    /// Decides, for each backend key in `backends`, whether `me` owns it (see [`Group::owns`]).
    pub fn decide<'a>(
        members: impl IntoIterator<Item = String>,
        me: &str,
        k: usize,
        backends: impl IntoIterator<Item = &'a str>,
    ) -> Vec<bool> {
        let group = Group::new(members, me, k);
        backends.into_iter().map(|key| group.owns(key)).collect()
    }

    /// The live members, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// This instance's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// How many members probe each backend.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether this instance is among the live members. When it is not (not joined yet, or cut
    /// off from the store), it owns every backend.
    pub fn joined(&self) -> bool {
        self.members.binary_search(&self.me).is_ok()
    }

    /// The owners of the backend `key`, best first; only this instance when it has not joined.
    pub fn owners(&self, key: &str) -> Vec<&str> {
        if !self.joined() {
            return vec![self.me.as_str()];
        }
        owners(&self.members, key, self.k)
            .into_iter()
            .map(|index| self.members[index].as_str())
            .collect()
    }

    /// Whether this instance probes the backend `key`.
    pub fn owns(&self, key: &str) -> bool {
        self.owners(key).contains(&self.me.as_str())
    }

    /// Who probes the backend `key` and whether this instance is one of them.
    pub fn ownership(&self, key: &str) -> Ownership {
        let owners: Vec<String> = self.owners(key).into_iter().map(str::to_owned).collect();
        Ownership {
            mine: owners.contains(&self.me),
            owners,
        }
    }

    /// Of the verdicts published for the backend `key` (by publisher name), the one this
    /// instance follows: the best-ranked owner's that has published. Verdicts of members that
    /// are not owners (a previous owner whose key has not expired yet) are ignored; `None` when
    /// no owner has published, or when this instance owns the backend (it probes it itself).
    pub fn followed<'p, T>(
        &self,
        key: &str,
        published: &'p [(String, T)],
    ) -> Option<&'p (String, T)> {
        let owners = self.owners(key);
        if owners.contains(&self.me.as_str()) {
            return None;
        }
        owners
            .iter()
            .find_map(|owner| published.iter().find(|(by, _)| by == owner))
    }
}

impl Group {
    /// Of the verdicts published for the backend `key` (by publisher name), the one a new
    /// owner starts from, so that nothing flaps while ownership moves: the live member (other
    /// than this instance) ranking highest for the backend. A publisher that is not a live
    /// member (a key written by someone else, a name no instance has) never counts; `None`
    /// when no live member has published or this instance has not joined.
    pub fn handed_over<'p, T>(
        &self,
        key: &str,
        published: &'p [(String, T)],
    ) -> Option<&'p (String, T)> {
        if !self.joined() {
            return None;
        }
        published
            .iter()
            .filter(|(by, _)| *by != self.me && self.members.binary_search(by).is_ok())
            .max_by(|a, b| {
                // Ties go to the smaller name, as owners rank.
                score(&a.0, key)
                    .cmp(&score(&b.0, key))
                    .then_with(|| b.0.cmp(&a.0))
            })
    }
}

/// Whether an owner's active side is evidence worth publishing: it was probed (or took a
/// published verdict), and a DOWN side is failing (a backend that joined DOWN and has not
/// failed yet is only waiting for `rise` passes). Publishing the unproven DOWN of a fresh owner
/// would take a backend the other owners see UP out of every follower's rotation, then back:
/// a flap on every join.
pub fn publishable(active: &Active) -> bool {
    active.probed
        && match active.state {
            State::Up => true,
            State::Down => active.fail_streak > 0,
        }
}

/// Why an owner's active side is what it published, as far as the wire carries it: the
/// streak that decided it and the last probe outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishedWhy {
    /// The failure (DOWN) or pass (UP) streak the owner had when it published.
    pub streak: u32,
    /// The owner's last probe outcome, if it had one.
    pub last: Option<Outcome>,
}

/// A verdict another member published for a backend: its active state and why, by whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The owner's name (cut to [`Snippet::MAX`] bytes).
    pub by: Snippet,
    /// The owner's active state.
    pub state: State,
    /// Why.
    pub why: PublishedWhy,
}

impl fmt::Display for Published {
    /// `DOWN as published by instance b (3 consecutive failed probes, last: REFUSED)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} as published by instance {}",
            self.state,
            self.by.as_str()
        )?;
        if self.by.is_cut() {
            f.write_str("...")?;
        }
        let PublishedWhy { streak, last } = self.why;
        if streak == 0 {
            return match last {
                Some(last) => write!(f, " (last: {last})"),
                None => Ok(()),
            };
        }
        let what = match (self.state, streak) {
            (State::Down, 1) => "failed probe",
            (State::Down, _) => "consecutive failed probes",
            (State::Up, 1) => "passing probe",
            (State::Up, _) => "consecutive passing probes",
        };
        write!(f, " ({streak} {what}")?;
        match last {
            Some(last) => write!(f, ", last: {last})"),
            None => f.write_str(")"),
        }
    }
}
