//! One keep-alive connection: a request written, its answer read to its end.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::args::Args;

/// Room for an answer's head; a longer head fails the request.
const HEAD_ROOM: usize = 16 * 1024;

/// A connection to the server and what was read of its answers.
pub(crate) struct Connection {
    stream: TcpStream,
    request: Vec<u8>,
    buf: Box<[u8; HEAD_ROOM]>,
    /// Bytes of `buf` read and not yet used.
    filled: usize,
    /// The server said `Connection: close`: the next request needs a new connection.
    closing: bool,
}

impl Connection {
    pub(crate) async fn open(args: &Args) -> std::io::Result<Connection> {
        let stream = TcpStream::connect(args.addr).await?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            request: args.request.clone(),
            buf: Box::new([0; HEAD_ROOM]),
            filled: 0,
            closing: false,
        })
    }

    /// Sends the request and reads its answer; gives its status.
    pub(crate) async fn exchange(&mut self) -> Result<u16, String> {
        if self.closing {
            return Err("the server closed the connection".into());
        }
        self.stream
            .write_all(&self.request)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let (status, head, mut body) = loop {
            if let Some(parsed) = self.head()? {
                break parsed;
            }
            if self.filled == HEAD_ROOM {
                return Err(format!("an answer's head over {HEAD_ROOM} bytes"));
            }
            self.read_more().await?;
        };
        // What follows the head in the buffer is body; the rest is read and dropped.
        let ready = (self.filled - head).min(body);
        body -= ready;
        self.buf.copy_within(head + ready..self.filled, 0);
        self.filled -= head + ready;
        while body > 0 {
            self.read_more().await?;
            let take = self.filled.min(body);
            body -= take;
            self.buf.copy_within(take..self.filled, 0);
            self.filled -= take;
        }
        Ok(status)
    }

    async fn read_more(&mut self) -> Result<(), String> {
        match self.stream.read(&mut self.buf[self.filled..]).await {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.filled += n;
                Ok(())
            }
            Err(e) => Err(format!("read: {e}")),
        }
    }

    /// The answer's status, head length and body length, once its head is in the buffer.
    fn head(&mut self) -> Result<Option<(u16, usize, usize)>, String> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut answer = httparse::Response::new(&mut headers);
        let head = match answer.parse(&self.buf[..self.filled]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(format!("a malformed answer: {e}")),
        };
        let status = answer.code.unwrap_or(0);
        let mut length = None;
        for h in answer.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let text = std::str::from_utf8(h.value).unwrap_or("");
                length = Some(
                    text.trim()
                        .parse::<usize>()
                        .map_err(|_| "a bad Content-Length")?,
                );
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                return Err("a chunked answer (not supported: Content-Length only)".into());
            } else if h.name.eq_ignore_ascii_case("connection") {
                self.closing |= h.value.eq_ignore_ascii_case(b"close");
            }
        }
        let body = match (status, length) {
            (100..=199 | 204 | 304, _) => 0,
            (_, Some(n)) => n,
            (_, None) => return Err(format!("a {status} answer without Content-Length")),
        };
        Ok(Some((status, head, body)))
    }
}
