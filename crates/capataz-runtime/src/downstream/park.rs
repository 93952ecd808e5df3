//! An HTTP/1 connection's serving, and its parking between requests.
//!
//! Once the connection has served a request and then stayed quiet (no request in progress, no
//! head arriving, no byte either way) for a whole watcher period, the watcher asks it to park,
//! and hyper's connection (its state, its read and write buffers, 1 KB each at first and grown
//! by what a message needs, see vendor/hyper/CAPATAZ.md) is taken apart:
//! `graceful_shutdown` on an idle connection closes it at once without a byte written, the
//! socket's shutdown is swallowed (`Park::Parking`), and `into_parts` gives back the socket,
//! the service and any bytes read ahead. The parked connection then waits for its next bytes
//! on its socket like a new connection; at its next bytes a new hyper connection is built and
//! reads them first, as on the first request. The timeouts, the drain and the counters are the
//! watcher's, on the same `ConnState`, parked or not.
//!
//! A task is as big as its future's biggest stage for its whole life, so hyper's connection
//! and the future that drives it (a serving stretch, [`serving_stretch`]) are one box,
//! allocated when the client's bytes come and freed when the connection parks: the task itself
//! is only what waiting needs. One box per stretch (as hyper's connection alone was boxed
//! before), nothing per request: a connection under load never parks.
//!
//! A parked plain TCP connection also registers its socket anew in tokio's IO driver
//! (`PeekPeer::reregister`, two `epoll_ctl`s at park, never per request): its registration is
//! freed and allocated again, in the lowest free slot of its size class, so that parked
//! connections' registrations end up packed together rather than on the pages where a burst of
//! requests put them beside their backend connections' registrations, which are freed as those
//! go to sleep. BENCHMARKS.md, "Parked registrations packed".
//!
//! What parking frees goes first to the worker thread's allocator cache, which the allocator
//! empties only as the thread allocates again: after a burst of requests the worker is idle,
//! so a watcher's next look on that thread gives the cache back (`watch::parked_here`,
//! `workers::release_cache`: jemalloc's `thread.tcache.flush` in the binary).
//!
//! hyper takes a connection apart only when it is idle: with a request in progress the task
//! does not park (it checks `active` itself, the watcher's look may be stale), and a request
//! whose answer was sent while its body is still unread is no longer in progress for the
//! counters, but hyper then closes the connection after it in any case.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::task::Poll;

use bytes::Bytes;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{
    first_bytes, http1_builder, refused_by_hyper, register, until_closed, Close, ConnState,
    CountingIo, Park, PeekPeer, Tracked,
};
use crate::upstream::PrivateIdle;

/// How a run of hyper's HTTP/1 connection ended.
enum Run {
    /// The connection is over; whether hyper refused a request head (`refused_by_hyper`).
    Ended(bool),
    /// Taken apart to park.
    Parked,
}

/// How a serving stretch ended.
enum Stretch<IO, S, G> {
    /// The connection is over; whether hyper refused a request head.
    Ended(bool),
    /// Parked: the socket (with any bytes hyper had read ahead as its prefix) and the service.
    Parked(CountingIo<IO, G>, S),
}

/// Serves HTTP/1 on `io` until the connection ends, parking between requests (see the module
/// documentation); `private` is the connection's own idle backend connections, put to sleep
/// while it is parked (`PrivateIdle::sleep`). Returns whether hyper refused a request head.
/// `io` and `service` are lent by the connection's future, which keeps their only copies: each
/// stretch takes them and puts them back as it parks; what is left when this ends is the
/// caller's to drop.
// Not an `async fn`, whose future would keep its arguments twice.
#[allow(clippy::manual_async_fn)]
pub(super) fn serve_http1<'a, IO, S, G>(
    shared: &'a ConnState,
    private: &'a PrivateIdle,
    (io, service): (&'a mut Option<CountingIo<IO, G>>, &'a mut Option<S>),
    max_buf: usize,
) -> impl Future<Output = bool> + 'a
where
    IO: AsyncRead + AsyncWrite + PeekPeer + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = Tracked> + Unpin + 'a,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    G: Send + 'static,
{
    async move {
        loop {
            // The socket and the service by value only within these blocks, not across an
            // `await`: a binding whose scope spans one keeps a slot in this future even once
            // moved out.
            let stretch = {
                let (Some(socket), Some(lent)) = (io.take(), service.take()) else {
                    return false;
                };
                Box::pin(serving_stretch(shared, socket, lent, max_buf))
            };
            // The box is freed as the `await` ends, before the wait below.
            let parked;
            let wait = match stretch.await {
                Stretch::Ended(refused) => return refused,
                Stretch::Parked(socket, lent) => {
                    *service = Some(lent);
                    parked = Parked::new(shared);
                    if socket.prefix.is_some() {
                        // Bytes read ahead: the next stretch serves them at once.
                        *io = Some(socket);
                        false
                    } else {
                        // Its idle backend connections wait out of the IO driver too.
                        private.sleep();
                        // Its own socket registered anew, to pack parked connections'
                        // registrations together (see the module documentation).
                        let Ok(socket) = socket.reregistered() else {
                            return false;
                        };
                        *io = Some(socket);
                        true
                    }
                }
            };
            if wait {
                let Some(socket) = io.as_mut() else {
                    return false;
                };
                match until_closed(shared, pin!(first_bytes(socket))).await {
                    Some(Ok(Some(_))) => {}
                    // The client closed, went away, or a timeout or the drain closed the
                    // connection.
                    Some(Ok(None)) | Some(Err(_)) | None => return false,
                }
            }
            drop(parked);
        }
    }
}

/// hyper's connection on `io`, run until it ends or is taken apart to park.
async fn serving_stretch<IO, S, G>(
    shared: &ConnState,
    io: CountingIo<IO, G>,
    service: S,
    max_buf: usize,
) -> Stretch<IO, S, G>
where
    IO: AsyncRead + AsyncWrite + PeekPeer + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = Tracked> + Unpin,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    G: Send + 'static,
{
    let mut conn = http1_builder(max_buf)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    if let Run::Ended(refused) = run_http1(shared, &mut conn).await {
        return Stretch::Ended(refused);
    }
    let Some(parts) = conn.into_parts() else {
        return Stretch::Ended(false);
    };
    let mut io = parts.io.into_inner();
    // Bytes hyper read ahead (part of a next head) go back first, before any prefix hyper had
    // not read yet. (An empty `read_buf` may still hold hyper's read buffer: dropped here, not
    // kept while parked.)
    let ahead = parts.read_buf;
    if !ahead.is_empty() {
        // Part of a head, read with the request before it (so counted in `reads_at_rest` when
        // that one ended): a head arriving, timed by `header_read_timeout` from now, not a
        // quiet connection (which would also park again at every period).
        let reads = shared.reads.load(Ordering::Relaxed);
        shared
            .reads_at_rest
            .store(reads.saturating_sub(ahead.len() as u64), Ordering::Relaxed);
        io.prefix = Some(match io.prefix.take() {
            Some(rest) => {
                let mut joined = Vec::with_capacity(ahead.len() + rest.len());
                joined.extend_from_slice(&ahead);
                joined.extend_from_slice(&rest);
                Bytes::from(joined)
            }
            None => Bytes::copy_from_slice(&ahead),
        });
    }
    Stretch::Parked(io, parts.service)
}

/// Drives hyper's HTTP/1 connection until it ends, the watcher aborts it, or it is taken apart
/// to park ([`Run::Parked`]).
async fn run_http1<T, S>(shared: &ConnState, conn: &mut http1::UpgradeableConnection<T, S>) -> Run
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = Tracked> + Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut registered = false;
    let mut parking = false;
    poll_fn(|cx| {
        register(shared, cx, &mut registered);
        if shared.close.load(Ordering::Acquire) == Close::Abort {
            return Poll::Ready(Run::Ended(false));
        }
        if !parking && shared.park.load(Ordering::Acquire) == Park::Asked {
            // Not with a request in progress, nor with bytes of a head read since the last
            // request ended: the watcher may have looked before them (its loads are not one
            // snapshot), and hyper's graceful shutdown on a connection that has not finished
            // a request only turns keep-alive off: its answer would say `Connection: close`,
            // and the connection, taken apart with its shutdown swallowed, stay open.
            if shared.active.load(Ordering::Relaxed) == 0
                && shared.reads.load(Ordering::Relaxed)
                    <= shared.reads_at_rest.load(Ordering::Relaxed)
            {
                parking = true;
                shared.park.store(Park::Parking, Ordering::Relaxed);
                Pin::new(&mut *conn).graceful_shutdown();
            } else {
                // A request started, or a head began to arrive, since the watcher looked.
                shared.park.store(Park::Serving, Ordering::Relaxed);
            }
        }
        match Pin::new(&mut *conn).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) if parking => Poll::Ready(Run::Parked),
            Poll::Ready(ended) => {
                if parking {
                    shared.park.store(Park::Serving, Ordering::Relaxed);
                }
                Poll::Ready(Run::Ended(
                    ended.err().is_some_and(|e| refused_by_hyper(&e)),
                ))
            }
        }
    })
    .await
}

/// A parked connection, counted in the balancer's parked connections while it lives; its drop
/// sets the connection serving again.
struct Parked<'a>(&'a ConnState);

impl<'a> Parked<'a> {
    fn new(shared: &'a ConnState) -> Parked<'a> {
        shared.park.store(Park::Parked, Ordering::Relaxed);
        shared.listener.parked().fetch_add(1, Ordering::Relaxed);
        shared.listener.parked_now().inc();
        shared.listener.parks().fetch_add(1, Ordering::Relaxed);
        super::watch::parked_here();
        Parked(shared)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.listener.parked().fetch_sub(1, Ordering::Relaxed);
        self.0.listener.parked_now().dec();
        self.0.park.store(Park::Serving, Ordering::Relaxed);
    }
}
