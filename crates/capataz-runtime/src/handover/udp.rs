//! The UDP sockets of a handover (`http3:FD=CONFIGURED=BOUND` entries): a TLS listener's
//! HTTP/3 endpoint, which the new process serves on at once, from the same socket; and the
//! channel that lets the old process's QUIC connections finish on it.
//!
//! Both processes hold the socket until the old one exits, and the kernel gives each datagram
//! to whichever reads first, while a QUIC connection lives in one process. So from the
//! takeover on only the new process reads the socket, and passes each datagram of the old
//! process's connections on to it (`h3/handoff.rs`), through a Unix `SOCK_SEQPACKET` socket
//! pair made for each socket handed over; the old process reads its end instead of the UDP
//! socket, sends its replies on the UDP socket still, and drains its connections as a stop
//! does. Whose a datagram is, its destination connection ID says: each process's IDs start
//! with its own [`QuicTag`] (`h3/cid.rs`).
//!
//! The protocol is one more variable, `CAPATAZ_HANDOVER_QUIC`: `UDP_FD=CHANNEL_FD=TAG`
//! entries separated by commas, the descriptor of an `http3` entry's socket, the new
//! process's end of its channel, and the old process's tag (hexadecimal). A process that
//! does not know the variable serves all the same, the old process's connections then
//! ending when they go idle or at its drain's deadline; a channel nobody takes is closed,
//! and the old process then reads its socket again.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};

use super::{checked_fd, malformed, DescriptorError, HandoverError, Offered};

/// The channels to the old process, by the UDP socket they go with.
pub(crate) const QUIC_VAR: &str = "CAPATAZ_HANDOVER_QUIC";

/// The first bytes of every QUIC connection ID a process issues (`h3/cid.rs`).
pub(crate) type QuicTag = [u8; 2];

/// This process's tag, chosen once.
static TAG: OnceLock<QuicTag> = OnceLock::new();

/// This process's [`QuicTag`]: at random, different from the old process's when this one
/// took over from one.
pub(crate) fn quic_tag() -> QuicTag {
    *TAG.get_or_init(|| random_tag(&[]))
}

fn random_tag(avoid: &[QuicTag]) -> QuicTag {
    use ring::rand::SecureRandom as _;
    let random = ring::rand::SystemRandom::new();
    loop {
        let mut tag = QuicTag::default();
        if random.fill(&mut tag).is_err() {
            tag.fill_with(|| fastrand::u8(..));
        }
        if !avoid.contains(&tag) {
            return tag;
        }
    }
}

/// A channel to the old process: this process's end, and the old process's tag.
pub(crate) type ToOldChannel = (OwnedFd, QuicTag);

/// The channels to the old process of the UDP sockets taken, by their bound address, until
/// their endpoints take them ([`take_channel_to_old`]).
static TO_OLD: Mutex<Vec<(SocketAddr, ToOldChannel)>> = Mutex::new(Vec::new());

/// The channels from the new process of the sockets offered by the last upgrade started, by
/// their bound address: the endpoints take them once it serves ([`take_channel_from_new`]).
static FROM_NEW: Mutex<Vec<(SocketAddr, OwnedFd)>> = Mutex::new(Vec::new());

/// The channel to the old process of the HTTP/3 endpoint bound to `local`, if it was handed
/// over with one. Taken once.
pub(crate) fn take_channel_to_old(local: SocketAddr) -> Option<ToOldChannel> {
    let mut channels = TO_OLD.lock().ok()?;
    let at = channels.iter().position(|(bound, _)| *bound == local)?;
    Some(channels.swap_remove(at).1)
}

/// In a process handed over: the channel from the new process of the HTTP/3 endpoint bound
/// to `local`, which it reads instead of its UDP socket. Taken once.
pub(crate) fn take_channel_from_new(local: SocketAddr) -> Option<OwnedFd> {
    let mut channels = FROM_NEW.lock().ok()?;
    let at = channels.iter().position(|(bound, _)| *bound == local)?;
    Some(channels.swap_remove(at).1)
}

/// One UDP socket handed over.
#[derive(Debug)]
pub(crate) struct HandedUdp {
    /// The address the old process's configuration asked for.
    pub configured: SocketAddr,
    /// The address it is bound to.
    pub bound: SocketAddr,
    /// The socket.
    pub socket: UdpSocket,
    /// Its channel to the old process, if the old process made one.
    pub to_old: Option<ToOldChannel>,
}

impl HandedUdp {
    /// The socket, its channel (if any) left for its endpoint to take.
    pub(super) fn take(self) -> UdpSocket {
        if let (Some(channel), Ok(mut channels)) = (self.to_old, TO_OLD.lock()) {
            channels.push((self.bound, channel));
        }
        self.socket
    }
}

/// One entry of [`QUIC_VAR`]: the UDP socket's descriptor, the channel's, the old tag.
pub(super) type QuicEntry = (RawFd, RawFd, QuicTag);

/// `UDP_FD=CHANNEL_FD=TAG,...`: each UDP descriptor one of `http3` (the `http3` entries'),
/// each channel's none of `named` (every descriptor named elsewhere).
pub(super) fn parse_quic(
    text: &str,
    http3: &[RawFd],
    named: &[RawFd],
) -> Result<Vec<QuicEntry>, HandoverError> {
    let mut entries: Vec<QuicEntry> = Vec::new();
    if text.is_empty() {
        return Ok(entries);
    }
    for entry in text.split(',') {
        let shape = || malformed(QUIC_VAR, format!("{entry:?} is not UDP_FD=CHANNEL_FD=TAG"));
        if entries.len() == super::MAX_SOCKETS {
            return Err(shape());
        }
        let mut parts = entry.split('=');
        let (Some(udp), Some(channel), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(shape());
        };
        let udp: RawFd = udp.parse().map_err(|_| shape())?;
        let channel: RawFd = channel.parse().map_err(|_| shape())?;
        let tag = parse_tag(tag).ok_or_else(shape)?;
        let twice = |fd: RawFd| entries.iter().any(|(u, c, _)| *u == fd || *c == fd);
        if !http3.contains(&udp) || named.contains(&channel) || twice(udp) || twice(channel) {
            return Err(malformed(
                QUIC_VAR,
                format!("{entry:?} names a descriptor not handed over as http3, or one twice"),
            ));
        }
        entries.push((udp, channel, tag));
    }
    Ok(entries)
}

fn parse_tag(text: &str) -> Option<QuicTag> {
    let mut tag = QuicTag::default();
    if text.len() != tag.len() * 2 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    for (i, byte) in tag.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(tag)
}

/// The channel descriptor of a [`QUIC_VAR`] entry, checked: a Unix `SOCK_SEQPACKET` socket
/// (each datagram one message).
pub(super) fn channel(fd: RawFd) -> Result<OwnedFd, HandoverError> {
    let bad = |why: String| malformed(QUIC_VAR, format!("descriptor {fd}: {why}"));
    let owned = checked_fd(fd).map_err(|why| bad(why.to_string()))?;
    seqpacket(&owned).map_err(|why| bad(why.to_string()))?;
    Ok(owned)
}

fn seqpacket(owned: &OwnedFd) -> Result<(), DescriptorError> {
    let socket = socket2::SockRef::from(owned);
    if socket.domain()? != socket2::Domain::UNIX {
        return Err(DescriptorError::NotUnix);
    }
    if socket.r#type()? != socket2::Type::SEQPACKET {
        return Err(DescriptorError::NotSeqpacket);
    }
    Ok(())
}

/// Chooses this process's tag, unlike the old process's (`entries`).
pub(super) fn choose_tag(entries: &[QuicEntry]) {
    let old: Vec<QuicTag> = entries.iter().map(|(.., tag)| *tag).collect();
    let _ = TAG.set(random_tag(&old));
}

/// For each HTTP/3 socket in `sockets`: a channel, the old process's end kept for its
/// endpoint once the new one serves, the new one's to inherit (`inherit`, and `theirs` to
/// keep until it is started); the [`QUIC_VAR`] text naming them.
pub(super) fn channels(
    sockets: &[Offered],
    inherit: &mut Vec<RawFd>,
    theirs: &mut Vec<OwnedFd>,
) -> std::io::Result<String> {
    let mut text = String::new();
    let mut ours = Vec::new();
    let tag = quic_tag();
    for offered in sockets.iter().filter(|o| o.kind == super::Kind::Http3) {
        let (old_end, new_end) =
            socket2::Socket::pair(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None)?;
        if !text.is_empty() {
            text.push(',');
        }
        let (udp, channel) = (offered.fd.as_raw_fd(), new_end.as_raw_fd());
        text.push_str(&format!("{udp}={channel}={:02x}{:02x}", tag[0], tag[1]));
        inherit.push(channel);
        theirs.push(OwnedFd::from(new_end));
        ours.push((offered.bound, OwnedFd::from(old_end)));
    }
    // The last upgrade's, replacing an earlier one's that failed.
    if let Ok(mut channels) = FROM_NEW.lock() {
        *channels = ours;
    }
    Ok(text)
}

/// The socket in `owned`, if it is a bound IP datagram socket, set non-blocking.
pub(super) fn bound_udp(owned: OwnedFd) -> Result<UdpSocket, DescriptorError> {
    let socket = socket2::Socket::from(owned);
    let domain = socket.domain()?;
    if domain != socket2::Domain::IPV4 && domain != socket2::Domain::IPV6 {
        return Err(DescriptorError::NotIp);
    }
    if socket.r#type()? != socket2::Type::DGRAM {
        return Err(DescriptorError::NotDatagram);
    }
    let bound = socket.local_addr()?.as_socket();
    if bound.is_none_or(|address| address.port() == 0) {
        return Err(DescriptorError::NotBound);
    }
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Where in `sockets` the one for `address` is: the first configured with that address, or
/// else the one bound to it (when `address` names a port).
pub(super) fn position(sockets: &[HandedUdp], address: SocketAddr) -> Option<usize> {
    sockets
        .iter()
        .position(|h| h.configured == address)
        .or_else(|| {
            (address.port() != 0)
                .then(|| sockets.iter().position(|h| h.bound == address))
                .flatten()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bound_udp_socket_is_taken() {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(bound_udp(OwnedFd::from(udp)).is_ok());
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(bound_udp(OwnedFd::from(tcp)).is_err());
        let unbound = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None);
        assert!(bound_udp(OwnedFd::from(unbound.unwrap())).is_err());
    }

    #[test]
    fn parse_quic_reads_entries_and_refuses_hostile_text() {
        assert_eq!(
            parse_quic("7=9=a1ff", &[7], &[7, 8]).unwrap(),
            vec![(7, 9, [0xa1, 0xff])]
        );
        assert!(parse_quic("", &[], &[]).unwrap().is_empty());
        for text in [
            "7=9",
            "7=9=a1",
            "7=9=a1ff00",
            "7=9=zzzz",
            "7=9=é1",
            "8=9=a1ff",
            "7=7=a1ff",
            "7=8=a1ff",
            "7=9=a1ff,7=10=a1ff",
            "7=9=a1ff=1",
            ",",
        ] {
            assert!(
                parse_quic(text, &[7], &[7, 8]).is_err(),
                "{text:?} was taken"
            );
        }
    }

    #[test]
    fn a_tag_with_a_sign_is_refused() {
        // `u8::from_str_radix` takes a leading `+`: "+f+f" was read as the tag 0f0f.
        for text in ["+f+f", "+fff", "0x0f"] {
            assert!(
                parse_quic(&format!("7=9={text}"), &[7], &[7, 8]).is_err(),
                "{text:?} was taken"
            );
        }
    }

    #[test]
    fn a_channel_that_is_not_a_seqpacket_socket_is_refused() {
        // A Unix stream socket was taken: the datagrams sent on it would run together.
        let (stream, _other) = std::os::unix::net::UnixStream::pair().unwrap();
        let stream = OwnedFd::from(stream);
        let fd = stream.as_raw_fd();
        std::mem::forget(stream);
        let error = channel(fd)
            .expect_err("a stream socket was taken")
            .to_string();
        assert!(error.contains("SOCK_SEQPACKET"), "{error}");
        let (seqpacket, _other) =
            socket2::Socket::pair(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None).unwrap();
        let seqpacket = OwnedFd::from(seqpacket);
        let fd = seqpacket.as_raw_fd();
        std::mem::forget(seqpacket);
        assert!(channel(fd).is_ok());
    }

    #[test]
    fn a_new_tag_differs_from_the_old_one() {
        for _ in 0..100 {
            let old = random_tag(&[]);
            assert_ne!(random_tag(&[old]), old);
        }
    }
}
