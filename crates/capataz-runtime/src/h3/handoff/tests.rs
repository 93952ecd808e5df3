use super::*;
use std::io::Read as _;

use quinn::Runtime as _;

const OWN: Tag = [0xa1, 0x01];
const OLD: Tag = [0xb2, 0x02];

fn counts() -> Forwarded {
    Forwarded {
        sent: Counter::default(),
        dropped: Counter::default(),
    }
}

/// A short header packet of `len` bytes for a connection ID starting with `tag`.
fn short(tag: Tag, len: usize, fill: u8) -> Vec<u8> {
    let mut packet = vec![0x40];
    packet.extend_from_slice(&tag);
    packet.resize(len, fill);
    packet
}

fn meta(addr: SocketAddr, len: usize, stride: usize) -> RecvMeta {
    RecvMeta {
        addr,
        len,
        stride,
        ecn: Some(EcnCodepoint::Ect0),
        dst_ip: Some("127.0.0.1".parse().unwrap()),
    }
}

fn pair() -> (OwnedFd, OwnedFd) {
    let (a, b) = socket2::Socket::pair(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None)
        .expect("a socket pair");
    (OwnedFd::from(a), OwnedFd::from(b))
}

#[test]
fn a_header_carries_the_source_destination_and_ecn() {
    for (source, to) in [
        (
            "192.0.2.7:4433",
            Some("198.51.100.1".parse::<IpAddr>().unwrap()),
        ),
        ("[2001:db8::1]:443", Some("2001:db8::2".parse().unwrap())),
        ("[fe80::1%3]:9", None),
    ] {
        let mut sent = meta(source.parse().unwrap(), 5, 5);
        sent.dst_ip = to;
        let mut message = encode(&sent).to_vec();
        message.extend_from_slice(b"hello");
        let (mut buf, mut got) = ([0u8; 64], RecvMeta::default());
        assert!(decode(&message, &mut buf, &mut got));
        assert_eq!(got.addr, sent.addr);
        assert_eq!(got.dst_ip, to);
        assert_eq!(got.ecn, Some(EcnCodepoint::Ect0));
        assert_eq!((&buf[..got.len], got.stride), (&b"hello"[..], 5));
    }
}

#[test]
fn a_message_that_makes_no_sense_is_dropped() {
    let (mut buf, mut got) = ([0u8; 8], RecvMeta::default());
    assert!(!decode(&[], &mut buf, &mut got));
    assert!(!decode(&[0xff; HEADER - 1], &mut buf, &mut got));
    // A header and no datagram, and a datagram longer than the buffer.
    assert!(!decode(&[0xff; HEADER], &mut buf, &mut got));
    assert!(!decode(&[0xff; HEADER + 9], &mut buf, &mut got));
    assert!(decode(&[0xff; HEADER + 8], &mut buf, &mut got));
}

#[test]
fn the_old_process_s_datagrams_are_passed_on_and_the_rest_kept_in_order() {
    let (ours, theirs) = pair();
    let to_old = ToOld::new(ours, OLD, counts()).unwrap();
    let theirs = socket2::Socket::from(theirs);
    let source: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    // One GRO buffer: own, old, own, old (shorter, last); and a buffer of one old datagram.
    let mut one = Vec::new();
    one.extend(short(OWN, 30, 1));
    one.extend(short(OLD, 30, 2));
    one.extend(short(OWN, 30, 3));
    one.extend(short(OLD, 20, 4));
    let mut two = short(OLD, 25, 5);
    let mut metas = [meta(source, one.len(), 30), meta(source, two.len(), 25)];
    let mut bufs = [IoSliceMut::new(&mut one), IoSliceMut::new(&mut two)];
    to_old.pass_on(OWN, &mut bufs, &mut metas, 2);
    assert_eq!((metas[0].len, metas[0].stride, metas[1].len), (60, 30, 0));
    let mut kept = short(OWN, 30, 1);
    kept.extend(short(OWN, 30, 3));
    assert_eq!(&bufs[0][..60], &kept[..]);
    assert_eq!(to_old.counts.sent.get(), 3);
    let mut message = [0u8; 200];
    for (len, fill) in [(30, 2), (20, 4), (25, 5)] {
        let n = (&theirs).read(&mut message).unwrap();
        let (mut buf, mut got) = ([0u8; 64], RecvMeta::default());
        assert!(decode(&message[..n], &mut buf, &mut got));
        assert_eq!(&buf[..got.len], &short(OLD, len, fill)[..]);
        assert_eq!(got.addr, source);
    }
}

/// A [`SharedSocket`] on a new loopback UDP socket, and that socket's address.
fn shared(to_old: Option<ToOld>) -> (SharedSocket, SocketAddr) {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = udp.local_addr().unwrap();
    let udp = quinn::TokioRuntime.wrap_udp_socket(udp).unwrap();
    (SharedSocket::new(udp, OWN, to_old), local)
}

/// One datagram read from `socket`: its bytes left for this process, and its source.
async fn read_one(socket: &SharedSocket) -> (Vec<u8>, SocketAddr) {
    let mut storage = [0u8; 2048];
    let mut metas = [RecvMeta::default()];
    let n = std::future::poll_fn(|cx| {
        let mut bufs = [IoSliceMut::new(&mut storage)];
        socket.poll_recv(cx, &mut bufs, &mut metas)
    })
    .await
    .unwrap();
    assert_eq!(n, 1);
    (storage[..metas[0].len].to_vec(), metas[0].addr)
}

#[tokio::test]
async fn nothing_is_passed_on_once_the_old_process_has_gone() {
    let (ours, theirs) = pair();
    let (socket, local) = shared(Some(ToOld::new(ours, OLD, counts()).unwrap()));
    drop(theirs);
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(&short(OLD, 40, 9), local).unwrap();
    assert!(
        read_one(&socket).await.0.is_empty(),
        "dropped: its process has gone"
    );
    let to_old = socket.to_old.as_ref().unwrap();
    assert!(to_old.gone.load(Ordering::Relaxed));
    assert_eq!(
        (to_old.counts.sent.get(), to_old.counts.dropped.get()),
        (0, 1)
    );
    // From then on every datagram is this process's, not looked at.
    client.send_to(&short(OLD, 40, 8), local).unwrap();
    assert_eq!(read_one(&socket).await.0, short(OLD, 40, 8));
    assert_eq!(to_old.counts.dropped.get(), 1);
}

#[test]
fn a_full_channel_drops_what_does_not_fit() {
    let (ours, _theirs) = pair();
    let to_old = ToOld::new(ours, OLD, counts()).unwrap();
    let source: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let mut sent = 0;
    while to_old.counts.dropped.get() == 0 {
        let mut datagram = short(OLD, 1200, 7);
        let mut metas = [meta(source, 1200, 1200)];
        let mut bufs = [IoSliceMut::new(&mut datagram)];
        to_old.pass_on(OWN, &mut bufs, &mut metas, 1);
        sent += 1;
        assert!(sent < 100_000, "the channel never filled");
    }
    assert!(!to_old.gone.load(Ordering::Relaxed));
}

#[tokio::test]
async fn a_handed_over_socket_reads_the_channel_then_the_udp_socket_once_it_ends() {
    let (socket, local) = shared(None);
    let (ours, theirs) = pair();
    socket.read_from_new(ours).unwrap();
    let theirs = socket2::Socket::from(theirs);
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // Read from the channel only: a datagram on the UDP socket waits.
    client.send_to(&short(OWN, 30, 1), local).unwrap();
    let source: SocketAddr = "127.0.0.1:6000".parse().unwrap();
    let mut message = encode(&meta(source, 0, 0)).to_vec();
    message.extend(short(OLD, 30, 2));
    theirs.send(&message).unwrap();
    assert_eq!(read_one(&socket).await, (short(OLD, 30, 2), source));
    // The new process's end closes: the UDP socket is read again.
    drop(theirs);
    let (datagram, from) = read_one(&socket).await;
    assert_eq!(
        (datagram, from),
        (short(OWN, 30, 1), client.local_addr().unwrap())
    );
}

proptest::proptest! {
    /// Any GRO buffer (any bytes, any stride, up to the largest UDP payload): no panic; the
    /// datagrams kept are the others, in order; each of the old process's is sent or dropped.
    #[test]
    fn any_gro_buffer_is_split_without_loss_or_panic(
        bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..MAX_DATAGRAM),
        stride in 0usize..3000,
        own_every in 1usize..4,
    ) {
        let (ours, _theirs) = pair();
        let to_old = ToOld::new(ours, OLD, counts()).unwrap();
        let mut buf = bytes.clone();
        let len = buf.len();
        let step = if stride == 0 { len.max(1) } else { stride };
        // Every `own_every`th segment made this process's, so both routes are taken.
        for (i, at) in (0..len).step_by(step).enumerate() {
            if i % own_every == 0 && at + 3 <= len {
                buf[at] = 0x40;
                buf[at + 1..at + 3].copy_from_slice(&OWN);
            }
        }
        let segments: Vec<Vec<u8>> = buf.chunks(step).map(<[u8]>::to_vec).collect();
        let source: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mut metas = [meta(source, len, stride)];
        let mut bufs = [IoSliceMut::new(&mut buf)];
        to_old.pass_on(OWN, &mut bufs, &mut metas, 1);
        let (kept, old): (Vec<_>, Vec<_>) =
            segments.iter().partition(|s| route(s, OWN, OLD) == Route::Here);
        let kept: Vec<u8> = kept.into_iter().flatten().copied().collect();
        proptest::prop_assert_eq!(&bufs[0][..metas[0].len], &kept[..]);
        proptest::prop_assert_eq!(
            to_old.counts.sent.get() + to_old.counts.dropped.get(),
            old.len() as u64
        );
    }
}
