//! Keep-alive connections to one backend: a small stack of idle HTTP/1.1 connections, reused
//! most-recent first, and fresh connects with a deadline.
//!
//! A connection is handed back only once the response it carried has been read to its end
//! (see `body::Lease`), so an idle connection is always ready for the next request. Connections
//! the backend closed, or that sat idle too long, are dropped when met.

use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use capataz_health::Outcome;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::body::ReqBody;

/// The most idle connections kept per backend.
const MAX_IDLE: usize = 512;

/// A connection ready to carry one request.
pub(crate) struct Conn {
    pub(crate) sender: SendRequest<ReqBody>,
    /// Whether it came from the idle set (it may have been closed by the backend meanwhile).
    pub(crate) reused: bool,
}

/// The keep-alive connections to one backend.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle: Mutex<Vec<(SendRequest<ReqBody>, Instant)>>,
}

impl Upstream {
    /// An empty connection set for `addr`.
    pub fn new(addr: SocketAddr, connect_timeout: Duration, idle_timeout: Duration) -> Upstream {
        Upstream {
            addr,
            connect_timeout,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The backend's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// An idle connection if one is still open, else a fresh one. A failed connect is returned
    /// as the outcome the traffic rule judges: `Refused` or `Timeout` (nothing was sent).
    /// `now` is the caller's reading of the clock, to judge idle time without another.
    pub(crate) async fn acquire(&self, now: Instant) -> Result<Conn, Outcome> {
        if let Some(sender) = self.pop_idle(now) {
            return Ok(Conn {
                sender,
                reused: true,
            });
        }
        self.connect().await
    }

    /// A fresh connection, never a pooled one.
    pub(crate) async fn connect(&self) -> Result<Conn, Outcome> {
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(self.addr)).await {
                Err(_) => return Err(Outcome::Timeout),
                Ok(Err(e)) => return Err(connect_error(&e)),
                Ok(Ok(stream)) => stream,
            };
        let _ = stream.set_nodelay(true);
        // One `send` per write rather than a `writev` (see `client::serve`).
        let (sender, connection) = match http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
        {
            Ok(pair) => pair,
            Err(_) => return Err(Outcome::Reset),
        };
        tokio::spawn(async move {
            // Errors here surface on the request that used the connection.
            let _ = connection.with_upgrades().await;
        });
        Ok(Conn {
            sender,
            reused: false,
        })
    }

    fn pop_idle(&self, now: Instant) -> Option<SendRequest<ReqBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((sender, since)) = idle.pop() {
            if !sender.is_closed() && now.saturating_duration_since(since) < self.idle_timeout {
                return Some(sender);
            }
        }
        None
    }

    /// Hands back a connection whose response was read to its end; its idle time counts from
    /// `since` (when its response arrived: close enough, and no clock read).
    pub(crate) fn release(&self, sender: SendRequest<ReqBody>, since: Instant) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((sender, since));
        }
    }

    /// Drops idle connections that were closed or sat idle longer than the idle timeout.
    pub fn reap(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|(sender, since)| !sender.is_closed() && since.elapsed() < self.idle_timeout);
    }

    /// Drops every idle connection.
    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// How many idle connections are kept.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

fn connect_error(error: &io::Error) -> Outcome {
    match error.kind() {
        io::ErrorKind::TimedOut => Outcome::Timeout,
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Outcome::Reset,
        _ => Outcome::Refused,
    }
}
