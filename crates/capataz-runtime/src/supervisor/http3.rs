//! A TLS listener's HTTP/3 endpoint (`[listeners.tls.http3]`): its UDP socket, and the loop
//! that accepts QUIC connections with the listener's settings in force and hands each to
//! `h3::serve`.
//!
//! The QUIC configuration is rebuilt from the listener's state when a reload replaced it
//! (same certificates as the TCP side, which a reload reloads), so a reload applies to the
//! next connection, as on TCP; the key its Retry tokens are sealed with is the endpoint's, the
//! same for its life (a token sent before a reload validates its client after it). A client
//! whose address is not yet validated is sent a Retry first while `retry_threshold`
//! handshakes or more are in progress (HAProxy's `tune.quic.retry-threshold`): a flood of
//! Initial packets from spoofed sources then costs one stateless packet each, and no
//! handshake state.
//!
//! A binary upgrade hands the UDP socket to the new process, which serves on it at once. Both
//! processes hold it until the old one exits, and a QUIC connection lives in one of them: the
//! endpoint issues connection IDs that name its process (`h3/cid.rs`), and reads the socket
//! through `h3::handoff::SharedSocket`. Once the new process serves, it alone reads the UDP
//! socket and passes the old process's datagrams on to it; the old process reads them from
//! the channel the handover made (`handover/udp.rs`), refuses new connections, and drains its
//! connections as a stop does (GOAWAY, the requests in progress finish, within
//! `shutdown_timeout`). A channel the new process did not take (it serves no HTTP/3 on that
//! socket) ends at once, and the old process reads the UDP socket itself again; without a
//! channel (the socket was not offered to the new process) the old process closes its
//! connections at once (CONNECTION_CLOSE, H3_NO_ERROR).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::admission::Held;
use super::listener::{shutting_down, ListenerState};
use super::{ClientSocket, StartError, Supervisor};
use crate::config::ListenerConfig;
use crate::h3;
use crate::h3::handoff::{Forwarded, SharedSocket, ToOld};
use crate::handover::ToOldChannel;
use crate::instruments::{QuicFamilies, QuicMetrics};

/// A listener's running HTTP/3 endpoint.
#[derive(Debug)]
pub(super) struct Http3Rt {
    /// The UDP address it was asked to bind (the listener's IP, the HTTP/3 port).
    pub(super) address: SocketAddr,
    /// The address it bound.
    pub(super) local: SocketAddr,
    /// A duplicate of its socket's descriptor, which a binary upgrade offers to the new
    /// process; `None` if it could not be made (out of descriptors): an upgrade then hands the
    /// TCP socket over only, and the new process binds the UDP port anew (which fails while the
    /// old process holds it: it serves TCP alone).
    pub(super) offer: Option<Arc<std::os::fd::OwnedFd>>,
    /// The accept loop; it ends at the listener's stop, its own or at shutdown.
    pub(super) task: JoinHandle<()>,
    /// Its own stop (a reload that moves or removes HTTP/3 from a listener it keeps).
    pub(super) stop: watch::Sender<bool>,
}

/// The UDP address `listener` serves HTTP/3 on, if it does; `tcp` is its bound TCP address
/// (the default port is the TCP port as bound, so port 0 in a test gets the same number).
pub fn http3_address(listener: &ListenerConfig, tcp: SocketAddr) -> Option<SocketAddr> {
    let http3 = listener.tls.as_ref()?.http3.as_ref()?;
    Some(SocketAddr::new(tcp.ip(), http3.udp_port(tcp.port())))
}

/// Binds the UDP socket `listener` serves HTTP/3 on, if it does (`tcp`: its bound TCP
/// address; `index`: its place in the config, for the error): a port that cannot be bound
/// fails the start, or the reload, as a TCP one does.
pub(super) fn bind_udp(
    index: usize,
    listener: &ListenerConfig,
    tcp: SocketAddr,
) -> Result<Option<std::net::UdpSocket>, StartError> {
    let Some(address) = http3_address(listener, tcp) else {
        return Ok(None);
    };
    std::net::UdpSocket::bind(address)
        .map(Some)
        .map_err(|error| StartError::BindUdp {
            name: listener.name.clone(),
            key: format!("listeners[{index}].tls.http3.port"),
            address,
            error,
        })
}

/// Times a listener on a port the system chooses (`:0`), whose HTTP/3 takes the same number,
/// is bound again when that number is taken on the UDP side.
const PORT_CHOICES: usize = 8;

/// `listener`'s TCP socket (`tcp` binds it) and its HTTP/3 UDP socket, if it serves HTTP/3.
/// On a port the system chooses, with HTTP/3 on the same number, a number whose UDP port is
/// taken is passed over: the TCP socket is bound again, up to [`PORT_CHOICES`] times.
pub(super) fn bind_with_udp(
    index: usize,
    listener: &ListenerConfig,
    tcp: impl Fn() -> Result<tokio::net::TcpListener, StartError>,
) -> Result<ClientSocket, StartError> {
    let chosen = listener.address.port() == 0
        && listener
            .tls
            .as_ref()
            .and_then(|tls| tls.http3.as_ref())
            .is_some_and(|http3| http3.port.is_none());
    let mut attempt = 1;
    loop {
        let socket = tcp()?;
        let local = socket.local_addr().unwrap_or(listener.address);
        match bind_udp(index, listener, local) {
            Ok(Some(udp)) => return Ok(ClientSocket::Http3(socket, udp)),
            Ok(None) => return Ok(ClientSocket::Tcp(socket)),
            Err(StartError::BindUdp { error, .. })
                if chosen
                    && attempt < PORT_CHOICES
                    && error.kind() == std::io::ErrorKind::AddrInUse =>
            {
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// `listener` as its state holds it: with the HTTP/3 port written in when it defaults to a
/// TCP port the system chose (`local`, bound to port 0), so that `Alt-Svc` names it.
pub(super) fn resolved(listener: &ListenerConfig, local: SocketAddr) -> Cow<'_, ListenerConfig> {
    let unset = listener
        .tls
        .as_ref()
        .and_then(|tls| tls.http3.as_ref())
        .is_some_and(|http3| http3.port.is_none());
    if !unset || listener.address.port() != 0 {
        return Cow::Borrowed(listener);
    }
    let mut listener = listener.clone();
    if let Some(http3) = listener.tls.as_mut().and_then(|tls| tls.http3.as_mut()) {
        http3.port = Some(local.port());
    }
    Cow::Owned(listener)
}

impl Supervisor {
    /// After a reload that keeps `listener` (now configured as `new`): its HTTP/3 endpoint
    /// kept if it stays on the same UDP address (the new settings apply to its next
    /// connections), else stopped (its connections finish) and the new one started, on the
    /// socket `bound` holds for its address (bound before the reload changed anything).
    pub(super) fn update_http3(
        &self,
        listener: &mut super::listener::ListenerRt,
        new: &ListenerConfig,
        bound: &mut Vec<(SocketAddr, std::net::UdpSocket)>,
    ) {
        let wanted = http3_address(new, listener.local);
        if listener.http3.as_ref().map(|h| h.address) == wanted {
            return;
        }
        if let Some(old) = listener.http3.take() {
            let _ = old.stop.send(true);
        }
        listener.http3 = wanted.and_then(|address| {
            let udp = bound
                .iter()
                .position(|(at, _)| *at == address)
                .map(|i| bound.swap_remove(i).1);
            self.spawn_http3(
                new,
                (address, udp),
                listener.state.clone(),
                listener.stop.subscribe(),
            )
        });
    }

    /// Starts `listener`'s HTTP/3 endpoint on `address` (UDP), on `inherited` if it was bound
    /// already (with the listener's TCP socket) or the process that upgraded to this one
    /// handed its socket over. A socket that cannot be bound here is logged, and the listener
    /// serves TCP alone.
    pub(super) fn spawn_http3(
        &self,
        listener: &ListenerConfig,
        (address, inherited): (SocketAddr, Option<std::net::UdpSocket>),
        state: Arc<ArcSwap<ListenerState>>,
        stop: watch::Receiver<bool>,
    ) -> Option<Http3Rt> {
        let bound = match bind(listener, address, inherited) {
            Ok(bound) => bound,
            Err(error) => {
                tracing::error!(listener = %listener.name, %address, %error, "cannot serve HTTP/3 (UDP): the listener serves TCP alone");
                return None;
            }
        };
        let (socket, config, offer) = bound;
        let local = socket.socket.local_addr().unwrap_or(address);
        tracing::info!(listener = %listener.name, address = %local, "listening for HTTP/3 (UDP)");
        // Its QUIC series, there at 0 from now on.
        let quic = self.metrics.families().quic().listener(&listener.name);
        let (own_stop, own) = watch::channel(false);
        let task = tokio::spawn(accept_loop(
            (socket, config),
            state,
            (stop, own),
            self.shutdown.subscribe(),
            self.accepting.subscribe(),
            (
                self.connections.clone(),
                self.metrics.families().quic().clone(),
                quic,
            ),
        ));
        Some(Http3Rt {
            address,
            local,
            offer,
            task,
            stop: own_stop,
        })
    }
}

/// What an endpoint starts from: its UDP socket on `address` (`inherited`, if given), its
/// QUIC configuration (`listener`'s) with its Retry token key, and a duplicate of the socket
/// for an upgrade to offer.
type Bound = (Udp, Keyed, Option<Arc<std::os::fd::OwnedFd>>);

/// An endpoint's UDP socket, and its channel to the old process when it was handed over by
/// an upgrading process that made one.
#[derive(Debug)]
struct Udp {
    socket: std::net::UdpSocket,
    to_old: Option<ToOldChannel>,
}

/// An endpoint's first QUIC configuration, and the Retry token key every configuration of
/// its life is built with (see `h3::quic::TokenKey`).
type Keyed = (quinn::ServerConfig, h3::quic::TokenKey);

fn bind(
    listener: &ListenerConfig,
    address: SocketAddr,
    inherited: Option<std::net::UdpSocket>,
) -> std::io::Result<Bound> {
    let key = h3::quic::TokenKey::random().map_err(std::io::Error::other)?;
    let config = h3::quic::server_config(listener, &key).map_err(std::io::Error::other)?;
    let (socket, to_old) = match inherited {
        Some(socket) => {
            let local = socket.local_addr()?;
            (socket, crate::handover::take_channel_to_old(local))
        }
        None => (std::net::UdpSocket::bind(address)?, None),
    };
    widen_receive_buffer(&socket, &listener.name);
    let offer = crate::handover::duplicate(&socket)
        .inspect_err(|error| {
            tracing::warn!(listener = %listener.name, %error, "cannot duplicate the HTTP/3 socket: a binary upgrade will not hand it over");
        })
        .ok()
        .map(Arc::new);
    Ok((Udp { socket, to_old }, (config, key), offer))
}

/// The receive buffer asked for on an HTTP/3 socket: the kernel's default (about 208 KiB)
/// drops datagrams under a burst of new connections, and a handshake that loses one waits
/// for QUIC's probe timeout (about a second) to resend it. quic-go (Caddy) asks for 7 MiB.
const QUIC_RECEIVE_BUFFER: usize = 4 << 20;

/// Asks for [`QUIC_RECEIVE_BUFFER`] on `socket`; the kernel caps it at
/// `net.core.rmem_max`, and a buffer smaller than asked is logged once (the listener serves
/// all the same).
fn widen_receive_buffer(socket: &std::net::UdpSocket, listener: &str) {
    let socket = socket2::SockRef::from(socket);
    let _ = socket.set_recv_buffer_size(QUIC_RECEIVE_BUFFER);
    // Linux reports twice what it keeps for the data (the rest is its bookkeeping).
    match socket.recv_buffer_size() {
        Ok(got) if got / 2 < QUIC_RECEIVE_BUFFER => tracing::info!(
            listener,
            bytes = got / 2,
            "the HTTP/3 socket's receive buffer is smaller than the 4 MiB asked for (raise net.core.rmem_max to let it grow)"
        ),
        Ok(_) => {}
        Err(error) => tracing::debug!(listener, %error, "cannot read the HTTP/3 socket's receive buffer size"),
    }
}

/// Lets the channel to the old process (this process's end, the sending one) queue as much
/// as the UDP socket it reads from ([`QUIC_RECEIVE_BUFFER`], up to `net.core.wmem_max`): with
/// the kernel's default (about 208 KiB), a burst of 93 full datagrams for the old process
/// filled it and the rest were dropped, where the UDP socket would have queued them.
fn widen_channel(channel: &std::os::fd::OwnedFd) {
    let _ = socket2::SockRef::from(channel).set_send_buffer_size(QUIC_RECEIVE_BUFFER);
}

/// The QUIC endpoint reading `udp`, started once the listener accepts: in a process taking
/// over from an upgrading one, the socket is the old process's too, which alone reads it
/// (serving its connections) until this one is ready, and this one passes the old one's
/// datagrams on to it from then on. Its connection IDs start with this process's tag.
fn endpoint(
    (udp, (config, _)): (Udp, Keyed),
    quic: &QuicMetrics,
) -> std::io::Result<(quinn::Endpoint, Arc<SharedSocket>)> {
    use quinn::Runtime as _;
    let runtime = Arc::new(quinn::TokioRuntime);
    let own = crate::handover::quic_tag();
    let to_old = match udp.to_old {
        Some((channel, old)) => {
            widen_channel(&channel);
            let counts = Forwarded {
                sent: quic.forwarded.clone(),
                dropped: quic.forward_dropped.clone(),
            };
            Some(ToOld::new(channel, old, counts)?)
        }
        None => None,
    };
    let socket = runtime.wrap_udp_socket(udp.socket)?;
    let socket = Arc::new(SharedSocket::new(socket, own, to_old));
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config.cid_generator(move || Box::new(h3::cid::TaggedCids::new(own)));
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        endpoint_config,
        Some(config),
        socket.clone(),
        runtime,
    )?;
    Ok((endpoint, socket))
}

/// In the old process of an upgrade, once the new one serves: the endpoint reads the
/// datagrams the new process passes on instead of the UDP socket, its connections draining
/// as at a stop; or, with no channel from the new process, they are closed at once.
fn hand_over(endpoint: &quinn::Endpoint, socket: &Arc<SharedSocket>, listener: &str) {
    use quinn::AsyncUdpSocket as _;
    let channel = socket
        .local_addr()
        .ok()
        .and_then(crate::handover::take_channel_from_new);
    let Some(channel) = channel else {
        tracing::info!(listener, "upgraded: the new process passes no HTTP/3 datagrams on to this one: its HTTP/3 connections are closed");
        endpoint.close(h3::H3_NO_ERROR, b"the server was upgraded");
        return;
    };
    // Rebinding to the same socket wakes the endpoint's driver to poll it anew.
    let switched = socket
        .read_from_new(channel)
        .and_then(|()| endpoint.rebind_abstract(socket.clone()));
    match switched {
        Ok(()) => tracing::info!(listener, "upgraded: this process's HTTP/3 connections finish on datagrams the new process passes on"),
        Err(error) => {
            tracing::warn!(listener, %error, "upgraded: cannot read the HTTP/3 datagrams the new process passes on: this process's HTTP/3 connections are closed");
            endpoint.close(h3::H3_NO_ERROR, b"the server was upgraded");
        }
    }
}

/// Accepts QUIC connections until the listener stops or the balancer shuts down; then new
/// connections are refused while those open finish (`h3::serve` closes them on shutdown).
async fn accept_loop(
    bound: (Udp, Keyed),
    state: Arc<ArcSwap<ListenerState>>,
    (mut stop, mut own): (watch::Receiver<bool>, watch::Receiver<bool>),
    shutdown: watch::Receiver<bool>,
    mut accepting: watch::Receiver<bool>,
    (connections, families, mut quic): (Arc<AtomicUsize>, QuicFamilies, QuicMetrics),
) {
    let mut down = shutdown.clone();
    tokio::select! {
        biased;
        _ = stop.changed() => return,
        _ = own.changed() => return,
        _ = shutting_down(&mut down) => return,
        open = accepting.wait_for(|open| *open) => {
            if open.is_err() {
                return;
            }
        }
    }
    let key = bound.1 .1.clone();
    let (endpoint, socket) = match endpoint(bound, &quic) {
        Ok(endpoint) => endpoint,
        Err(error) => {
            tracing::error!(listener = %state.load().config.name, %error, "cannot serve HTTP/3 (UDP): the listener serves TCP alone");
            return;
        }
    };
    // The state whose configuration the endpoint has (a reload stores a new one), and that
    // configuration: an `Incoming` holds the configuration in force when its first packet
    // came, so each is accepted with the one in force now (a reload applies to it). Its QUIC
    // series (`quic`) are under the listener's name in force (a reload may rename it).
    let mut configured = state.load_full();
    let mut config = h3::quic::server_config(&configured.config, &key)
        .ok()
        .map(Arc::new);
    loop {
        let incoming = tokio::select! {
            biased;
            _ = stop.changed() => break,
            _ = own.changed() => break,
            _ = shutting_down(&mut down) => break,
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => incoming,
                None => break,
            },
        };
        let now = state.load_full();
        if !Arc::ptr_eq(&now, &configured) {
            configured = now.clone();
            quic = families.listener(&now.config.name);
            config = match h3::quic::server_config(&now.config, &key) {
                Ok(fresh) => Some(Arc::new(fresh)),
                Err(error) => {
                    tracing::warn!(listener = %now.config.name, %error, "HTTP/3 configuration refused: new connections are refused");
                    None
                }
            };
            // For the next connections' first packets (the Retry tokens' key kept: a
            // client sent a Retry before the reload is validated by its token after it).
            endpoint.set_server_config(config.as_deref().cloned());
        }
        let Some(config) = &config else {
            incoming.refuse();
            continue;
        };
        let Some(http3) = now.config.tls.as_ref().and_then(|tls| tls.http3.as_ref()) else {
            incoming.refuse();
            continue;
        };
        // At `max_connections`: refused at once (the client may fall back to TCP, where it
        // waits in the backlog); QUIC's own packets are not queued by the kernel.
        let Some(held) = Held::new(&now, &connections) else {
            incoming.refuse();
            quic.refused.inc();
            continue;
        };
        // The listener's gauge is the count acted on: what the metrics show is what decides.
        let busy = quic.in_progress.get() >= i64::from(http3.retry_threshold);
        if busy && !incoming.remote_address_validated() && incoming.may_retry() {
            if incoming.retry().is_ok() {
                quic.retries.inc();
            }
            continue;
        }
        let handshake = h3::quic::Handshake::start(quic.clone());
        let connecting = match incoming.accept_with(config.clone()) {
            Ok(connecting) => connecting,
            Err(error) => {
                tracing::debug!(%error, "QUIC handshake failed");
                handshake.end(h3::quic::Outcome::Failed);
                continue;
            }
        };
        let limits = h3::Limits {
            idle_timeout: now.config.idle_timeout,
            header_read_timeout: now.config.header_read_timeout,
            max_header_bytes: now.config.max_header_bytes as u64,
            max_streams: http3.max_streams,
            max_backend_connections: now.config.http2.max_backend_connections,
        };
        let state = state.clone();
        let proxy = move || state.load().proxy.clone();
        tokio::spawn(h3::serve(
            connecting,
            limits,
            proxy,
            (shutdown.clone(), handshake),
            held,
        ));
    }
    // Refused from now on; the endpoint's socket closes with its last connection.
    endpoint.set_server_config(None);
    if crate::handover::is_handed_over() {
        // The new process serves on the same socket (see the module's documentation).
        hand_over(&endpoint, &socket, &state.load().config.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of full datagrams for the old process: 93 fitted in the channel (the kernel's
    /// default buffer), as many as the UDP socket's buffer holds fit now.
    #[test]
    fn a_burst_for_the_old_process_is_not_cut_at_the_kernel_s_default_buffer() {
        let (ours, _theirs) =
            socket2::Socket::pair(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None)
                .expect("a socket pair");
        let ours = std::os::fd::OwnedFd::from(ours);
        widen_channel(&ours);
        let ours = socket2::Socket::from(ours);
        ours.set_nonblocking(true).expect("non-blocking");
        let datagram = [7u8; 1240];
        let mut queued = 0usize;
        while ours.send(&datagram).is_ok() {
            queued += 1;
            assert!(queued < 1_000_000, "the channel never filled");
        }
        let max: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .expect("wmem_max")
            .trim()
            .parse()
            .expect("a number");
        // Each message costs the kernel about 2.3 KB of its buffer.
        let expected = QUIC_RECEIVE_BUFFER.min(max) / 4096;
        assert!(queued >= expected, "{queued} queued, {expected} expected");
    }

    /// The kernel keeps what was asked for, up to `net.core.rmem_max`.
    #[test]
    fn the_quic_socket_gets_the_receive_buffer_the_kernel_allows() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let before = socket2::SockRef::from(&socket)
            .recv_buffer_size()
            .expect("size");
        widen_receive_buffer(&socket, "test");
        let after = socket2::SockRef::from(&socket)
            .recv_buffer_size()
            .expect("size");
        let max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .expect("rmem_max")
            .trim()
            .parse()
            .expect("a number");
        assert_eq!(after / 2, QUIC_RECEIVE_BUFFER.min(max), "before: {before}");
    }
}
