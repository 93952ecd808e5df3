//! The accept loop and one connection's request loop, where a request's behaviour runs.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use super::backend::Script;
use super::wire::{
    discard_chunked, discard_exact, plain_error, read_head, Body, HeadError, Request,
};
use super::{lock, Mode, HEALTH_PATH};

/// How a served connection ends.
enum End {
    /// Drop the socket normally (FIN).
    Close,
    /// Reset it (RST).
    Reset,
}

pub(super) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

pub(super) async fn accept_loop(
    slot: Arc<Mutex<Option<TcpListener>>>,
    script: Arc<Script>,
    crashed: watch::Receiver<bool>,
) {
    loop {
        // The lock is held only while polling, never across an await, so `crash` can take the
        // listener out at any moment.
        let accepted = std::future::poll_fn(|cx| match lock(&slot).as_ref() {
            Some(listener) => listener.poll_accept(cx),
            None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        })
        .await;
        match accepted {
            Ok((stream, _peer)) => {
                tokio::spawn(connection(stream, Arc::clone(&script), crashed.clone()));
            }
            Err(error) if error.kind() == io::ErrorKind::NotConnected => return,
            Err(error) => {
                // Typically out of file descriptors: back off instead of spinning.
                tracing::debug!(backend = %script.name, %error, "sim accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn connection(
    mut stream: TcpStream,
    script: Arc<Script>,
    mut crashed: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let end = tokio::select! {
        end = serve_connection(&mut stream, &script) => end,
        // A dropped sender (the backend was dropped) counts as a crash too.
        _ = crashed.wait_for(|crashed| *crashed) => End::Reset,
    };
    if let End::Reset = end {
        let _ = stream.set_zero_linger();
    }
    drop(stream);
}

/// Serves requests on one connection until it should end, and says how.
async fn serve_connection(stream: &mut TcpStream, script: &Script) -> End {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let head = match read_head(stream, &mut buf).await {
            Ok(Some(head)) => head,
            Ok(None) => return End::Close,
            Err(HeadError::Io) => return End::Close,
            Err(HeadError::TooLarge) => {
                let _ = stream.write_all(&plain_error(431)).await;
                return End::Close;
            }
        };
        let Some(request) = Request::parse(&head) else {
            let _ = stream.write_all(&plain_error(400)).await;
            return End::Close;
        };
        let discarded = match request.body {
            Body::None => Ok(()),
            Body::Length(length) => discard_exact(stream, &mut buf, length).await,
            Body::Chunked => discard_chunked(stream, &mut buf).await,
        };
        if discarded.is_err() {
            return End::Close;
        }
        let mode = script.handle_request(request.path() == HEALTH_PATH);
        let mut retry_after = None;
        let code = match mode {
            Mode::Status(code) => code,
            // Resolved by `handle_request`.
            Mode::FailEvery(_, code) => code,
            Mode::RetryAfter(code, seconds) => {
                retry_after = Some(seconds);
                code
            }
            Mode::Delay(delay, code) => {
                tokio::time::sleep(delay).await;
                code
            }
            Mode::Hang => {
                drain_until_closed(stream).await;
                return End::Close;
            }
            Mode::Close => return End::Close,
            Mode::Reset => return End::Reset,
            Mode::Garbage => {
                let _ = stream.write_all(b"garbage\r\n\r\n").await;
                return End::Close;
            }
        };
        let response = request.response(code, &script.name, retry_after);
        if stream.write_all(&response).await.is_err() || !request.keep_alive {
            return End::Close;
        }
    }
}

/// Reads and discards until the peer closes or the connection fails.
async fn drain_until_closed(stream: &mut TcpStream) {
    let mut chunk = [0u8; 8192];
    while let Ok(n) = stream.read(&mut chunk).await {
        if n == 0 {
            return;
        }
    }
}
