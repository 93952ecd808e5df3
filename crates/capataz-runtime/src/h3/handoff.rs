//! The socket an HTTP/3 endpoint reads and writes: the listener's UDP socket, shared by the
//! two processes of a binary upgrade until the old one exits, and the channel between them
//! (a Unix `SOCK_SEQPACKET` socket pair the handover sets up) by which the new process passes
//! on the datagrams of the old process's connections (`h3/cid.rs` says whose a datagram is).
//!
//! - A process that took over from one still draining ([`ToOld`]) reads every datagram, and
//!   sends each of the old process's to it, with its source address, destination address and
//!   ECN bits in a [`HEADER`]-byte header: never waiting (a full channel drops the datagram,
//!   which QUIC sends again), until the old process has gone (a send fails), from when on
//!   nothing is looked at any more. A process with nobody to pass on to pays, per batch of
//!   datagrams read, two branches on an `Option` (nothing to pass on, nothing read from a
//!   new process: one load of the `OnceLock`), no call, lock or copy.
//! - A process handed over ([`SharedSocket::read_from_new`]) stops reading the UDP socket and
//!   reads the channel instead, and goes on sending on the UDP socket (the same address, so
//!   its replies come from where its clients expect them). Should the channel end (the new
//!   process exited, or does not serve HTTP/3 on that socket), it reads the UDP socket again:
//!   it is the only one left reading it.
//!
//! What comes on the channel is trusted as far as its sender is: the other capataz process.
//! It is still read with every length checked; a message that does not make sense is dropped.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};

use prometheus_client::metrics::counter::Counter;
use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use super::cid::{route, Route, Tag};

/// Bytes ahead of each datagram on the channel: flags, ECN bits, the source port, an IPv6
/// source's scope id, the source address and the destination address (16 bytes each).
pub(crate) const HEADER: usize = 40;

/// The largest UDP payload: no message on the channel is longer than this and its header.
const MAX_DATAGRAM: usize = 65_535;

/// Flags of the header's first byte.
const SOURCE_V6: u8 = 1;
const DESTINATION: u8 = 2;
const DESTINATION_V6: u8 = 4;

/// `MSG_NOSIGNAL`: a send to a channel whose reader has gone fails with `EPIPE`, no signal.
#[cfg(target_os = "linux")]
const NO_SIGNAL: i32 = 0x4000;
#[cfg(not(target_os = "linux"))]
const NO_SIGNAL: i32 = 0;

/// What a process that took over passes on to the old one.
#[derive(Debug)]
pub(crate) struct ToOld {
    channel: socket2::Socket,
    old: Tag,
    gone: AtomicBool,
    counts: Forwarded,
}

/// The counters of the datagrams passed on to the old process.
#[derive(Clone, Debug)]
pub(crate) struct Forwarded {
    /// Passed on.
    pub(crate) sent: Counter,
    /// Dropped: the channel was full, or the old process had just gone.
    pub(crate) dropped: Counter,
}

impl ToOld {
    /// Passes on, through `channel` (this process's end of the pair), the datagrams of the
    /// connections whose IDs start with `old`.
    pub(crate) fn new(channel: OwnedFd, old: Tag, counts: Forwarded) -> io::Result<ToOld> {
        let channel = socket2::Socket::from(channel);
        channel.set_nonblocking(true)?;
        Ok(ToOld {
            channel,
            old,
            gone: AtomicBool::new(false),
            counts,
        })
    }

    /// Sends the old process's datagrams among the first `n` of `bufs` to it, and leaves the
    /// rest in place: a buffer holding several datagrams (`stride` apart, by GRO) keeps
    /// those that stay, moved together, its `len` shortened (to 0 when none stays).
    fn pass_on(&self, own: Tag, bufs: &mut [IoSliceMut<'_>], metas: &mut [RecvMeta], n: usize) {
        for (buf, meta) in bufs.iter_mut().zip(metas.iter_mut()).take(n) {
            let len = meta.len.min(buf.len());
            let stride = if meta.stride == 0 { len } else { meta.stride };
            let (mut at, mut kept) = (0, 0);
            while at < len {
                let end = (at + stride).min(len);
                if route(&buf[at..end], own, self.old) == Route::Old {
                    self.send(meta, &buf[at..end]);
                } else {
                    buf.copy_within(at..end, kept);
                    kept += end - at;
                }
                at = end;
            }
            meta.len = kept;
        }
    }

    fn send(&self, meta: &RecvMeta, datagram: &[u8]) {
        if self.gone.load(Ordering::Relaxed) {
            self.counts.dropped.inc();
            return;
        }
        let header = encode(meta);
        let parts = [IoSlice::new(&header), IoSlice::new(datagram)];
        match self.channel.send_vectored_with_flags(&parts, NO_SIGNAL) {
            Ok(_) => {
                self.counts.sent.inc();
            }
            Err(error)
                if error.kind() == io::ErrorKind::WouldBlock
                    || error.raw_os_error() == Some(ENOBUFS) =>
            {
                self.counts.dropped.inc();
            }
            Err(error) => {
                self.counts.dropped.inc();
                if !self.gone.swap(true, Ordering::Relaxed) {
                    tracing::info!(%error, "the old process no longer reads its HTTP/3 datagrams (it has exited): none is passed on from now on");
                }
            }
        }
    }
}

/// `ENOBUFS`: the kernel had no room for the message (dropped, as a full channel).
const ENOBUFS: i32 = 105;

/// A handed-over process's reading end of the channel.
#[derive(Debug)]
struct FromNew {
    /// A `SOCK_SEQPACKET` socket: tokio has no type of its own for one, and `UnixDatagram`'s
    /// calls (`recv`, readiness) are the same on it, an end of file included (0 bytes read:
    /// nothing sends an empty message).
    channel: tokio::net::UnixDatagram,
    /// The channel ended: the UDP socket is read again.
    ended: AtomicBool,
    /// One message read whole, before its datagram is copied where quinn wants it.
    scratch: Mutex<Vec<u8>>,
}

/// An HTTP/3 endpoint's socket (see the module's documentation).
#[derive(Debug)]
pub(crate) struct SharedSocket {
    udp: Arc<dyn AsyncUdpSocket>,
    own: Tag,
    to_old: Option<ToOld>,
    from_new: OnceLock<FromNew>,
}

impl SharedSocket {
    /// `udp` (quinn's socket on the listener's UDP socket) for a process whose connection
    /// IDs start with `own`, passing on the old process's datagrams through `to_old`.
    pub(crate) fn new(udp: Arc<dyn AsyncUdpSocket>, own: Tag, to_old: Option<ToOld>) -> Self {
        SharedSocket {
            udp,
            own,
            to_old,
            from_new: OnceLock::new(),
        }
    }

    /// Reads the datagrams the new process passes on through `channel` (this process's end)
    /// instead of the UDP socket, from now on. The endpoint must then be woken to poll this
    /// socket anew (`Endpoint::rebind_abstract` with this same socket).
    pub(crate) fn read_from_new(&self, channel: OwnedFd) -> io::Result<()> {
        let channel = std::os::unix::net::UnixDatagram::from(channel);
        channel.set_nonblocking(true)?;
        let from = FromNew {
            channel: tokio::net::UnixDatagram::from_std(channel)?,
            ended: AtomicBool::new(false),
            scratch: Mutex::new(vec![0; HEADER + MAX_DATAGRAM]),
        };
        self.from_new
            .set(from)
            .map_err(|_| io::Error::other("the endpoint reads from a new process already"))
    }
}

impl FromNew {
    /// Reads the messages waiting into `bufs` (one datagram each); `Ok(None)` once the
    /// channel has ended.
    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        metas: &mut [RecvMeta],
    ) -> Poll<Option<usize>> {
        let Ok(mut scratch) = self.scratch.lock() else {
            return Poll::Ready(None);
        };
        let mut filled = 0;
        let room = bufs.len().min(metas.len());
        loop {
            if ready!(self.channel.poll_recv_ready(cx)).is_err() {
                return Poll::Ready(None);
            }
            while filled < room {
                match self.channel.try_recv(&mut scratch[..]) {
                    Ok(n) if n > 0 => {
                        if decode(&scratch[..n], &mut bufs[filled], &mut metas[filled]) {
                            filled += 1;
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    // An end of file (the new process closed its end), or the channel failed.
                    _ => return Poll::Ready((filled > 0).then_some(filled)),
                }
            }
            if filled > 0 {
                return Poll::Ready(Some(filled));
            }
        }
    }
}

impl AsyncUdpSocket for SharedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.udp.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.udp.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        metas: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let from_new = self
            .from_new
            .get()
            .filter(|from| !from.ended.load(Ordering::Relaxed));
        let n = match from_new {
            Some(from) => match ready!(from.poll_recv(cx, bufs, metas)) {
                Some(n) => n,
                None => {
                    from.ended.store(true, Ordering::Relaxed);
                    tracing::info!("the new process no longer passes HTTP/3 datagrams on: this one reads its UDP socket again");
                    ready!(self.udp.poll_recv(cx, bufs, metas))?
                }
            },
            None => ready!(self.udp.poll_recv(cx, bufs, metas))?,
        };
        if let Some(to_old) = self
            .to_old
            .as_ref()
            .filter(|to| !to.gone.load(Ordering::Relaxed))
        {
            to_old.pass_on(self.own, bufs, metas, n);
        }
        Poll::Ready(Ok(n))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.udp.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.udp.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.udp.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.udp.may_fragment()
    }
}

/// The header of a datagram received with `meta`.
fn encode(meta: &RecvMeta) -> [u8; HEADER] {
    let mut header = [0u8; HEADER];
    header[1] = meta.ecn.map_or(0, |ecn| ecn as u8);
    header[2..4].copy_from_slice(&meta.addr.port().to_be_bytes());
    match meta.addr {
        SocketAddr::V4(source) => header[8..12].copy_from_slice(&source.ip().octets()),
        SocketAddr::V6(source) => {
            header[0] |= SOURCE_V6;
            header[4..8].copy_from_slice(&source.scope_id().to_be_bytes());
            header[8..24].copy_from_slice(&source.ip().octets());
        }
    }
    match meta.dst_ip {
        Some(IpAddr::V4(to)) => {
            header[0] |= DESTINATION;
            header[24..28].copy_from_slice(&to.octets());
        }
        Some(IpAddr::V6(to)) => {
            header[0] |= DESTINATION | DESTINATION_V6;
            header[24..40].copy_from_slice(&to.octets());
        }
        None => {}
    }
    header
}

/// Reads `message` (a header, then a datagram) into `buf` and `meta`; `false` (nothing
/// written) if it is too short, empty or longer than `buf`.
fn decode(message: &[u8], buf: &mut [u8], meta: &mut RecvMeta) -> bool {
    let (Some(header), Some(datagram)) = (message.get(..HEADER), message.get(HEADER..)) else {
        return false;
    };
    if datagram.is_empty() || datagram.len() > buf.len() {
        return false;
    }
    let octets4 = |at: usize| {
        let mut octets = [0u8; 4];
        octets.copy_from_slice(&header[at..at + 4]);
        Ipv4Addr::from(octets)
    };
    let octets16 = |at: usize| {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&header[at..at + 16]);
        Ipv6Addr::from(octets)
    };
    let flags = header[0];
    let port = u16::from_be_bytes([header[2], header[3]]);
    meta.addr = if flags & SOURCE_V6 != 0 {
        let scope = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        SocketAddr::V6(SocketAddrV6::new(octets16(8), port, 0, scope))
    } else {
        SocketAddr::V4(SocketAddrV4::new(octets4(8), port))
    };
    meta.dst_ip = match (flags & DESTINATION != 0, flags & DESTINATION_V6 != 0) {
        (false, _) => None,
        (true, false) => Some(IpAddr::V4(octets4(24))),
        (true, true) => Some(IpAddr::V6(octets16(24))),
    };
    meta.ecn = EcnCodepoint::from_bits(header[1]);
    buf[..datagram.len()].copy_from_slice(datagram);
    meta.len = datagram.len();
    meta.stride = datagram.len();
    true
}

#[cfg(test)]
mod tests;
