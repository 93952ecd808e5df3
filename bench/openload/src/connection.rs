//! One keep-alive connection, non-blocking: a request written, its answer read to its end.

use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Socket, Type};

/// Room for an answer's head; a longer head fails the request.
const HEAD_ROOM: usize = 16 * 1024;

/// A connection to the server and what was read of its answers.
pub(crate) struct Connection {
    stream: TcpStream,
    buf: Box<[u8; HEAD_ROOM]>,
    /// Bytes of `buf` read and not yet used.
    filled: usize,
    /// The answer being read, once its head is in: its status and the body bytes still to come.
    body: Option<(u16, usize)>,
    /// The socket had nothing more to read at the last read, and no readiness event came since
    /// (it is watched edge-triggered): reading again would only return `WouldBlock`.
    drained: bool,
    /// The server closed its side, or the socket is in error: read to the end (a short read
    /// does not tell that the end was read too, and no further event would come).
    hung_up: bool,
    /// The server said `Connection: close`: the next request needs a new connection.
    pub(crate) closing: bool,
}

impl Connection {
    /// A connection already open (the blocking connects before the schedule starts).
    pub(crate) fn from_stream(stream: TcpStream) -> io::Result<Connection> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Connection {
            stream,
            buf: Box::new([0; HEAD_ROOM]),
            filled: 0,
            body: None,
            drained: false,
            hung_up: false,
            closing: false,
        })
    }

    /// Starts opening a connection without waiting; gives it and whether it is already open
    /// (if not, it is once its socket is writable: see [`Connection::opened`]).
    pub(crate) fn connect(addr: SocketAddr) -> io::Result<(Connection, bool)> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        let open = match socket.connect(&addr.into()) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => false,
            Err(e) => return Err(e),
        };
        Ok((Connection::from_stream(socket.into())?, open))
    }

    /// Whether a connect begun by [`Connection::connect`] succeeded, once the socket is
    /// writable or in error.
    pub(crate) fn opened(&self) -> io::Result<()> {
        match self.stream.take_error()? {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// A readiness event came, with epoll's `flags`: there may be something to read again.
    pub(crate) fn ready(&mut self, flags: u32) {
        self.drained = false;
        self.hung_up |= flags & (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
    }

    /// Writes what it can of `bytes`: how many were written (0: the socket's buffer is full,
    /// wait for it to be writable).
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<usize, String> {
        loop {
            match self.stream.write(bytes) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("write: {e}")),
            }
        }
    }

    /// Reads what the socket holds of the awaited answer: its status once it is complete to
    /// the end of its body (the body is read and dropped), `None` while more is to come.
    /// Bytes past its end stay for the next answer.
    pub(crate) fn answer(&mut self) -> Result<Option<u16>, String> {
        loop {
            if self.body.is_none() && self.filled > 0 {
                if let Some((status, head, body)) = self.head()? {
                    self.consume(head);
                    self.body = Some((status, body));
                } else if self.filled == HEAD_ROOM {
                    return Err(format!("an answer's head over {HEAD_ROOM} bytes"));
                }
            }
            if let Some((status, left)) = self.body {
                let take = self.filled.min(left);
                self.consume(take);
                if left == take {
                    self.body = None;
                    return Ok(Some(status));
                }
                self.body = Some((status, left - take));
            }
            if self.drained {
                return Ok(None);
            }
            self.read_more()?;
        }
    }

    /// Drops the first `n` bytes of the buffer.
    fn consume(&mut self, n: usize) {
        if n > 0 {
            self.buf.copy_within(n..self.filled, 0);
            self.filled -= n;
        }
    }

    /// One read into the buffer's free room (never empty here: a full buffer is a complete
    /// head, whose bytes are consumed, or a failed answer).
    fn read_more(&mut self) -> Result<(), String> {
        let room = HEAD_ROOM - self.filled;
        match self.stream.read(&mut self.buf[self.filled..]) {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.filled += n;
                // A read that does not fill the room took all the socket held: whatever comes
                // later raises a new readiness event (but for the end of the stream, which may
                // already be there).
                self.drained = n < room && !self.hung_up;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.drained = true;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(format!("read: {e}")),
        }
    }

    /// The answer's status, head length and body length, once its head is in the buffer.
    fn head(&mut self) -> Result<Option<(u16, usize, usize)>, String> {
        // Not initialised: httparse writes the headers it finds (no 2 KB to clear per answer).
        let mut headers = [MaybeUninit::<httparse::Header<'_>>::uninit(); 64];
        let mut answer = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut answer,
            &self.buf[..self.filled],
            &mut headers,
        );
        let head = match parsed {
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

#[cfg(test)]
mod tests {
    use super::{Connection, HEAD_ROOM};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    /// A connection whose server writes `script` (a pause between pieces), then closes.
    fn serve(script: Vec<Vec<u8>>) -> Connection {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut server, _) = listener.accept().unwrap();
            for piece in script {
                if server.write_all(&piece).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Connection::from_stream(TcpStream::connect(addr).unwrap()).unwrap()
    }

    /// The next answer, as the loop would get it: reading on every (here: pretended) event.
    fn answer(link: &mut Connection) -> Result<u16, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            link.ready(0);
            if let Some(status) = link.answer()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no answer in 5 s");
    }

    #[test]
    fn answers_are_read_to_the_end_of_their_body_across_reads() {
        let big = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n".to_vec(),
            vec![b'x'; 100_000],
        ];
        let mut link = serve(vec![
            b"HTTP/1.1 200 OK\r\nConte".to_vec(), // a head in two pieces
            b"nt-Length: 3\r\n\r\nok\n".to_vec(),
            big.concat(), // a body larger than the buffer
            // an answer and the start of the next in one piece, no body, then a close
            b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\nnoHTTP/1.1 204 No Content\r\n".to_vec(),
            b"\r\nHTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ]);
        assert_eq!(answer(&mut link), Ok(200));
        assert_eq!(answer(&mut link), Ok(200));
        assert_eq!(answer(&mut link), Ok(503));
        assert_eq!(answer(&mut link), Ok(204));
        assert!(!link.closing);
        assert_eq!(answer(&mut link), Ok(200));
        assert!(link.closing);
        assert_eq!(
            answer(&mut link),
            Err("the server closed the connection".into())
        );
    }

    #[test]
    fn broken_answers_fail_their_request() {
        let fails = |script: Vec<Vec<u8>>, says: &str| {
            let error = answer(&mut serve(script)).unwrap_err();
            assert!(error.contains(says), "{error:?} does not say {says:?}");
        };
        fails(vec![b"garbage\r\n\r\n".to_vec()], "malformed");
        fails(
            vec![[b"HTTP/1.1 200 OK\r\nX: ".to_vec(), vec![b'a'; HEAD_ROOM]].concat()],
            "head over",
        );
        fails(
            vec![b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()],
            "chunked",
        );
        fails(
            vec![b"HTTP/1.1 200 OK\r\n\r\n".to_vec()],
            "without Content-Length",
        );
        fails(
            vec![b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n".to_vec()],
            "bad Content-Length",
        );
        fails(vec![b"HTTP/1.1 200 OK\r\nContent-Le".to_vec()], "closed");
        fails(
            vec![b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok".to_vec()],
            "closed",
        );
    }
}
