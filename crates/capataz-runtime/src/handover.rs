//! Handing the listening sockets from one capataz process to the next (a binary upgrade),
//! nginx style: the old process starts the new one with its listening sockets inherited
//! (their descriptors left open across `exec`), and a socket pair through which the new one
//! says when it serves.
//!
//! The protocol, between two capataz processes only, is two environment variables the new
//! process reads once and removes at its start (so its own children inherit neither):
//!
//! - `CAPATAZ_HANDOVER_LISTENERS`: `KIND:FD=CONFIGURED=BOUND` entries separated by commas, one
//!   per listening socket: its kind (`listener` for a client listener, `admin` for the admin
//!   listener), the descriptor number, the address its configuration asked for
//!   (`127.0.0.1:0`, say) and the one it is bound to. A listener on a Unix socket is
//!   `unix:FD=PATH`, its socket file's path percent-encoded (`unix.rs`); a TLS listener's
//!   HTTP/3 UDP socket is `http3:FD=CONFIGURED=BOUND` (`udp.rs`).
//! - `CAPATAZ_HANDOVER_QUIC`: for each HTTP/3 UDP socket, the channel by which the new process
//!   passes the old process's QUIC datagrams on to it (`udp.rs`).
//! - `CAPATAZ_HANDOVER_READY_FD`: the descriptor of the new process's end of the socket pair.
//!   It writes `READY\n` there once it accepts connections; the old process then stops
//!   accepting and drains. An end of file first means the new process failed.
//!
//! The same kernel socket is shared, so nothing is closed or re-bound at any point: a
//! connection waiting in the accept queue is taken by whichever process accepts next, and when
//! the old process closes its descriptors the socket stays open in the new one. (A second
//! socket bound with `SO_REUSEPORT` would have a queue of its own, and connections queued on
//! the old one would be reset when it closes.)
//!
//! Every descriptor named in the environment is checked before it is used: open, a TCP socket
//! (a Unix stream socket for a `unix` entry, a bound UDP socket for `http3`, a Unix `SOCK_SEQPACKET` socket for a QUIC channel), listening, not one of the standard streams,
//! named once. Anything else is an error that stops the new process, which leaves the old one
//! serving.
//!
//! A Unix socket's file stays where it is, bound to the same socket: the old process leaves it
//! once the new one said it serves ([`handed_over`]), and the new one removes it when it stops
//! (or at once, when its configuration no longer listens there).

mod udp;
mod unix;

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) use udp::{quic_tag, QuicTag};
pub(crate) use udp::{take_channel_from_new, take_channel_to_old, ToOldChannel};
use udp::{HandedUdp, QUIC_VAR};
use unix::encode_path;
use unix::HandedUnix;

/// The listening sockets handed over.
pub(crate) const LISTENERS_VAR: &str = "CAPATAZ_HANDOVER_LISTENERS";
/// The new process's end of the readiness socket pair.
pub(crate) const READY_VAR: &str = "CAPATAZ_HANDOVER_READY_FD";
/// What the new process writes once it serves.
pub const READY_MESSAGE: &[u8] = b"READY\n";
/// The most sockets one handover carries (listeners and the admin listener).
const MAX_SOCKETS: usize = 1024;

/// Why the handed-over sockets cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The environment is malformed.
    #[error("{var} is malformed ({why}); it is set only by a capataz process upgrading itself")]
    Malformed {
        /// The variable.
        var: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A descriptor is not a listening TCP socket.
    #[error("descriptor {fd} in {LISTENERS_VAR} is not a listening socket of its kind: {why}")]
    NotAListener {
        /// The descriptor.
        fd: RawFd,
        /// What is wrong (in the message, so not also its source: `{:#}` would say it twice).
        why: DescriptorError,
    },
}

/// Why an inherited descriptor cannot be taken as a listening TCP socket.
#[derive(Debug, thiserror::Error)]
pub enum DescriptorError {
    /// 0, 1 or 2 (or negative).
    #[error("descriptor {0} is a standard stream")]
    StandardStream(RawFd),
    /// Not open in this process.
    #[error("descriptor {0} is not open")]
    NotOpen(RawFd),
    /// Close-on-exec could not be set.
    #[error("descriptor {fd}: {source}")]
    CloseOnExec {
        /// The descriptor.
        fd: RawFd,
        /// The system's error.
        source: std::io::Error,
    },
    /// The socket's domain, type or state could not be read, or it could not be made
    /// non-blocking.
    #[error(transparent)]
    Socket(#[from] std::io::Error),
    /// Not an IPv4 or IPv6 socket.
    #[error("not an IP socket")]
    NotIp,
    /// Not a Unix socket.
    #[error("not a Unix socket")]
    NotUnix,
    /// Not a datagram socket.
    #[error("not a datagram (UDP) socket")]
    NotDatagram,
    /// A datagram socket bound to no port.
    #[error("not bound")]
    NotBound,
    /// Not a stream socket.
    #[error("not a stream socket")]
    NotStream,
    /// Not a `SOCK_SEQPACKET` socket (a QUIC channel).
    #[error("not a SOCK_SEQPACKET socket")]
    NotSeqpacket,
    /// A stream socket that is not listening.
    #[error("not listening")]
    NotListening,
}

/// What a listening socket is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A client listener (`[[listeners]]`).
    Listener,
    /// The admin listener (`[admin]`).
    Admin,
    /// A client listener on a Unix socket (`address = "unix:/path"`).
    Unix,
    /// A TLS listener's HTTP/3 endpoint (`[listeners.tls.http3]`, UDP).
    Http3,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Listener => "listener",
            Kind::Admin => "admin",
            Kind::Unix => "unix",
            Kind::Http3 => "http3",
        }
    }

    fn parse(text: &str) -> Option<Kind> {
        match text {
            "listener" => Some(Kind::Listener),
            "admin" => Some(Kind::Admin),
            "unix" => Some(Kind::Unix),
            "http3" => Some(Kind::Http3),
            _ => None,
        }
    }
}

/// One listening socket handed over.
#[derive(Debug)]
pub(crate) struct Handed {
    /// What it is for.
    pub kind: Kind,
    /// The address the old process's configuration asked for.
    pub configured: SocketAddr,
    /// The address it is bound to.
    pub bound: SocketAddr,
    /// The socket.
    pub socket: std::net::TcpListener,
}

/// What a new process inherited from the old one: the listening sockets not yet taken, and
/// the readiness channel.
#[derive(Debug)]
pub struct Inherited {
    sockets: Vec<Handed>,
    unix: Vec<HandedUnix>,
    udp: Vec<HandedUdp>,
    ready: UnixStream,
}

impl Inherited {
    /// Reads and removes the handover variables. `Ok(None)` when there are none (a plain
    /// start). Call it at the start of `main`, before any thread is started: it changes the
    /// process's environment.
    pub fn from_env() -> Result<Option<Inherited>, HandoverError> {
        let listeners = std::env::var_os(LISTENERS_VAR);
        let ready = std::env::var_os(READY_VAR);
        let quic = std::env::var_os(QUIC_VAR);
        std::env::remove_var(LISTENERS_VAR);
        std::env::remove_var(READY_VAR);
        std::env::remove_var(QUIC_VAR);
        Inherited::from_vars(listeners, ready, quic)
    }

    /// [`Inherited::from_env`] on the three variables' values.
    fn from_vars(
        listeners: Option<OsString>,
        ready: Option<OsString>,
        quic: Option<OsString>,
    ) -> Result<Option<Inherited>, HandoverError> {
        match (listeners, ready) {
            (None, None) if quic.is_some() => {
                Err(malformed(QUIC_VAR, format!("set without {LISTENERS_VAR}")))
            }
            (None, None) => Ok(None),
            (Some(listeners), Some(ready)) => {
                Inherited::parse(&listeners, &ready, quic.as_ref()).map(Some)
            }
            (None, Some(_)) => Err(malformed(READY_VAR, format!("set without {LISTENERS_VAR}"))),
            (Some(_), None) => Err(malformed(LISTENERS_VAR, format!("set without {READY_VAR}"))),
        }
    }

    fn parse(
        listeners: &OsString,
        ready: &OsString,
        quic: Option<&OsString>,
    ) -> Result<Inherited, HandoverError> {
        let listeners = listeners
            .to_str()
            .ok_or_else(|| malformed(LISTENERS_VAR, "not UTF-8".into()))?;
        let (entries, unix_entries) = parse_entries(listeners)?;
        let ready_fd = ready
            .to_str()
            .and_then(|s| s.parse::<RawFd>().ok())
            .ok_or_else(|| malformed(READY_VAR, "not a descriptor number".into()))?;
        if entries.iter().any(|(_, fd, ..)| *fd == ready_fd)
            || unix_entries.iter().any(|(fd, _)| *fd == ready_fd)
        {
            return Err(malformed(
                READY_VAR,
                "names a listening socket's descriptor".into(),
            ));
        }
        let http3: Vec<RawFd> = entries
            .iter()
            .filter(|(kind, ..)| *kind == Kind::Http3)
            .map(|(_, fd, ..)| *fd)
            .collect();
        let named: Vec<RawFd> = entries
            .iter()
            .map(|(_, fd, ..)| *fd)
            .chain(unix_entries.iter().map(|(fd, _)| *fd))
            .chain([ready_fd])
            .collect();
        let quic = match quic {
            Some(text) => {
                let text = text
                    .to_str()
                    .ok_or_else(|| malformed(QUIC_VAR, "not UTF-8".into()))?;
                udp::parse_quic(text, &http3, &named)?
            }
            None => Vec::new(),
        };
        udp::choose_tag(&quic);
        let ready = checked_fd(ready_fd).map_err(|why| malformed(READY_VAR, why.to_string()))?;
        let ready = socket2::Socket::from(ready);
        if ready
            .domain()
            .map_err(|e| malformed(READY_VAR, e.to_string()))?
            != socket2::Domain::UNIX
        {
            return Err(malformed(READY_VAR, "not a unix socket".into()));
        }
        let ready = UnixStream::from(OwnedFd::from(ready));
        let mut sockets = Vec::with_capacity(entries.len());
        let mut udp = Vec::new();
        for (kind, fd, configured, bound) in entries {
            let owned = checked_fd(fd).map_err(|why| HandoverError::NotAListener { fd, why })?;
            if kind == Kind::Http3 {
                let socket =
                    udp::bound_udp(owned).map_err(|why| HandoverError::NotAListener { fd, why })?;
                let to_old = match quic.iter().find(|(udp, ..)| *udp == fd) {
                    Some(&(_, channel, tag)) => Some((udp::channel(channel)?, tag)),
                    None => None,
                };
                udp.push(HandedUdp {
                    configured,
                    bound,
                    socket,
                    to_old,
                });
                continue;
            }
            let socket =
                listening_tcp(owned).map_err(|why| HandoverError::NotAListener { fd, why })?;
            sockets.push(Handed {
                kind,
                configured,
                bound,
                socket,
            });
        }
        let mut unix = Vec::with_capacity(unix_entries.len());
        for (fd, path) in unix_entries {
            let owned = checked_fd(fd).map_err(|why| HandoverError::NotAListener { fd, why })?;
            let socket = unix::listening_unix(owned)
                .map_err(|why| HandoverError::NotAListener { fd, why })?;
            unix.push(HandedUnix::new(path, socket));
        }
        Ok(Inherited {
            sockets,
            unix,
            udp,
            ready,
        })
    }

    /// The inherited socket of the Unix listener at `path`, if one was handed over. Taken once.
    pub fn take_unix(&mut self, path: &Path) -> Option<std::os::unix::net::UnixListener> {
        let at = self.unix.iter().position(|h| h.path == path)?;
        Some(self.unix.swap_remove(at).socket)
    }

    /// The inherited UDP socket of the HTTP/3 endpoint configured at `address`, if one was
    /// handed over (found as [`Inherited::take`] finds a TCP socket). Taken once.
    pub fn take_udp(&mut self, address: SocketAddr) -> Option<std::net::UdpSocket> {
        let at = udp::position(&self.udp, address)?;
        Some(self.udp.swap_remove(at).take())
    }

    /// The paths of the Unix sockets nobody took (closed, and their files removed, by
    /// [`Inherited::ready`]).
    pub fn untaken_unix(&self) -> Vec<PathBuf> {
        self.unix.iter().map(|h| h.path.clone()).collect()
    }

    /// The inherited socket of `kind` for a listener configured at `address`, if one was
    /// handed over: the first the old process configured with the same address, or else the
    /// one bound to it (a port 0 listener of the old configuration is found by the port it
    /// got). Each socket is taken once.
    pub fn take(&mut self, kind: Kind, address: SocketAddr) -> Option<std::net::TcpListener> {
        let at = self
            .sockets
            .iter()
            .position(|h| h.kind == kind && h.configured == address)
            .or_else(|| {
                (address.port() != 0)
                    .then(|| {
                        self.sockets
                            .iter()
                            .position(|h| h.kind == kind && h.bound == address)
                    })
                    .flatten()
            })?;
        Some(self.sockets.swap_remove(at).socket)
    }

    /// The bound addresses of the sockets nobody took (closed when `self` is dropped: the new
    /// configuration has no listener there).
    pub fn untaken(&self) -> Vec<SocketAddr> {
        let udp = self.udp.iter().map(|h| h.bound);
        self.sockets.iter().map(|h| h.bound).chain(udp).collect()
    }

    /// Tells the old process that this one serves: it stops accepting and drains. Closes the
    /// channel and the sockets nobody took; the files of the Unix sockets nobody took are
    /// removed (the old process leaves them to this one).
    pub fn ready(self) -> io::Result<()> {
        for untaken in &self.unix {
            untaken.remove_file();
        }
        let mut ready = self.ready;
        ready.write_all(READY_MESSAGE)?;
        ready.flush()
    }
}

fn malformed(var: &'static str, why: String) -> HandoverError {
    HandoverError::Malformed { var, why }
}

/// What one entry of the listeners variable says.
type Entry = (Kind, RawFd, SocketAddr, SocketAddr);

/// What one `unix` entry says: the descriptor and the socket file's path.
type UnixEntry = (RawFd, PathBuf);

/// `KIND:FD=CONFIGURED=BOUND,...` (`unix:FD=PATH` for a Unix socket), each descriptor once.
fn parse_entries(text: &str) -> Result<(Vec<Entry>, Vec<UnixEntry>), HandoverError> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut unix_entries: Vec<UnixEntry> = Vec::new();
    if text.is_empty() {
        return Ok((entries, unix_entries));
    }
    for entry in text.split(',') {
        if entries.len() + unix_entries.len() == MAX_SOCKETS {
            return Err(malformed(
                LISTENERS_VAR,
                format!("more than {MAX_SOCKETS} sockets"),
            ));
        }
        let shape = || {
            malformed(
                LISTENERS_VAR,
                format!("{entry:?} is not KIND:FD=ADDRESS=ADDRESS"),
            )
        };
        let (kind, rest) = entry.split_once(':').ok_or_else(shape)?;
        let kind = Kind::parse(kind).ok_or_else(shape)?;
        let named_twice = |fd: RawFd| {
            entries.iter().any(|(_, other, ..)| *other == fd)
                || unix_entries.iter().any(|(other, _)| *other == fd)
        };
        if kind == Kind::Unix {
            let (fd, path) = rest.split_once('=').ok_or_else(|| {
                malformed(LISTENERS_VAR, format!("{entry:?} is not unix:FD=PATH"))
            })?;
            let fd: RawFd = fd.parse().map_err(|_| {
                malformed(LISTENERS_VAR, format!("{fd:?} is not a descriptor number"))
            })?;
            let path = unix::decode_path(path).ok_or_else(|| {
                malformed(
                    LISTENERS_VAR,
                    format!("{path:?} is not an absolute socket path"),
                )
            })?;
            if named_twice(fd) {
                return Err(malformed(
                    LISTENERS_VAR,
                    format!("descriptor {fd} named twice"),
                ));
            }
            unix_entries.push((fd, path));
            continue;
        }
        let mut parts = rest.split('=');
        let (Some(fd), Some(configured), Some(bound), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(shape());
        };
        let fd: RawFd = fd
            .parse()
            .map_err(|_| malformed(LISTENERS_VAR, format!("{fd:?} is not a descriptor number")))?;
        let address = |text: &str| {
            text.parse::<SocketAddr>()
                .map_err(|_| malformed(LISTENERS_VAR, format!("{text:?} is not an address")))
        };
        let (configured, bound) = (address(configured)?, address(bound)?);
        if named_twice(fd) {
            return Err(malformed(
                LISTENERS_VAR,
                format!("descriptor {fd} named twice"),
            ));
        }
        entries.push((kind, fd, configured, bound));
    }
    Ok((entries, unix_entries))
}

/// Takes ownership of descriptor `fd` after checking it is open and not a standard stream.
fn checked_fd(fd: RawFd) -> Result<OwnedFd, DescriptorError> {
    if fd <= 2 {
        return Err(DescriptorError::StandardStream(fd));
    }
    // Whether it is open, without touching it: /proc lists this process's descriptors.
    if std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
        return Err(DescriptorError::NotOpen(fd));
    }
    // SAFETY: the descriptor is open (above), is none of the standard streams, is named once
    // in the environment (checked by the parser), and nothing else in this process knows its
    // number: it was inherited across exec and the variables naming it are removed.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // Not passed on to this process's own children (alert commands, a later upgrade).
    socket2::SockRef::from(&owned)
        .set_cloexec(true)
        .map_err(|source| DescriptorError::CloseOnExec { fd, source })?;
    Ok(owned)
}

/// The socket in `owned`, if it is a listening TCP socket, set non-blocking for tokio.
fn listening_tcp(owned: OwnedFd) -> Result<std::net::TcpListener, DescriptorError> {
    let socket = socket2::Socket::from(owned);
    let domain = socket.domain()?;
    if domain != socket2::Domain::IPV4 && domain != socket2::Domain::IPV6 {
        return Err(DescriptorError::NotIp);
    }
    if socket.r#type()? != socket2::Type::STREAM {
        return Err(DescriptorError::NotStream);
    }
    if !socket.is_listener()? {
        return Err(DescriptorError::NotListening);
    }
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Whether this process handed its sockets over (the new process of an upgrade said it
/// serves): its Unix sockets' files are the new process's from then on, and left when this
/// one stops.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);

/// Records that the new process of an upgrade serves with this process's sockets.
pub fn handed_over() {
    HANDED_OVER.store(true, Ordering::Relaxed);
}

/// Whether [`handed_over`] was called: a socket file this process bound is then left in place.
pub fn is_handed_over() -> bool {
    HANDED_OVER.load(Ordering::Relaxed)
}

/// One listening socket the old process offers: where it was configured and bound, and a
/// duplicate of its descriptor.
#[derive(Debug)]
pub struct Offered {
    /// What it is for ([`Kind::Unix`]: `unix` is its path, the addresses are unused).
    pub kind: Kind,
    /// The socket file's path of a Unix socket listener.
    pub unix: Option<PathBuf>,
    /// The address its configuration asked for.
    pub configured: SocketAddr,
    /// The address it is bound to.
    pub bound: SocketAddr,
    /// A duplicate of the listening socket's descriptor (close-on-exec; cleared in the child
    /// only).
    pub fd: OwnedFd,
}

/// The command that starts the new process with `sockets` inherited, this process's end of
/// the readiness channel, and the new process's ends of its channels (to close once it has
/// started). `exe` and `args` are how this process was started (`args` without the program
/// name).
pub fn command(
    exe: &Path,
    args: &[OsString],
    sockets: &[Offered],
) -> io::Result<(tokio::process::Command, UnixStream, Vec<OwnedFd>)> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs = OwnedFd::from(theirs);
    let ready_fd = theirs.as_raw_fd();
    let mut listeners = String::new();
    let mut inherit: Vec<RawFd> = Vec::with_capacity(sockets.len() + 1);
    for offered in sockets {
        if !listeners.is_empty() {
            listeners.push(',');
        }
        let fd = offered.fd.as_raw_fd();
        match &offered.unix {
            Some(path) => listeners.push_str(&format!("unix:{fd}={}", encode_path(path))),
            None => listeners.push_str(&format!(
                "{}:{fd}={}={}",
                offered.kind.name(),
                offered.configured,
                offered.bound
            )),
        }
        inherit.push(fd);
    }
    inherit.push(ready_fd);
    let mut theirs = vec![theirs];
    let quic = udp::channels(sockets, &mut inherit, &mut theirs)?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args(args)
        .env(LISTENERS_VAR, listeners)
        .env(READY_VAR, ready_fd.to_string())
        .kill_on_drop(false);
    // The new process counts the CPUs it may run on to choose its workers: all of ours, not
    // the one this (pinned) thread has.
    crate::workers::unpinned(&mut command);
    if !quic.is_empty() {
        command.env(QUIC_VAR, quic);
    }
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: it allocates nothing (the numbers were collected above) and makes
    // fcntl calls only. Each number is a descriptor this process owns (`sockets` and `theirs`
    // outlive the spawn: the caller keeps them until `spawn` returns), so the child has it at
    // the same number.
    unsafe {
        command.pre_exec(move || {
            for &fd in &inherit {
                let fd = BorrowedFd::borrow_raw(fd);
                socket2::SockRef::from(&fd).set_cloexec(false)?;
            }
            Ok(())
        });
    }
    Ok((command, ours, theirs))
}

/// A duplicate of a listening socket's descriptor, to offer it later.
pub fn duplicate(socket: &impl std::os::fd::AsFd) -> io::Result<OwnedFd> {
    socket.as_fd().try_clone_to_owned()
}

#[cfg(test)]
mod tests;
