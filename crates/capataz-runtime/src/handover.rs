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
//!   (`127.0.0.1:0`, say) and the one it is bound to.
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
//! Every descriptor named in the environment is checked before it is used: open, a TCP socket,
//! listening, not one of the standard streams, named once. Anything else is an error that
//! stops the new process, which leaves the old one serving.

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

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
    #[error("descriptor {fd} in {LISTENERS_VAR} is not a listening TCP socket: {why}")]
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
    /// Not a stream socket.
    #[error("not a stream socket")]
    NotStream,
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
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Listener => "listener",
            Kind::Admin => "admin",
        }
    }

    fn parse(text: &str) -> Option<Kind> {
        match text {
            "listener" => Some(Kind::Listener),
            "admin" => Some(Kind::Admin),
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
    ready: UnixStream,
}

impl Inherited {
    /// Reads and removes the handover variables. `Ok(None)` when there are none (a plain
    /// start). Call it at the start of `main`, before any thread is started: it changes the
    /// process's environment.
    pub fn from_env() -> Result<Option<Inherited>, HandoverError> {
        let listeners = std::env::var_os(LISTENERS_VAR);
        let ready = std::env::var_os(READY_VAR);
        std::env::remove_var(LISTENERS_VAR);
        std::env::remove_var(READY_VAR);
        match (listeners, ready) {
            (None, None) => Ok(None),
            (Some(listeners), Some(ready)) => Inherited::parse(&listeners, &ready).map(Some),
            (None, Some(_)) => Err(malformed(READY_VAR, format!("set without {LISTENERS_VAR}"))),
            (Some(_), None) => Err(malformed(LISTENERS_VAR, format!("set without {READY_VAR}"))),
        }
    }

    fn parse(listeners: &OsString, ready: &OsString) -> Result<Inherited, HandoverError> {
        let listeners = listeners
            .to_str()
            .ok_or_else(|| malformed(LISTENERS_VAR, "not UTF-8".into()))?;
        let entries = parse_entries(listeners)?;
        let ready_fd = ready
            .to_str()
            .and_then(|s| s.parse::<RawFd>().ok())
            .ok_or_else(|| malformed(READY_VAR, "not a descriptor number".into()))?;
        if entries.iter().any(|(_, fd, ..)| *fd == ready_fd) {
            return Err(malformed(
                READY_VAR,
                "names a listening socket's descriptor".into(),
            ));
        }
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
        for (kind, fd, configured, bound) in entries {
            let owned = checked_fd(fd).map_err(|why| HandoverError::NotAListener { fd, why })?;
            let socket =
                listening_tcp(owned).map_err(|why| HandoverError::NotAListener { fd, why })?;
            sockets.push(Handed {
                kind,
                configured,
                bound,
                socket,
            });
        }
        Ok(Inherited { sockets, ready })
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
        self.sockets.iter().map(|h| h.bound).collect()
    }

    /// Tells the old process that this one serves: it stops accepting and drains. Closes the
    /// channel and the sockets nobody took.
    pub fn ready(self) -> io::Result<()> {
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

/// `KIND:FD=CONFIGURED=BOUND,...`, each descriptor once.
fn parse_entries(text: &str) -> Result<Vec<Entry>, HandoverError> {
    let mut entries: Vec<Entry> = Vec::new();
    if text.is_empty() {
        return Ok(entries);
    }
    for entry in text.split(',') {
        if entries.len() == MAX_SOCKETS {
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
        if entries.iter().any(|(_, other, ..)| *other == fd) {
            return Err(malformed(
                LISTENERS_VAR,
                format!("descriptor {fd} named twice"),
            ));
        }
        entries.push((kind, fd, configured, bound));
    }
    Ok(entries)
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

/// One listening socket the old process offers: where it was configured and bound, and a
/// duplicate of its descriptor.
#[derive(Debug)]
pub struct Offered {
    /// What it is for.
    pub kind: Kind,
    /// The address its configuration asked for.
    pub configured: SocketAddr,
    /// The address it is bound to.
    pub bound: SocketAddr,
    /// A duplicate of the listening socket's descriptor (close-on-exec; cleared in the child
    /// only).
    pub fd: OwnedFd,
}

/// The command that starts the new process with `sockets` inherited, and this process's end
/// of the readiness channel. `exe` and `args` are how this process was started (`args`
/// without the program name).
pub fn command(
    exe: &Path,
    args: &[OsString],
    sockets: &[Offered],
) -> io::Result<(tokio::process::Command, UnixStream, OwnedFd)> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs = OwnedFd::from(theirs);
    let mut listeners = String::new();
    let mut inherit: Vec<RawFd> = Vec::with_capacity(sockets.len() + 1);
    for offered in sockets {
        if !listeners.is_empty() {
            listeners.push(',');
        }
        let fd = offered.fd.as_raw_fd();
        listeners.push_str(&format!(
            "{}:{fd}={}={}",
            offered.kind.name(),
            offered.configured,
            offered.bound
        ));
        inherit.push(fd);
    }
    inherit.push(theirs.as_raw_fd());
    let mut command = tokio::process::Command::new(exe);
    command
        .args(args)
        .env(LISTENERS_VAR, listeners)
        .env(READY_VAR, theirs.as_raw_fd().to_string())
        .kill_on_drop(false);
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
pub fn duplicate(socket: &tokio::net::TcpListener) -> io::Result<OwnedFd> {
    socket.as_fd().try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_entries_reads_descriptors_and_both_addresses() {
        let entries =
            parse_entries("listener:7=127.0.0.1:0=127.0.0.1:40123,admin:9=[::1]:80=[::1]:80")
                .unwrap();
        assert_eq!(
            entries,
            vec![
                (
                    Kind::Listener,
                    7,
                    "127.0.0.1:0".parse().unwrap(),
                    "127.0.0.1:40123".parse().unwrap()
                ),
                (
                    Kind::Admin,
                    9,
                    "[::1]:80".parse().unwrap(),
                    "[::1]:80".parse().unwrap()
                ),
            ]
        );
        assert_eq!(parse_entries("").unwrap(), vec![]);
    }

    #[test]
    fn parse_entries_refuses_hostile_text() {
        for text in [
            "listener:7",
            "7=127.0.0.1:1=127.0.0.1:1",
            "other:7=127.0.0.1:1=127.0.0.1:1",
            "listener:7=127.0.0.1:1",
            "listener:7=127.0.0.1:1=127.0.0.1:1=x",
            "listener:x=127.0.0.1:1=127.0.0.1:1",
            "listener:7=localhost:1=127.0.0.1:1",
            "listener:7=127.0.0.1:1=127.0.0.1:1,admin:7=127.0.0.1:2=127.0.0.1:2",
            ",",
            "listener:-1=127.0.0.1:1=127.0.0.1:1,",
        ] {
            assert!(parse_entries(text).is_err(), "{text:?} was taken");
        }
        let many = (0..=MAX_SOCKETS)
            .map(|i| format!("listener:{}=127.0.0.1:1=127.0.0.1:1", i + 3))
            .collect::<Vec<_>>()
            .join(",");
        assert!(parse_entries(&many).is_err());
    }

    #[test]
    fn checked_fd_refuses_standard_streams_and_closed_descriptors() {
        assert!(checked_fd(0).is_err());
        assert!(checked_fd(2).is_err());
        assert!(checked_fd(-5).is_err());
        assert!(checked_fd(RawFd::MAX).is_err());
    }

    #[test]
    fn a_descriptor_that_is_not_a_listening_tcp_socket_is_refused() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(listening_tcp(OwnedFd::from(a)).is_err());
        let connected = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(connected.local_addr().unwrap()).unwrap();
        assert!(listening_tcp(OwnedFd::from(stream)).is_err());
        assert!(listening_tcp(OwnedFd::from(connected)).is_ok());
    }

    #[test]
    fn take_matches_the_configured_address_then_the_bound_one_once() {
        let socket = |addr: &str| std::net::TcpListener::bind(addr).unwrap();
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let a = socket("127.0.0.1:0");
        let a_bound = a.local_addr().unwrap();
        let b = socket("127.0.0.1:0");
        let b_bound = b.local_addr().unwrap();
        let mut inherited = Inherited {
            sockets: vec![
                Handed {
                    kind: Kind::Admin,
                    configured: "127.0.0.1:0".parse().unwrap(),
                    bound: b_bound,
                    socket: b,
                },
                Handed {
                    kind: Kind::Listener,
                    configured: "127.0.0.1:0".parse().unwrap(),
                    bound: a_bound,
                    socket: a,
                },
            ],
            ready: ours,
        };
        let any = "127.0.0.1:0".parse().unwrap();
        let taken = inherited.take(Kind::Listener, any).unwrap();
        assert_eq!(taken.local_addr().unwrap(), a_bound);
        assert!(inherited.take(Kind::Listener, any).is_none());
        assert!(inherited.take(Kind::Listener, a_bound).is_none());
        assert!(
            inherited.take(Kind::Listener, b_bound).is_none(),
            "the admin socket"
        );
        assert_eq!(inherited.untaken(), vec![b_bound]);
        assert!(inherited.take(Kind::Admin, b_bound).is_some());
        assert!(inherited.untaken().is_empty());
    }
}
