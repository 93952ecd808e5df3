//! A streamed admin answer read as it comes (`GET /record/<pool>`): the head, then the
//! chunked body decoded into text, read until the text says what a test waits for.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::DEADLINE;

/// An open streamed answer.
pub struct Stream {
    socket: TcpStream,
    raw: Vec<u8>,
    /// The body decoded so far.
    pub text: String,
    /// Whether the body ended (the last chunk came, or the connection closed).
    pub ended: bool,
}

/// Sends `GET path` to `admin` with `headers` (`"Name: value\r\n"` lines) and reads the head:
/// returns its status and the stream of its body.
pub async fn open(admin: SocketAddr, path: &str, headers: &str) -> (u16, Stream) {
    let mut socket = TcpStream::connect(admin)
        .await
        .expect("the admin API accepts");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\n{headers}\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut stream = Stream {
        socket,
        raw: Vec::new(),
        text: String::new(),
        ended: false,
    };
    let end = loop {
        if let Some(at) = stream.raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        assert!(stream.fill().await, "the connection closed before the head");
    };
    let head = String::from_utf8_lossy(&stream.raw[..end]).into_owned();
    stream.raw.drain(..end + 4);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        // A plain error answer: read what came, as is.
        stream.text = String::from_utf8_lossy(&stream.raw).into_owned();
        stream.ended = true;
    }
    (status, stream)
}

impl Stream {
    /// Reads more bytes; false when the connection closed.
    async fn fill(&mut self) -> bool {
        let mut buf = [0u8; 16 * 1024];
        let n = tokio::time::timeout(DEADLINE, self.socket.read(&mut buf))
            .await
            .expect("the stream answers within the deadline")
            .unwrap_or(0);
        self.raw.extend_from_slice(&buf[..n]);
        n > 0
    }

    /// Moves every whole chunk read so far into `text`.
    fn decode(&mut self) {
        loop {
            let Some(line) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size = std::str::from_utf8(&self.raw[..line])
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                .expect("a chunk size");
            if size == 0 {
                self.ended = true;
                return;
            }
            if self.raw.len() < line + 2 + size + 2 {
                return;
            }
            let data = &self.raw[line + 2..line + 2 + size];
            self.text.push_str(&String::from_utf8_lossy(data));
            self.raw.drain(..line + 2 + size + 2);
        }
    }

    /// Reads until `done(text)` holds, or panics after the deadline (or at the body's end).
    pub async fn read_until(&mut self, what: &str, done: impl Fn(&str) -> bool) {
        let end = tokio::time::Instant::now() + DEADLINE;
        loop {
            self.decode();
            if done(&self.text) {
                return;
            }
            assert!(!self.ended, "the stream ended before {what}: {}", self.text);
            assert!(
                tokio::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            if !self.fill().await {
                self.ended = true;
            }
        }
    }
}
