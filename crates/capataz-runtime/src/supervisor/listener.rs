//! The client listeners: binding, the accept loop, and what each connection reads per request.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use super::admission::{self, Held};
use super::unix_listen::ClientSocket;
use super::{Listening, StartError, Supervisor};
use crate::access_log::AccessLog;
use crate::balance::PoolHandle;
use crate::config::{Config, ListenerConfig};
use crate::downstream;
use crate::health::PoolRt;
use crate::instruments::HandshakeFailures;
use crate::proxy::{ClientInfo, Proxy};
use crate::tcp::TcpRelay;
use crate::tls::acme::ACME_TLS_ALPN;
use crate::tls::{ServerTls, TlsInfo};
use crate::workers::Workers;
use capataz_proxy_protocol::{Addresses, Rewind};

/// One client-facing listener at run time.
#[derive(Debug)]
pub(super) struct ListenerRt {
    pub(super) address: SocketAddr,
    pub(super) local: SocketAddr,
    /// The socket path of a listener on a Unix socket (its `address` is then `0.0.0.0:0`).
    pub(super) unix: Option<std::path::PathBuf>,
    pub(super) state: Arc<ArcSwap<ListenerState>>,
    pub(super) stop: watch::Sender<bool>,
    pub(super) task: JoinHandle<()>,
    /// The ACME task of a listener with `[listeners.tls.acme]`; replaced on every reload.
    pub(super) acme: Option<AcmeTask>,
    /// The OCSP stapling task of a TLS listener with `ocsp_fetch` or something to say about
    /// stapling; replaced on every reload.
    pub(super) ocsp: Option<AcmeTask>,
    /// A duplicate of the listening socket's descriptor, which a binary upgrade offers to the
    /// new process (read from the snapshot, [`Listening`]). Dropped with the listener and the
    /// snapshots listing it, so a stopped listener's socket closes. `None` if it could not be
    /// made (out of descriptors): an upgrade is then refused.
    pub(super) offer: Option<Arc<std::os::fd::OwnedFd>>,
    /// The HTTP/3 endpoint of a TLS listener with `[listeners.tls.http3]`.
    pub(super) http3: Option<super::http3::Http3Rt>,
}

impl ListenerRt {
    /// What readers see of it.
    pub(super) fn listening(&self) -> Listening {
        Listening {
            address: self.address,
            local: self.local,
            unix: self.unix.clone(),
            offer: self.offer.clone(),
            http3: self.http3.as_ref().and_then(|h| {
                let offer = h.offer.clone()?;
                Some((h.address, h.local, offer))
            }),
            state: self.state.clone(),
        }
    }

    /// Whether it is the listener `config` describes (the same address, or socket path).
    pub(super) fn serves(&self, config: &ListenerConfig) -> bool {
        self.address == config.address
            && self.unix.as_deref() == config.unix.as_ref().map(|unix| unix.path.as_path())
    }
}

/// For each listener of `config`, the index of the `running` one it keeps (the same
/// address, or socket path), or `None` for a listener to start. One to one: among running
/// listeners on the same address (several on `127.0.0.1:0`), one of the same name first, then
/// the others in order, so that removing or reordering such listeners leaves each on its own
/// socket with its own routes; two on `127.0.0.1:0` where one ran keep it and start a second.
/// A membership update pairs them the same way: a kept listener took its new config's name.
pub(super) fn kept(running: &[ListenerRt], config: &Config) -> Vec<Option<usize>> {
    let names: Vec<String> = running
        .iter()
        .map(|listener| listener.state.load().config.name.clone())
        .collect();
    let mut taken = vec![false; running.len()];
    let mut take = |listener: &ListenerConfig, named: bool| {
        let index = (0..running.len()).find(|&i| {
            !taken[i] && running[i].serves(listener) && (!named || names[i] == listener.name)
        })?;
        taken[index] = true;
        Some(index)
    };
    let mut kept: Vec<Option<usize>> = config
        .listeners
        .iter()
        .map(|listener| take(listener, true))
        .collect();
    for (slot, listener) in kept.iter_mut().zip(&config.listeners) {
        if slot.is_none() {
            *slot = take(listener, false);
        }
    }
    kept
}

/// A listener's ACME or OCSP stapling task, aborted when dropped (the listener stopped,
/// removed, or its TLS reloaded: the new `ServerTls` read its files again and gets a new task).
#[derive(Debug)]
pub(super) struct AcmeTask(JoinHandle<()>);

impl Drop for AcmeTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a listener's connections read per request: its settings and its routes.
#[derive(Debug)]
pub(super) struct ListenerState {
    pub(super) config: ListenerConfig,
    pub(super) proxy: Arc<Proxy>,
    /// A `mode = "tcp"` listener's relay (its `proxy` then has no routes).
    pub(super) tcp: Option<Arc<TcpRelay>>,
    /// Notified when any of the listener's connections closes, and when a reload stores a
    /// new state: what its accept loops wait on when full (the same for the
    /// listener's whole life, kept by every state a reload builds for it).
    pub(super) room: Arc<tokio::sync::Notify>,
    /// `capataz_client_connections_limit_reached_total` of a listener with `max_connections`.
    pub(super) limit_reached: Option<prometheus_client::metrics::counter::Counter>,
}

/// The request path's handles of `pools`, what a listener's `Proxy` routes to.
pub(super) fn handles(pools: &[Arc<PoolRt>]) -> Vec<Arc<PoolHandle>> {
    pools.iter().map(|pool| pool.handle().clone()).collect()
}

impl Supervisor {
    /// The access log of `listener` (kept from before a reload if its settings did not
    /// change, and then reopened), if it has one.
    pub(super) fn access_log(&self, listener: &ListenerConfig) -> Option<Arc<AccessLog>> {
        self.access_logs.for_listener(listener, || {
            self.metrics.families().access_log_dropped(&listener.name)
        })
    }

    /// What a listener reads per request with `config` in force: its proxy, routing to
    /// `pool_handles`, counting into the listener's metrics and writing to `access_log`,
    /// keeping the rate limits' buckets of `previous` (the state it replaces) where unchanged.
    pub(super) fn listener_state(
        &self,
        config: &ListenerConfig,
        pool_handles: &[Arc<PoolHandle>],
        access_log: Option<Arc<AccessLog>>,
        previous: Option<&ListenerState>,
    ) -> Arc<ListenerState> {
        let metrics = self.metrics.families().listener(&config.name);
        Arc::new(ListenerState {
            room: previous.map(|state| state.room.clone()).unwrap_or_default(),
            limit_reached: config
                .max_connections
                .map(|_| self.metrics.families().limit_reached(&config.name)),
            config: config.clone(),
            tcp: TcpRelay::new(
                config,
                pool_handles,
                (metrics.clone(), self.metrics.families()),
                access_log.clone(),
            )
            .map(Arc::new),
            proxy: Arc::new(Proxy::new(
                config,
                pool_handles,
                metrics,
                // HTTP-01 challenges are answered on plaintext listeners only.
                (
                    access_log,
                    config.tls.is_none().then(|| self.http01.clone()),
                ),
                previous.map(|state| &*state.proxy),
            )),
        })
    }

    /// Starts `listener`'s accept loop on `socket`.
    pub(super) fn spawn_listener(
        &self,
        listener: &ListenerConfig,
        socket: ClientSocket,
        pools: &[Arc<PoolRt>],
    ) -> ListenerRt {
        match socket {
            ClientSocket::Tcp(socket) => self.spawn_tcp_listener(listener, (socket, None), pools),
            ClientSocket::Http3(socket, udp) => {
                self.spawn_tcp_listener(listener, (socket, Some(udp)), pools)
            }
            ClientSocket::Unix(socket, file) => {
                self.spawn_unix_listener(listener, (socket, file), pools)
            }
        }
    }

    /// `udp`: its HTTP/3 socket, bound (`None`: bound here, if it serves HTTP/3, as in a
    /// process taking over, whose UDP port the old process still holds).
    fn spawn_tcp_listener(
        &self,
        listener: &ListenerConfig,
        (socket, udp): (TcpListener, Option<std::net::UdpSocket>),
        pools: &[Arc<PoolRt>],
    ) -> ListenerRt {
        let local = socket.local_addr().unwrap_or(listener.address);
        let offer = crate::handover::duplicate(&socket)
            .inspect_err(|error| {
                tracing::warn!(listener = %listener.name, %error, "cannot duplicate the listening socket: a binary upgrade will be refused");
            })
            .ok()
            .map(Arc::new);
        let resolved = super::http3::resolved(listener, local);
        let state = Arc::new(ArcSwap::new(self.listener_state(
            &resolved,
            &handles(pools),
            self.access_log(listener),
            None,
        )));
        let (stop, stop_rx) = watch::channel(false);
        if self.accepting() {
            tracing::info!(listener = %listener.name, address = %local, "listening");
        } else {
            tracing::info!(
                listener = %listener.name,
                address = %local,
                "listening, held: accepting once the takeover is ready"
            );
        }
        let task = tokio::spawn(accept_loop(
            socket,
            (state.clone(), self.workers.clone()),
            stop_rx,
            self.shutdown.subscribe(),
            self.accepting.subscribe(),
            self.connections.clone(),
            self.metrics
                .families()
                .tls()
                .handshake_failures(&listener.name, listener.tls.is_some()),
        ));
        let http3 = super::http3::http3_address(listener, local).and_then(|address| {
            self.spawn_http3(listener, (address, udp), state.clone(), stop.subscribe())
        });
        ListenerRt {
            address: listener.address,
            local,
            http3,
            unix: None,
            state,
            stop,
            task,
            acme: self.spawn_acme(listener),
            ocsp: self.spawn_stapling(listener),
            offer,
        }
    }

    /// Starts the ACME task of `listener`, if it has `[listeners.tls.acme]`.
    pub(super) fn spawn_acme(&self, listener: &ListenerConfig) -> Option<AcmeTask> {
        let loaded = listener.tls.as_ref()?.loaded.as_ref()?;
        let certs = loaded.acme()?.clone();
        if let Some(note) = loaded.acme_note() {
            tracing::warn!(listener = %listener.name, note, "the stored ACME certificate is not served");
        }
        Some(AcmeTask(tokio::spawn(crate::acme::run(
            listener.name.clone(),
            certs,
            self.http01.clone(),
            self.metrics.families().tls().clone(),
            self.shutdown.subscribe(),
        ))))
    }
}

impl Supervisor {
    /// Starts the OCSP stapling task of `listener`, if its TLS fetches responses (of static
    /// or ACME certificates) or noted something about stapling.
    pub(super) fn spawn_stapling(&self, listener: &ListenerConfig) -> Option<AcmeTask> {
        let loaded = listener.tls.as_ref()?.loaded.as_ref()?;
        if loaded.ocsp_fetches().is_empty()
            && loaded.ocsp_notes().is_empty()
            && loaded.acme_stapled().is_none()
        {
            return None;
        }
        Some(AcmeTask(tokio::spawn(crate::stapling::run(
            listener.name.clone(),
            loaded.clone(),
            self.shutdown.subscribe(),
        ))))
    }
}

/// Binds `listener`'s address (or its Unix socket path); `index` is its place in the config,
/// for the error.
pub fn bind_listener(index: usize, listener: &ListenerConfig) -> Result<ClientSocket, StartError> {
    if let Some(unix) = &listener.unix {
        return super::unix_listen::bind_unix(unix)
            .map(|(socket, file)| ClientSocket::Unix(socket, file))
            .map_err(|error| super::unix_listen::bind_error(index, listener, error));
    }
    super::http3::bind_with_udp(index, listener, || {
        bind(listener.address).map_err(|error| StartError::Bind {
            name: listener.name.clone(),
            key: format!("listeners[{index}].address"),
            address: listener.address,
            error,
        })
    })
}

/// Binds `address` (with `SO_REUSEADDR`), listening with a backlog of 1024.
pub fn bind(address: SocketAddr) -> io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(1024)
}

async fn accept_loop(
    socket: TcpListener,
    (state, workers): (Arc<ArcSwap<ListenerState>>, Workers),
    mut stop: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    mut accepting: watch::Receiver<bool>,
    connections: Arc<AtomicUsize>,
    failures: HandshakeFailures,
) {
    // A process taking over from an upgrading one holds its listeners until its backends are
    // decided: connections wait in the shared queue, taken by the old process meanwhile.
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
    // The address clients connect to, for PROXY protocol headers to backends; read per
    // connection only when the listener's address is a wildcard.
    let bound = socket.local_addr().ok();
    let mut hand = Hand {
        state,
        shutdown,
        failures,
        watchers: vec![None; workers.count()],
        workers,
    };
    loop {
        // Shutdown stops the accepting at once, not when the supervisor gets to its command
        // (it may be applying a reload): no connection is taken once shutdown began.
        let accepted = tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = shutting_down(&mut down) => return,
            accepted = socket.accept() => accepted,
        };
        // One taken in the same wake-up as the shutdown (the select can see the socket ready
        // first) is closed unserved as well.
        if *down.borrow() {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Out of descriptors and the like: back off briefly instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let local = match bound {
            Some(bound) if !bound.ip().is_unspecified() => Some(bound),
            _ => stream.local_addr().ok(),
        };
        // At `max_connections`, it waits unserved, and the next ones in the kernel's backlog.
        let admitted = admission::admit(&hand.state, &connections, (&mut stop, &mut down)).await;
        let Some(held) = admitted else {
            return;
        };
        hand.over(stream, (peer, local), held);
    }
}

/// What an accept loop hands each connection it accepts with: to which worker, and what
/// serving it needs.
struct Hand {
    state: Arc<ArcSwap<ListenerState>>,
    shutdown: watch::Receiver<bool>,
    failures: HandshakeFailures,
    workers: Workers,
    /// Per worker, the watcher of the connections it serves with the limits in force (a
    /// reload that changes them starts another; the old one ends with its last connection).
    watchers: Vec<Option<downstream::Watch>>,
}

impl Hand {
    /// Serves `stream`, from `peer` to `local`, on the worker with the fewest connections:
    /// its socket moved to that worker's reactor, its task (and its watcher's, the first time)
    /// spawned there.
    fn over(
        &mut self,
        stream: TcpStream,
        (peer, local): (SocketAddr, Option<SocketAddr>),
        held: Held,
    ) {
        // From here on, what is spawned is the worker's.
        let (placed, _worker, stream) = match self.workers.take(stream) {
            Ok(taken) => taken,
            Err(error) => {
                tracing::debug!(%peer, %error, "cannot hand the connection to its worker");
                return;
            }
        };
        let index = placed.index();
        let held = held.on_worker(placed);
        let state = self.state.clone();
        let now = state.load();
        if let Some(relay) = &now.tcp {
            let failures = (self.failures.clone(), held);
            crate::tcp::spawn(relay.clone(), &now.config, stream, (peer, local), failures);
            return;
        }
        drop(now);
        let (limits, protocol, tls, proxy_protocol) = in_force(&state.load().config, peer);
        let watch: &downstream::Watch = match &mut self.watchers[index] {
            Some(watch) if *watch.limits() == limits => watch,
            slot => slot.insert(downstream::Watch::start(limits, self.shutdown.clone())),
        };
        // The routes in force now: a reload applies to the next request on every connection.
        let proxy = move || state.load().proxy.clone();
        if !proxy_protocol && tls.is_none() {
            // The plain path, the common one: the task's future is the connection's own, with
            // nothing around it (a task is as big as its future's biggest stage, for the
            // connection's whole life, and an `async` block around it would also keep all it
            // captured).
            let mut client = ClientInfo::new(peer);
            client.destination = local;
            tokio::spawn(downstream::serve(
                stream, client, protocol, watch, proxy, held,
            ));
            return;
        }
        let connection = Connection {
            tls,
            protocol,
            watch: watch.clone(),
            shutdown: self.shutdown.clone(),
            failures: self.failures.clone(),
            held,
        };
        tokio::spawn(async move {
            if proxy_protocol {
                let addresses = (peer, local);
                serve_proxied(
                    connection,
                    stream,
                    addresses,
                    limits.header_read_timeout,
                    proxy,
                )
                .await;
            } else {
                connection.serve(stream, peer, local, proxy).await;
            }
        });
    }
}

/// What a connection accepted now gets from the listener's settings in force (a reload
/// applies to the next connection): its limits, its protocols, the certificates (a reload
/// applies to the next handshake) and whether `peer` is trusted to send a PROXY protocol
/// header.
pub(super) fn in_force(
    config: &ListenerConfig,
    peer: SocketAddr,
) -> (
    downstream::Limits,
    downstream::Protocol,
    Option<ServerTls>,
    bool,
) {
    let limits = downstream::Limits {
        idle_timeout: config.idle_timeout,
        header_read_timeout: config.header_read_timeout,
        max_buf: config.max_header_bytes.max(8192),
        max_header_list: u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX),
        http2: config.http2,
    };
    let protocol = if config.h2c {
        downstream::Protocol::Auto
    } else {
        downstream::Protocol::Http1
    };
    let tls = config.tls.as_ref().and_then(|t| t.loaded.clone());
    let proxy_protocol = config
        .proxy_protocol
        .as_ref()
        .is_some_and(|pp| pp.trusted.iter().any(|block| block.contains(peer.ip())));
    (limits, protocol, tls, proxy_protocol)
}

/// A connection from a trusted proxy: its PROXY protocol header read within `timeout` (or
/// until shutdown), then served as the client it names. `(peer, local)`: the connection's own
/// addresses, kept for a LOCAL or UNKNOWN header.
async fn serve_proxied<F>(
    connection: Connection,
    mut stream: TcpStream,
    (peer, local): (SocketAddr, Option<SocketAddr>),
    timeout: Duration,
    proxy: F,
) where
    F: Fn() -> Arc<Proxy> + Clone + Unpin + Send + Sync + 'static,
{
    let mut signal = connection.shutdown.clone();
    // Boxed, as every stage but the plain one: the task's future is as big as its biggest
    // stage, for the connection's whole life.
    let read = tokio::time::timeout(
        timeout,
        Box::pin(capataz_proxy_protocol::read_header(&mut stream)),
    );
    let read = tokio::select! {
        read = read => Some(read),
        _ = shutting_down(&mut signal) => None,
    };
    match read {
        Some(Ok(Ok((header, rest)))) => {
            // The client the proxy in front speaks for; LOCAL (the proxy's own health check)
            // and UNKNOWN keep the connection's own address.
            let (client, destination) = match header.addresses {
                Addresses::Proxied {
                    source,
                    destination,
                } => (source, Some(destination)),
                Addresses::Local => (peer, local),
            };
            let stream = Rewind::new(rest, stream);
            Box::pin(connection.serve(stream, client, destination, proxy)).await;
        }
        Some(Ok(Err(error))) => {
            tracing::debug!(%peer, %error, "PROXY protocol header refused");
        }
        Some(Err(_)) => {
            tracing::debug!(%peer, "PROXY protocol header timed out");
        }
        None => {}
    }
}

/// What serving one accepted connection needs, read from the listener when it was accepted.
struct Connection {
    tls: Option<ServerTls>,
    protocol: downstream::Protocol,
    watch: downstream::Watch,
    shutdown: watch::Receiver<bool>,
    failures: HandshakeFailures,
    /// Counts the connection open until its socket closes (an upgraded one's tunnel included).
    held: Held,
}

impl Connection {
    /// Serves `stream` for the client at `peer`, which connected to `destination`: over TLS
    /// after a handshake on a TLS listener, as it is otherwise.
    async fn serve<IO>(
        self,
        stream: IO,
        peer: SocketAddr,
        destination: Option<SocketAddr>,
        proxy: impl Fn() -> Arc<Proxy> + Clone + Unpin + Send + Sync + 'static,
    ) where
        IO: AsyncRead + AsyncWrite + downstream::PeekPeer + Unpin + Send + 'static,
    {
        let Connection {
            tls,
            protocol,
            watch,
            shutdown,
            failures,
            held,
        } = self;
        let limits = *watch.limits();
        match tls {
            None => {
                let mut client = ClientInfo::new(peer);
                client.destination = destination;
                downstream::serve(stream, client, protocol, &watch, proxy, held).await
            }
            Some(tls) => {
                let mut signal = shutdown.clone();
                let done = Box::pin(handshake(&tls, stream, limits, &failures));
                let done = tokio::select! {
                    done = done => done,
                    // A shutdown drops a connection still in its handshake, as one at rest.
                    _ = shutting_down(&mut signal) => None,
                };
                // A TLS-ALPN-01 validation ends with its handshake: it carries no request.
                let done = done.filter(|(_, info)| {
                    info.alpn.as_deref().map(str::as_bytes) != Some(ACME_TLS_ALPN)
                });
                if let Some((stream, info)) = done {
                    // ALPN decides: HTTP/2 when the client and capataz agreed on h2.
                    let protocol = if info.alpn_is_h2() {
                        downstream::Protocol::Http2
                    } else {
                        downstream::Protocol::Http1
                    };
                    let mut client = ClientInfo::with_tls(peer, info);
                    client.destination = destination;
                    // The TLS stream (rustls's connection state, inline) boxed apart: the
                    // connection's future moves its socket between stages and keeps a slot for
                    // it in more than one.
                    Box::pin(downstream::serve(
                        Box::new(stream),
                        client,
                        protocol,
                        &watch,
                        proxy,
                        held,
                    ))
                    .await;
                }
            }
        }
    }
}

/// Resolves once the balancer shuts down (never, should the sender be gone).
pub(super) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|down| *down).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The server side of a TLS handshake on a new connection, on the connection's own task,
/// within the listener's `header_read_timeout`. A failure is counted by reason and logged at
/// debug only (a port scan must not flood the log); the connection is then dropped, having
/// reached no backend.
async fn handshake<IO>(
    tls: &ServerTls,
    stream: IO,
    limits: downstream::Limits,
    failures: &HandshakeFailures,
) -> Option<(TlsStream<IO>, TlsInfo)>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let reason = match tokio::time::timeout(limits.header_read_timeout, tls.accept(stream)).await {
        Ok(Ok(done)) => {
            if crate::tls::resumed(&done.0) {
                failures.count_resumed();
            }
            return Some(done);
        }
        Ok(Err(error)) => {
            let reason = crate::tls::failure_reason(&error);
            tracing::debug!(%error, reason, "TLS handshake failed");
            reason
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            "timeout"
        }
    };
    failures.count(reason);
    None
}
