//! The HTTP/1.1 client over a transport that is not TCP: an in-memory duplex stream carries
//! requests, answers and bodies end to end, and the reuse check works on it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::{exchange, ExchangeTimeouts, Outgoing, ResponseStream, Transport};

/// An in-memory stream: the same HTTP/1.1 client over something not TCP. Its reads go through
/// tokio's `read_buf`, and its reuse check looks for bytes with a waker that wakes nothing.
impl Transport for DuplexStream {
    type ReadHalf<'a> = tokio::io::ReadHalf<&'a mut DuplexStream>;
    type WriteHalf<'a> = tokio::io::WriteHalf<&'a mut DuplexStream>;

    fn split(&mut self) -> (Self::ReadHalf<'_>, Self::WriteHalf<'_>) {
        tokio::io::split(self)
    }

    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<std::io::Result<usize>> {
        let read = self.read_buf(buf);
        tokio::pin!(read);
        std::future::Future::poll(read, cx)
    }

    fn still_open(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        tokio::io::AsyncRead::poll_read(Pin::new(self), &mut cx, &mut buf).is_pending()
    }
}

const TIMEOUTS: ExchangeTimeouts = ExchangeTimeouts {
    response_header: Duration::from_secs(10),
    body_idle: Duration::from_secs(10),
    request_body: Duration::from_secs(10),
};

/// A request body given whole.
#[derive(Default)]
struct Whole(Option<Bytes>);

impl Body for Whole {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Poll::Ready(self.get_mut().0.take().map(|data| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

/// Reads one request (head, and a body of `body_len` bytes) from the backend's end.
async fn read_request(backend: &mut DuplexStream, body_len: usize) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") {
        assert_eq!(
            backend.read(&mut byte).await.unwrap(),
            1,
            "request cut short"
        );
        seen.push(byte[0]);
    }
    let mut body = vec![0u8; body_len];
    backend.read_exact(&mut body).await.unwrap();
    seen.extend_from_slice(&body);
    seen
}

/// Reads a whole answer's body from `stream`; the connection back if it is reusable.
async fn read_body(
    stream: DuplexStream,
    buf: BytesMut,
    framing: capataz_h1::framing::Framing,
) -> (Vec<u8>, Option<DuplexStream>) {
    let mut body = ResponseStream::new(stream, buf, framing, TIMEOUTS.body_idle);
    let mut out = Vec::new();
    while let Some(data) = std::future::poll_fn(|cx| body.poll_data(cx)).await.unwrap() {
        out.extend_from_slice(&data);
    }
    (out, body.finish())
}

/// One exchange of `request` on `stream` (no upgrade asked, the tests' timeouts); its answer,
/// or a panic saying `what` failed.
async fn get_answer(
    stream: DuplexStream,
    request: Request<Whole>,
    head: &mut Vec<u8>,
    what: &str,
) -> super::exchange::Answer<DuplexStream> {
    match exchange(
        stream,
        Outgoing::Request(request),
        head,
        false,
        TIMEOUTS,
        Instant::now(),
    )
    .await
    {
        Ok(answer) => answer,
        Err(_) => panic!("{what}"),
    }
}

#[tokio::test]
async fn exchange_runs_over_an_in_memory_transport() {
    let (client, mut backend) = tokio::io::duplex(1024);
    let server = tokio::spawn(async move {
        // First request: a POST with a body; the answer arrives in pieces.
        let request = read_request(&mut backend, 4).await;
        let text = String::from_utf8(request).unwrap();
        assert!(text.starts_with("POST /upload?x=1 HTTP/1.1\r\n"), "{text}");
        assert!(text.contains("content-length: 4\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nping"), "{text}");
        for piece in [
            &b"HTTP/1.1 200 OK\r\nContent-Le"[..],
            b"ngth: 5\r\n\r\nhe",
            b"llo",
        ] {
            backend.write_all(piece).await.unwrap();
            backend.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        // Second request on the same connection: a chunked answer after an interim one.
        let request = read_request(&mut backend, 0).await;
        assert!(request.starts_with(b"GET / HTTP/1.1\r\n"));
        backend
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            .await
            .unwrap();
        tokio::task::yield_now().await;
        backend.write_all(b"2\r\nde\r\n0\r\n\r\n").await.unwrap();
        // Then stray bytes nobody asked for.
        let request = read_request(&mut backend, 0).await;
        assert!(request.starts_with(b"GET /third HTTP/1.1\r\n"));
        backend
            .write_all(b"HTTP/1.1 204 No Content\r\n\r\nSTRAY")
            .await
            .unwrap();
        backend
    });

    let mut head = Vec::new();
    let request = Request::post("/upload?x=1")
        .header("host", "example")
        .body(Whole(Some(Bytes::from_static(b"ping"))))
        .unwrap();
    let answer = get_answer(client, request, &mut head, "the first exchange failed").await;
    assert_eq!(answer.head.status, StatusCode::OK);
    let (body, stream) = read_body(answer.stream, answer.buf, answer.framing).await;
    assert_eq!(body, b"hello");
    let stream = stream.expect("a Content-Length answer read whole is reusable");

    let request = Request::get("/").body(Whole(None)).unwrap();
    let answer = get_answer(stream, request, &mut head, "the second exchange failed").await;
    assert_eq!(answer.head.status, StatusCode::CREATED);
    let (body, stream) = read_body(answer.stream, answer.buf, answer.framing).await;
    assert_eq!(body, b"abcde");
    let mut stream = stream.expect("a chunked answer read whole is reusable");
    assert!(
        stream.still_open(),
        "an idle connection with nothing on it is usable"
    );

    let request = Request::get("/third").body(Whole(None)).unwrap();
    let answer = get_answer(stream, request, &mut head, "the third exchange failed").await;
    assert_eq!(answer.head.status, StatusCode::NO_CONTENT);
    let (body, stream) = read_body(answer.stream, answer.buf, answer.framing).await;
    assert!(body.is_empty());
    // The stray bytes came with the answer: the connection is not handed back.
    assert!(stream.is_none());
    drop(server.await.unwrap());
}

#[tokio::test]
async fn still_open_sees_stray_bytes_and_closes_on_any_transport() {
    let (mut a, mut b) = tokio::io::duplex(64);
    assert!(a.still_open());
    b.write_all(b"x").await.unwrap();
    assert!(!a.still_open(), "bytes nobody asked for make it unusable");
    let (mut a, b) = tokio::io::duplex(64);
    drop(b);
    assert!(!a.still_open(), "a closed stream is not usable");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_body_times_out_over_any_transport() {
    let (client, mut backend) = tokio::io::duplex(1024);
    backend
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let request = Request::builder()
        .method(Method::GET)
        .uri("/")
        .body(Whole(None))
        .unwrap();
    let mut head = Vec::new();
    let answer = get_answer(client, request, &mut head, "the exchange failed").await;
    let mut body = ResponseStream::new(
        answer.stream,
        answer.buf,
        answer.framing,
        TIMEOUTS.body_idle,
    );
    let first = std::future::poll_fn(|cx| body.poll_data(cx)).await;
    assert_eq!(first.unwrap().as_deref(), Some(&b"abc"[..]));
    let stalled = std::future::poll_fn(|cx| body.poll_data(cx)).await;
    assert_eq!(stalled, Err(super::AttemptError::BodyStalled));
    drop(backend);
}

/// A head longer than the first read (2 KB, through the thread's buffer) goes on in the
/// answer's own buffer; its fields and the body after it come out whole, and the next answer
/// on the connection starts afresh.
#[tokio::test]
async fn a_head_longer_than_the_first_read_is_read_whole() {
    let (client, mut backend) = tokio::io::duplex(64 * 1024);
    let long = "v".repeat(1000);
    let server = tokio::spawn(async move {
        read_request(&mut backend, 0).await;
        let mut answer = String::from("HTTP/1.1 200 OK\r\n");
        for n in 0..5 {
            answer.push_str(&format!("x-long-{n}: {long}\r\n"));
        }
        answer.push_str("Content-Length: 3\r\n\r\nxyz");
        assert!(answer.len() > super::FIRST_READ);
        backend.write_all(answer.as_bytes()).await.unwrap();
        read_request(&mut backend, 0).await;
        backend
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        backend
    });
    let mut head = Vec::new();
    let mut stream = client;
    for expected in [&b"xyz"[..], b"ok"] {
        let request = Request::get("/").body(Whole(None)).unwrap();
        let answer = get_answer(stream, request, &mut head, "the exchange failed").await;
        assert_eq!(answer.head.status, StatusCode::OK);
        if expected == b"xyz" {
            assert_eq!(answer.head.headers.len(), 6);
            for value in answer.head.headers.values().take(5) {
                assert_eq!(value.as_bytes(), "v".repeat(1000).as_bytes());
            }
        } else {
            assert_eq!(answer.head.headers.len(), 1);
        }
        let (body, back) = read_body(answer.stream, answer.buf, answer.framing).await;
        assert_eq!(body, expected);
        stream = back.expect("a Content-Length answer read whole is reusable");
    }
    drop(server.await.unwrap());
}

/// A plain backend connection whose peer went away before the request was sent (it closed or
/// reset a pooled connection just after the reuse check), with the head held for the worker's
/// flusher (`outbox`): the read sees the end first, but not a byte of the request went, so
/// the request comes back `NotSent` (a pooled connection's is tried again on a fresh one), as
/// a write made at once would have said.
#[tokio::test]
async fn a_held_head_on_a_connection_that_ended_before_it_went_is_not_sent() {
    for reset in [true, false] {
        let _flusher = crate::outbox::start_flusher();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (peer, _) = listener.accept().await.unwrap();
        if reset {
            // Deprecated for blocking on drop with a timeout; a zero timeout resets at once.
            #[allow(deprecated)]
            peer.set_linger(Some(Duration::ZERO)).unwrap();
        }
        drop(peer);
        // The end has arrived: the socket is readable.
        tokio::time::timeout(Duration::from_secs(10), ours.readable())
            .await
            .unwrap()
            .unwrap();
        let request = Request::builder()
            .method(Method::POST)
            .uri("/once")
            .body(Whole(None))
            .unwrap();
        let mut head = Vec::new();
        let sent = exchange(
            ours,
            Outgoing::Request(request),
            &mut head,
            false,
            TIMEOUTS,
            Instant::now(),
        )
        .await;
        assert!(
            matches!(sent, Err(super::ExchangeError::NotSent(_))),
            "reset {reset}: nothing went, so it is not sent"
        );
    }
}
