//! TCP mode end to end: a `mode = "tcp"` listener relaying byte streams to a `protocol =
//! "tcp"` pool, with the pool's health deciding where each new session goes.
//!
//! `relay.rs` drives it with hand-written backends (half-close, timeouts, failover, hostile
//! clients); `redis.rs`, `postgres.rs` and `mariadb.rs` with real Redis, PostgreSQL and MariaDB
//! servers (the `peers` tier).

mod backend_tls;
mod hostile;
mod limits;
mod listener_limit;
mod mariadb;
mod observed;
mod postgres;
mod redis;
mod relay;
mod sni;
mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::support::{any, DEADLINE};

/// A config of one tcp listener (`listener` lines added) relaying to pool `db` over
/// `backends` (`pool` lines added to the pool's table, `extra` after it).
fn config(backends: &[(&str, SocketAddr)], listener: &str, pool: &str) -> String {
    let list = backends
        .iter()
        .map(|(name, addr)| format!("{{ name = \"{name}\", address = \"{addr}\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\npool = \"db\"\n{listener}\n\n\
         [pools.db]\nprotocol = \"tcp\"\nbackends = [{list}]\n{pool}\n"
    )
}

/// A backend that greets each connection with its name and a newline, echoes what it reads,
/// and once the client has sent its FIN, says `bye <name>` and closes its side: what a client
/// reads shows who served it and that both halves closed in order.
struct Greeter {
    addr: SocketAddr,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Greeter {
    async fn start(name: &'static str) -> Greeter {
        let listener = TcpListener::bind(any()).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _ = stream.write_all(format!("{name}\n").as_bytes()).await;
                    let mut buf = [0; 4096];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) => break,
                            Ok(n) => {
                                if stream.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                            Err(_) => return,
                        }
                    }
                    let _ = stream.write_all(format!("bye {name}\n").as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Greeter {
            addr,
            accepted,
            task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Greeter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The first line a session reads (a greeter's name), within the deadline.
async fn greeting(stream: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let read = async {
        loop {
            let mut byte = [0];
            match stream.read(&mut byte).await {
                Ok(1) if byte[0] != b'\n' => line.push(byte[0]),
                _ => break,
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("a greeting within the deadline");
    String::from_utf8_lossy(&line).into_owned()
}

/// Everything until the peer closes, within the deadline; `None` if the read failed (a reset).
async fn to_end(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut all))
        .await
        .expect("the session ends within the deadline")
        .ok()?;
    Some(all)
}

/// A loopback port nobody listens on, held while this lives: bound and never listening, so
/// connecting to it is refused and the kernel hands it to no other `127.0.0.1:0` bind (a port
/// released at once could become the balancer's own listener, which would then relay the
/// sessions of the "dead" backend back into itself).
struct RefusedPort {
    addr: SocketAddr,
    _socket: socket2::Socket,
}

/// A [`RefusedPort`].
fn refused_port() -> RefusedPort {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    socket.bind(&any.into()).expect("bind 127.0.0.1:0");
    let addr = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("a bound address");
    RefusedPort {
        addr,
        _socket: socket,
    }
}

/// Waits until both `backends` have gone UP (in either order).
async fn both_up(
    rx: &mut tokio::sync::broadcast::Receiver<capataz::health::Notice>,
    backends: [&str; 2],
) {
    use crate::support::events::{is_transition, wait_for};
    use capataz_health::State;
    let mut up = [false; 2];
    while up != [true; 2] {
        let event = wait_for(rx, "both UP", |e| {
            backends.iter().any(|b| is_transition(e, b, State::Up))
        })
        .await;
        for (seen, backend) in up.iter_mut().zip(backends) {
            *seen |= is_transition(&event, backend, State::Up);
        }
    }
}
