//! Connection IDs that say which process owns them, so that the two processes of a binary
//! upgrade can share one UDP socket: the new process reads every datagram and passes on those
//! of the old process's connections (`h3/handoff.rs`), found by the destination connection ID
//! the client put on them.
//!
//! Every connection ID an endpoint issues is [`CID_LEN`] bytes: a [`Tag`] of [`TAG_LEN`]
//! bytes, the same for every ID of the process (chosen at random when it starts, different
//! from the tag of the process it took over from), then 8 bytes from the system's random
//! generator, as many random bytes as quinn's own default IDs carry. The tag is what QUIC-LB
//! style routing puts in the clear too (a server identifier): an observer learns which of two
//! processes a connection is on, nothing that links two IDs of one connection beyond that
//! (RFC 9000 section 5.1: the random part is what keeps them apart).
//!
//! [`route`] reads a datagram's destination connection ID without trusting anything in it:
//! any bytes give an answer, never a panic.

use quinn::{ConnectionId, ConnectionIdGenerator};
use ring::rand::SecureRandom as _;

/// The first bytes of every connection ID a process issues (the handover chooses them).
pub(crate) type Tag = crate::handover::QuicTag;

/// Bytes of a connection ID that name the process.
pub(crate) const TAG_LEN: usize = std::mem::size_of::<Tag>();

/// Length of every connection ID an endpoint issues (short header packets carry no length:
/// both processes use this one).
pub(crate) const CID_LEN: usize = TAG_LEN + 8;

/// Issues [`CID_LEN`]-byte connection IDs starting with one process's [`Tag`].
pub(crate) struct TaggedCids {
    tag: Tag,
    random: ring::rand::SystemRandom,
}

impl TaggedCids {
    /// A generator of IDs starting with `tag`.
    pub(crate) fn new(tag: Tag) -> TaggedCids {
        TaggedCids {
            tag,
            random: ring::rand::SystemRandom::new(),
        }
    }
}

impl ConnectionIdGenerator for TaggedCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut bytes = [0u8; CID_LEN];
        bytes[..TAG_LEN].copy_from_slice(&self.tag);
        if self.random.fill(&mut bytes[TAG_LEN..]).is_err() {
            // getrandom(2) does not fail once the kernel's pool is ready; should it, fastrand
            // (seeded from the system at start) keeps the endpoint serving instead of failing.
            bytes[TAG_LEN..].fill_with(|| fastrand::u8(..));
        }
        ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// Which process a datagram read from the shared socket is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// This process's: one of its connections, a new connection, or nothing anyone knows.
    Here,
    /// The old process's: one of its connections.
    Old,
}

/// QUIC version 1 (RFC 9000), the one version capataz serves.
const VERSION_1: [u8; 4] = [0, 0, 0, 1];

/// The long header packet type of a Handshake packet in QUIC version 1.
const HANDSHAKE: u8 = 2;

/// Where `datagram` goes, for a process whose IDs start with `own` that took over from one
/// whose IDs start with `old`, by its first packet's destination connection ID (the packets
/// coalesced in a datagram all carry the same):
/// - a short header packet (1-RTT) carries [`CID_LEN`] bytes: anything not `own`'s goes to the
///   old process (which passes on what is not its own in turn, when it took over from an
///   older one still draining);
/// - a long header packet goes to the old process only when it is a version 1 Handshake
///   packet whose ID the old process issued. Initial and 0-RTT packets carry an ID the client
///   chose (or, after a Retry, the Retry's), and are the new process's to answer, as
///   anything the bytes do not make out.
pub(crate) fn route(datagram: &[u8], own: Tag, old: Tag) -> Route {
    let Some(&first) = datagram.first() else {
        return Route::Here;
    };
    if first & 0x80 == 0 {
        // Short header: flags, then the destination ID.
        return match datagram.get(1..1 + TAG_LEN) {
            Some(tag) if datagram.len() > CID_LEN && tag != own => Route::Old,
            _ => Route::Here,
        };
    }
    // Long header: flags (with the type), version (4 bytes), the destination ID's length (any
    // other than ours is not an ID either process issued), the ID.
    let handshake = (first >> 4) & 0x03 == HANDSHAKE;
    if !handshake
        || datagram.get(1..5) != Some(&VERSION_1[..])
        || datagram.get(5).map(|&len| usize::from(len)) != Some(CID_LEN)
    {
        return Route::Here;
    }
    match datagram.get(6..6 + CID_LEN) {
        Some(cid) if cid[..TAG_LEN] == old => Route::Old,
        _ => Route::Here,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: Tag = [0xa1, 0x01];
    const OLD: Tag = [0xb2, 0x02];

    fn short(tag: Tag) -> Vec<u8> {
        let mut packet = vec![0x40];
        packet.extend_from_slice(&tag);
        packet.extend_from_slice(&[7; CID_LEN - TAG_LEN]);
        packet.extend_from_slice(&[0x55; 30]);
        packet
    }

    fn long(kind: u8, cid: &[u8]) -> Vec<u8> {
        let mut packet = vec![0xc0 | (kind << 4), 0, 0, 0, 1, cid.len() as u8];
        packet.extend_from_slice(cid);
        packet.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8, 0x44, 0x99]);
        packet
    }

    #[test]
    fn generated_ids_carry_the_tag_and_differ() {
        let mut generator = TaggedCids::new(OWN);
        let one = generator.generate_cid();
        let two = generator.generate_cid();
        assert_eq!(one.len(), CID_LEN);
        assert_eq!(&one[..TAG_LEN], &OWN);
        assert_ne!(one, two);
        assert_eq!(route(&short([one[0], one[1]]), OWN, OLD), Route::Here);
    }

    #[test]
    fn a_short_header_packet_goes_by_its_tag() {
        assert_eq!(route(&short(OWN), OWN, OLD), Route::Here);
        assert_eq!(route(&short(OLD), OWN, OLD), Route::Old);
        // An older process's, passed on by the old one.
        assert_eq!(route(&short([9, 9]), OWN, OLD), Route::Old);
    }

    #[test]
    fn only_a_handshake_packet_with_the_old_id_goes_to_the_old_process() {
        let mut old = OLD.to_vec();
        old.extend_from_slice(&[3; CID_LEN - TAG_LEN]);
        assert_eq!(route(&long(2, &old), OWN, OLD), Route::Old);
        // Initial and 0-RTT: the client's ID (or a Retry's), whatever its bytes.
        assert_eq!(route(&long(0, &old), OWN, OLD), Route::Here);
        assert_eq!(route(&long(1, &old), OWN, OLD), Route::Here);
        assert_eq!(route(&long(0, &[0xb2; 8]), OWN, OLD), Route::Here);
        // Another length, another tag, another version.
        assert_eq!(route(&long(2, &[0xb2; 20]), OWN, OLD), Route::Here);
        assert_eq!(route(&long(2, &[0x11; CID_LEN]), OWN, OLD), Route::Here);
        let mut draft = long(2, &old);
        draft[1..5].copy_from_slice(&[0xff, 0, 0, 0x1d]);
        assert_eq!(route(&draft, OWN, OLD), Route::Here);
    }

    #[test]
    fn hostile_datagrams_are_this_process_s_and_never_panic() {
        assert_eq!(route(&[], OWN, OLD), Route::Here);
        assert_eq!(route(&[0x40], OWN, OLD), Route::Here);
        assert_eq!(route(&[0x40, 0xb2, 0x02], OWN, OLD), Route::Here);
        assert_eq!(route(&[0xc0, 0, 0, 0, 1], OWN, OLD), Route::Here);
        // A length over 20, and one longer than the datagram.
        assert_eq!(route(&[0xe0, 0, 0, 0, 1, 255, 0xb2], OWN, OLD), Route::Here);
        assert_eq!(
            route(&[0xe0, 0, 0, 0, 1, CID_LEN as u8, 0xb2, 0x02], OWN, OLD),
            Route::Here
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_get_a_route(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            let _ = route(&bytes, OWN, OLD);
        }
    }
}
