//! A TCP relay of the test's own between one client and one server, that can be cut and
//! mended: a network partition between one balancer and etcd, while the others still reach it.
//!
//! Cut, it resets every connection it relays and closes each new one as soon as it accepts it
//! (the client sees its connection end before any answer); mended, it relays again. Its tasks
//! run on the runtime it was started on and end when it is dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running relay.
pub struct Relay {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    accepted: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// Listens on an ephemeral port of 127.0.0.1 and relays every connection to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a relay");
        let addr = listener.local_addr().expect("the relay's address");
        let (open, watching) = watch::channel(true);
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if !*watching.borrow() {
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, target, watching.clone()));
            }
        });
        Relay {
            addr,
            open,
            accepted,
            accept,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far (relayed or refused).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Cuts every relayed connection and refuses new ones until [`Relay::mend`].
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Relays new connections again.
    pub fn mend(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        // Every connection task watches `open`: it ends when the sender goes.
        self.open.send_replace(false);
    }
}

/// One relayed connection, until either side closes or the relay is cut.
async fn relay(mut client: TcpStream, target: SocketAddr, mut open: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = open.wait_for(|open| !*open) => {
            // A reset rather than a FIN: a partition does not say goodbye.
            let _ = socket2::SockRef::from(&client).set_linger(Some(std::time::Duration::ZERO));
        }
    }
}
