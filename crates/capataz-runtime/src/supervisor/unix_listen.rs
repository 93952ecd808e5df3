//! Listeners on a Unix domain socket (`address = "unix:/path"`): the socket file bound the way
//! HAProxy binds it (a temporary name in the same directory, its mode set, then renamed over
//! any old socket, so a restart leaves no moment without a socket at the path), refused over
//! anything that is not a socket (never deleted), and removed when the listener stops, unless
//! another process has put its own socket there since or this one handed it over to the new
//! process of a binary upgrade (which took the same socket: [`adopt_unix`]).
//!
//! A socket's client has no IP: it is served as [`UNIX_CLIENT`] (`0.0.0.0:0`), which the
//! access log writes `unix`, forwarded headers leave out, and a PROXY header to a backend
//! sends as `LOCAL`. The TCP listeners' path is untouched by all this.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use socket2::{Domain, SockAddr, Socket, Type};
use tokio::io::Interest;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::watch;

use super::admission::{self, Held};
use super::listener::{handles, in_force, shutting_down, ListenerRt, ListenerState};
use super::{StartError, Supervisor};
use crate::config::{ListenerConfig, UnixListen, UNIX_CLIENT};
use crate::downstream::{self, PeekPeer};
use crate::health::PoolRt;
use crate::proxy::ClientInfo;
use crate::workers::Workers;

/// A client listener's bound socket: TCP, or a Unix socket and its file.
#[derive(Debug)]
pub enum ClientSocket {
    /// A TCP listening socket.
    Tcp(TcpListener),
    /// A TLS listener's TCP listening socket and its HTTP/3 UDP socket (bound with it, or
    /// both handed over by the process that upgraded to this one).
    Http3(TcpListener, std::net::UdpSocket),
    /// A Unix listening socket, and its file (removed when dropped).
    Unix(UnixListener, SocketFile),
}

impl From<TcpListener> for ClientSocket {
    fn from(socket: TcpListener) -> ClientSocket {
        ClientSocket::Tcp(socket)
    }
}

/// A socket file this process bound (or took over), removed when dropped if it is still the
/// one bound (the same inode: a new process's socket renamed over it is left alone) and this
/// process has not handed its sockets over (the same inode, now the new process's).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if crate::handover::is_handed_over() {
            return;
        }
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| meta.dev() == self.dev && meta.ino() == self.ino);
        if ours {
            if let Err(error) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), %error, "cannot remove the socket file");
            }
        }
    }
}

/// Binds `unix`'s path: refused if something that is not a socket is there (left as it is);
/// else bound under a temporary name in the same directory, given `socket_mode`, listening
/// (backlog 1024, as a TCP listener), and renamed over the path (replacing a stale or live
/// socket file atomically).
pub fn bind_unix(unix: &UnixListen) -> io::Result<(UnixListener, SocketFile)> {
    let path = &unix.path;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "something that is not a socket is there, and capataz does not remove it",
            ));
        }
        _ => {}
    }
    let temporary = temporary_name(path)?;
    // A leftover of this pid's earlier bind (a crash), only ever a socket.
    if std::fs::symlink_metadata(&temporary).is_ok_and(|meta| meta.file_type().is_socket()) {
        let _ = std::fs::remove_file(&temporary);
    }
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    socket.bind(&SockAddr::unix(&temporary)?)?;
    // The mode is set before the socket listens (no client connects under the umask's bits),
    // and the socket listens before it is renamed into place (no client finds the path
    // refusing).
    let placed = (|| {
        if let Some(mode) = unix.mode {
            std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))?;
        }
        socket.listen(1024)?;
        std::fs::rename(&temporary, path)?;
        std::fs::symlink_metadata(path)
    })();
    let meta = match placed {
        Ok(meta) => meta,
        Err(error) => {
            let _ = std::fs::remove_file(&temporary);
            return Err(error);
        }
    };
    socket.set_nonblocking(true)?;
    let file = SocketFile {
        path: path.clone(),
        dev: meta.dev(),
        ino: meta.ino(),
    };
    let socket = std::os::unix::net::UnixListener::from(std::os::fd::OwnedFd::from(socket));
    Ok((UnixListener::from_std(socket)?, file))
}

/// The socket of `unix`'s path handed over by the process that upgraded to this one: the same
/// socket and file, not bound again (no moment without a listener), given this configuration's
/// `socket_mode` if it has one. The file is this process's from then on, removed when the
/// listener stops (if it is still that file).
pub fn adopt_unix(
    unix: &UnixListen,
    socket: std::os::unix::net::UnixListener,
) -> io::Result<(UnixListener, SocketFile)> {
    socket.set_nonblocking(true)?;
    let meta = std::fs::symlink_metadata(&unix.path)?;
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the socket file handed over is gone: something that is not a socket is there",
        ));
    }
    if let Some(mode) = unix.mode {
        std::fs::set_permissions(&unix.path, std::fs::Permissions::from_mode(mode))?;
    }
    let file = SocketFile {
        path: unix.path.clone(),
        dev: meta.dev(),
        ino: meta.ino(),
    };
    Ok((UnixListener::from_std(socket)?, file))
}

/// `dir/.name.PID.tmp` beside `path`.
fn temporary_name(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let mut temporary = std::ffi::OsString::from(".");
    temporary.push(name);
    temporary.push(format!(".{}.tmp", std::process::id()));
    Ok(path.with_file_name(temporary))
}

/// The error of a Unix listener that could not bind, naming the key and the path.
pub fn bind_error(index: usize, listener: &ListenerConfig, error: io::Error) -> StartError {
    let path = listener
        .unix
        .as_ref()
        .map(|unix| unix.path.display().to_string())
        .unwrap_or_default();
    StartError::BindUnix {
        key: format!("listeners[{index}].address"),
        path,
        error,
    }
}

/// Applies a kept listener's `socket_mode` from a reload (its socket stays bound).
pub(super) fn apply_mode(listener: &ListenerConfig) {
    let Some(UnixListen {
        path,
        mode: Some(mode),
    }) = &listener.unix
    else {
        return;
    };
    if let Err(error) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)) {
        tracing::warn!(listener = %listener.name, %error, "cannot set the socket file's mode");
    }
}

impl Supervisor {
    /// Starts a listener on a Unix socket, serving HTTP or relaying byte streams (tcp mode).
    pub(super) fn spawn_unix_listener(
        &self,
        listener: &ListenerConfig,
        (socket, file): (UnixListener, SocketFile),
        pools: &[Arc<PoolRt>],
    ) -> ListenerRt {
        let state = Arc::new(ArcSwap::new(self.listener_state(
            listener,
            &handles(pools),
            self.access_log(listener),
            None,
        )));
        let (stop, stop_rx) = watch::channel(false);
        let offer = crate::handover::duplicate(&socket)
            .inspect_err(|error| {
                tracing::warn!(listener = %listener.name, %error, "cannot duplicate the listening socket: a binary upgrade will be refused");
            })
            .ok()
            .map(Arc::new);
        let path = file.path.display();
        if self.accepting() {
            tracing::info!(listener = %listener.name, %path, "listening");
        } else {
            tracing::info!(
                listener = %listener.name,
                %path,
                "listening, held: accepting once the takeover is ready"
            );
        }
        let task = tokio::spawn(accept_loop(
            (socket, file),
            (state.clone(), self.workers.clone()),
            stop_rx,
            (self.shutdown.subscribe(), self.accepting.subscribe()),
            self.connections.clone(),
        ));
        ListenerRt {
            address: listener.address,
            local: listener.address,
            unix: listener.unix.as_ref().map(|unix| unix.path.clone()),
            // A socket listener has no TLS, so no HTTP/3.
            http3: None,
            state,
            stop,
            task,
            acme: None,
            ocsp: None,
            offer,
        }
    }
}

/// Accepts until the listener stops or the balancer shuts down, then removes the socket file
/// (`file`, dropped on return).
async fn accept_loop(
    (socket, _file): (UnixListener, SocketFile),
    (state, workers): (Arc<ArcSwap<ListenerState>>, Workers),
    mut stop: watch::Receiver<bool>,
    (shutdown, mut accepting): (watch::Receiver<bool>, watch::Receiver<bool>),
    connections: Arc<AtomicUsize>,
) {
    let mut down = shutdown.clone();
    tokio::select! {
        biased;
        _ = stop.changed() => return,
        _ = shutting_down(&mut down) => return,
        open = accepting.wait_for(|open| *open) => {
            if open.is_err() {
                return;
            }
        }
    }
    // Per worker, the watcher of the connections it serves with the limits in force.
    let mut watchers: Vec<Option<downstream::Watch>> = vec![None; workers.count()];
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = shutting_down(&mut down) => return,
            accepted = socket.accept() => accepted,
        };
        if *down.borrow() {
            return;
        }
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // At `max_connections`, it waits unserved, and the next ones in the kernel's backlog.
        let admitted = admission::admit(&state, &connections, (&mut stop, &mut down)).await;
        let Some(held) = admitted else {
            return;
        };
        hand_over(stream, held, (&state, &shutdown), (&workers, &mut watchers));
    }
}

/// Serves `stream` on the worker with the fewest connections, as a TCP listener's accept loop
/// does (`listener::Hand`).
fn hand_over(
    stream: UnixStream,
    held: Held,
    (state, shutdown): (&Arc<ArcSwap<ListenerState>>, &watch::Receiver<bool>),
    (workers, watchers): (&Workers, &mut [Option<downstream::Watch>]),
) {
    // From here on, what is spawned is the worker's.
    let (placed, _worker, stream) = match workers.take(stream) {
        Ok(taken) => taken,
        Err(error) => {
            tracing::debug!(%error, "cannot hand the connection to its worker");
            return;
        }
    };
    let index = placed.index();
    let held = held.on_worker(placed);
    let now = state.load();
    if let Some(relay) = &now.tcp {
        let relay = relay.clone();
        tokio::spawn(async move {
            let _held = held;
            relay.serve(stream, UNIX_CLIENT, UNIX_CLIENT, None).await;
        });
        return;
    }
    // `proxy_protocol` and `tls` are refused on a socket listener.
    let (limits, protocol, _, _) = in_force(&now.config, UNIX_CLIENT);
    drop(now);
    let watch: &downstream::Watch = match &mut watchers[index] {
        Some(watch) if *watch.limits() == limits => watch,
        slot => slot.insert(downstream::Watch::start(limits, shutdown.clone())),
    };
    let state = state.clone();
    let proxy = move || state.load().proxy.clone();
    let client = ClientInfo::new(UNIX_CLIENT);
    tokio::spawn(downstream::serve(
        stream, client, protocol, watch, proxy, held,
    ));
}

impl PeekPeer for UnixStream {
    fn poll_peek_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.poll_read_ready(cx))?;
            let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
            let peeked = self.try_io(Interest::READABLE, || {
                socket2::SockRef::from(self).peek(&mut byte)
            });
            match peeked {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory for one test's socket files, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(test: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("capataz-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn unix(path: &Path, mode: Option<u32>) -> UnixListen {
        UnixListen {
            path: path.to_owned(),
            mode,
        }
    }

    /// One look at the socket, as the watch for a client gone takes it.
    fn look(socket: &UnixStream) -> Poll<io::Result<usize>> {
        socket.poll_peek_peer(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test]
    async fn a_peek_sees_bytes_without_taking_them_and_the_clients_close() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, mut server) = UnixStream::pair().unwrap();
        assert!(look(&server).is_pending());
        client.write_all(b"GET").await.unwrap();
        let peeked = std::future::poll_fn(|cx| server.poll_peek_peer(cx)).await;
        assert_eq!(peeked.unwrap(), 1);
        let mut three = [0u8; 3];
        server.read_exact(&mut three).await.unwrap();
        assert_eq!(&three, b"GET", "the peek took nothing");
        drop(client);
        let closed = std::future::poll_fn(|cx| server.poll_peek_peer(cx)).await;
        assert_eq!(closed.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_the_file_removed_when_dropped() {
        let dir = Dir::new("stale");
        let path = dir.path().join("lb.sock");
        // A stale socket file, as a crashed process leaves it.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let (_socket, file) = bind_unix(&unix(&path, Some(0o600))).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        UnixStream::connect(&path)
            .await
            .expect("the new socket accepts");
        drop(file);
        assert!(!path.exists(), "the socket file is removed");
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_is_left_alone() {
        let dir = Dir::new("regular");
        let path = dir.path().join("lb.sock");
        std::fs::write(&path, "data").unwrap();
        let error = bind_unix(&unix(&path, None)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[tokio::test]
    async fn a_socket_another_process_put_there_is_not_removed() {
        let dir = Dir::new("successor");
        let path = dir.path().join("lb.sock");
        let (_old, old_file) = bind_unix(&unix(&path, None)).unwrap();
        // The successor's socket, renamed over ours.
        let (_new, _new_file) = bind_unix(&unix(&path, None)).unwrap();
        drop(old_file);
        assert!(path.exists(), "the successor's socket stays");
    }
}
