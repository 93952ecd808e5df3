//! How a request's (or a TCP session's) backend stands to its pool's affinity: the backend
//! affinity named (a sticky client's cookie's, or a key's home: the owner of its point on the
//! ring of every primary at its configured weight) kept, left and why, or none named.
//!
//! One value per request, decided where the backend is picked ([`Home`] follows the picks)
//! and read once the backend that serves is known ([`Home::placement`]): the sticky-move
//! counter (`capataz_sticky_moves_total{reason}`) and the access log's `affinity=` are both
//! written from it, so the two cannot disagree.

/// Why a request left the backend affinity named (`capataz_sticky_moves_total`'s `reason`
/// for a sticky client; the access log's `affinity=moved:REASON` for both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveReason {
    /// Its backend is out of rotation: DOWN, ejected, forced down, in maintenance, or
    /// draining while DOWN.
    OutOfRotation,
    /// Its backend drains and the pool says `on_drain = "move"`.
    Draining,
    /// Its backend was tried and failed; a retry went elsewhere.
    Failed,
    /// Its backend (in a pool with connection limits) was at its limit, and the request went
    /// the queue's way.
    AtLimit,
    /// Hashing only: the key's home holds fewer (or more) points of the ring than at its
    /// configured weight (slow start, load shedding, an agent's weight), and the point the key
    /// falls on is another backend's for now.
    Weight,
    /// Hashing only: the key's home held its share of the requests outstanding
    /// (`hash_balance_factor`), and the walk on the ring went on to the next backend.
    BoundedLoad,
}

impl MoveReason {
    /// `out_of_rotation`, `draining`, `failed`, `at_limit`, `weight` or `bounded_load`.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::OutOfRotation => "out_of_rotation",
            MoveReason::Draining => "draining",
            MoveReason::Failed => "failed",
            MoveReason::AtLimit => "at_limit",
            MoveReason::Weight => "weight",
            MoveReason::BoundedLoad => "bounded_load",
        }
    }
}

/// How the backend that served stands to the one affinity named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// It is the one named: the sticky cookie's backend, or the key's home on the ring.
    Kept,
    /// It is another: the named one could not take the request, for this reason.
    Moved(MoveReason),
    /// Sticky: the client sent no sticky cookie (a new client).
    New,
    /// Sticky: the client's cookie names no backend of the pool (forged, garbage, or a
    /// backend removed since): balanced as a new client, and given a fresh cookie.
    Unknown,
    /// Hashing: the request has no key (an absent or empty value): round robin.
    NoKey,
}

impl Placement {
    /// The access log's value: `kept`, `moved:REASON`, `new`, `unknown` or `no_key`.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Kept => "kept",
            Placement::Moved(MoveReason::OutOfRotation) => "moved:out_of_rotation",
            Placement::Moved(MoveReason::Draining) => "moved:draining",
            Placement::Moved(MoveReason::Failed) => "moved:failed",
            Placement::Moved(MoveReason::AtLimit) => "moved:at_limit",
            Placement::Moved(MoveReason::Weight) => "moved:weight",
            Placement::Moved(MoveReason::BoundedLoad) => "moved:bounded_load",
            Placement::New => "new",
            Placement::Unknown => "unknown",
            Placement::NoKey => "no_key",
        }
    }
}

/// The backend a request's affinity names, if any, and why the request left it once that is
/// decided. Copied and updated along the picks; no allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Home {
    named: Option<usize>,
    moved: Option<MoveReason>,
    /// What the placement is when no backend is named.
    unnamed: Placement,
}

impl Home {
    /// A request of a hashing pool with no key (and of a pool without affinity).
    pub const NO_KEY: Home = Home {
        named: None,
        moved: None,
        unnamed: Placement::NoKey,
    };

    /// A sticky client whose cookie names `stuck` (`None`: no backend of the pool);
    /// `cookie_sent`: whether it sent the pool's cookie at all.
    pub fn sticky(stuck: Option<usize>, cookie_sent: bool) -> Home {
        Home {
            named: stuck,
            moved: None,
            unnamed: if cookie_sent {
                Placement::Unknown
            } else {
                Placement::New
            },
        }
    }

    /// A key whose home is `owner` (`None`: the pool has no primary).
    pub fn hashed(owner: Option<usize>) -> Home {
        Home {
            named: owner,
            moved: None,
            unnamed: Placement::NoKey,
        }
    }

    /// The backend named, if any.
    pub fn named(&self) -> Option<usize> {
        self.named
    }

    /// Notes that the request leaves the named backend for `reason`, unless a reason was
    /// noted already (the first one is why it left).
    pub fn moving(&mut self, reason: MoveReason) {
        if self.named.is_some() && self.moved.is_none() {
            self.moved = Some(reason);
        }
    }

    /// Notes a retry after the backends `tried`: if the named one is among them, it failed.
    pub fn retried(&mut self, tried: &[usize]) {
        if self.named.is_some_and(|n| tried.contains(&n)) {
            self.moving(MoveReason::Failed);
        }
    }

    /// Notes that backend `index`, picked by affinity, was at its limit.
    pub fn at_limit(&mut self, index: usize) {
        if self.named == Some(index) {
            self.moving(MoveReason::AtLimit);
        }
    }

    /// How backend `index`, the one that served, stands to the named one.
    pub fn placement(&self, index: usize) -> Placement {
        match self.named {
            None => self.unnamed,
            Some(named) if named == index => Placement::Kept,
            // Served elsewhere with no reason noted: the named backend failed (a retry).
            Some(_) => Placement::Moved(self.moved.unwrap_or(MoveReason::Failed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sticky_client_is_kept_moved_for_the_first_reason_or_new() {
        let mut home = Home::sticky(Some(1), true);
        assert_eq!(home.placement(1), Placement::Kept);
        home.moving(MoveReason::OutOfRotation);
        home.retried(&[1]);
        home.at_limit(1);
        assert_eq!(
            home.placement(2),
            Placement::Moved(MoveReason::OutOfRotation)
        );
        assert_eq!(home.placement(2).as_str(), "moved:out_of_rotation");
        let mut failed = Home::sticky(Some(0), true);
        failed.retried(&[2]);
        assert_eq!(failed.placement(2), Placement::Moved(MoveReason::Failed));
        failed.at_limit(0);
        assert_eq!(failed.placement(1).as_str(), "moved:at_limit");
        assert_eq!(Home::sticky(None, false).placement(0).as_str(), "new");
        assert_eq!(Home::sticky(None, true).placement(0).as_str(), "unknown");
    }

    #[test]
    fn a_key_keeps_its_owner_or_says_why_it_left() {
        let owner = Home::hashed(Some(3));
        assert_eq!(owner.placement(3).as_str(), "kept");
        let mut bounded = owner;
        bounded.moving(MoveReason::BoundedLoad);
        assert_eq!(bounded.placement(0).as_str(), "moved:bounded_load");
        assert_eq!(Home::NO_KEY.placement(0).as_str(), "no_key");
        let mut none = Home::NO_KEY;
        none.moving(MoveReason::Failed);
        assert_eq!(none.placement(0), Placement::NoKey);
    }
}
