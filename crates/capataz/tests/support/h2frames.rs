//! HTTP/2 frames written and read by hand (RFC 9113 section 4), for tests that must send what
//! no well-behaved client sends: resets in a loop, endless CONTINUATION frames, floods of
//! PING and SETTINGS, more streams than allowed. Header blocks are HPACK literals without
//! indexing or Huffman coding (RFC 7541 section 6.2.2), which every decoder must accept.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types.
pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const CONTINUATION: u8 = 9;

/// Flags.
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// Error codes.
pub const NO_ERROR: u32 = 0;
pub const CANCEL: u32 = 8;
pub const ENHANCE_YOUR_CALM: u32 = 11;

/// SETTINGS_MAX_CONCURRENT_STREAMS.
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 3;

/// One frame: its 9-byte header and payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    assert!(len < 1 << 24, "frame payload too large");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A SETTINGS frame with `settings` (identifier, value).
pub fn settings(settings: &[(u16, u32)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (id, value) in settings {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
    }
    frame(SETTINGS, 0, 0, &payload)
}

/// An acknowledgement of the peer's SETTINGS.
pub fn settings_ack() -> Vec<u8> {
    frame(SETTINGS, ACK, 0, &[])
}

/// A PING (not an acknowledgement).
pub fn ping(payload: [u8; 8]) -> Vec<u8> {
    frame(PING, 0, 0, &payload)
}

/// RST_STREAM on `stream` with `code`.
pub fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// DATA on `stream`.
pub fn data(stream: u32, bytes: &[u8], end_stream: bool) -> Vec<u8> {
    frame(DATA, if end_stream { END_STREAM } else { 0 }, stream, bytes)
}

/// HEADERS on `stream` carrying `block`.
pub fn headers(stream: u32, block: &[u8], end_stream: bool, end_headers: bool) -> Vec<u8> {
    let mut flags = 0;
    if end_stream {
        flags |= END_STREAM;
    }
    if end_headers {
        flags |= END_HEADERS;
    }
    frame(HEADERS, flags, stream, block)
}

/// CONTINUATION on `stream` carrying `block`.
pub fn continuation(stream: u32, block: &[u8], end_headers: bool) -> Vec<u8> {
    frame(
        CONTINUATION,
        if end_headers { END_HEADERS } else { 0 },
        stream,
        block,
    )
}

/// An HPACK integer with an `n`-bit prefix whose high bits are `first` (RFC 7541 5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A header block of literal fields without indexing, new names, no Huffman coding.
pub fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_int(&mut out, 0, 7, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, 0, 7, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// The header block of a request for `path` on `authority`.
pub fn request_block(method: &str, authority: &str, path: &str) -> Vec<u8> {
    hpack(&[
        (":method", method),
        (":scheme", "http"),
        (":authority", authority),
        (":path", path),
    ])
}

/// A frame read from the peer.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// A GOAWAY's error code.
    pub fn goaway_code(&self) -> Option<u32> {
        (self.kind == GOAWAY && self.payload.len() >= 8)
            .then(|| u32::from_be_bytes(self.payload[4..8].try_into().unwrap()))
    }
}

/// Reads one frame; `None` at the end of the stream or on an error.
pub async fn read_frame(read: &mut OwnedReadHalf) -> Option<Frame> {
    let mut head = [0u8; 9];
    read.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    read.read_exact(&mut payload).await.ok()?;
    Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff,
        payload,
    })
}

/// How a connection ended, seen by the client reading it.
#[derive(Debug, Default)]
pub struct Ending {
    /// The error code of each GOAWAY received.
    pub goaways: Vec<u32>,
    /// The streams the server reset, with their codes.
    pub resets: Vec<(u32, u32)>,
    /// The streams that got a HEADERS frame (an answer).
    pub answered: Vec<u32>,
    /// PING acknowledgements and SETTINGS acknowledgements received.
    pub acks: u64,
    /// Whether the server closed the connection (rather than the deadline passing).
    pub closed: bool,
}

/// Reads frames until the server closes the connection or `deadline` passes, and sums them up.
pub async fn read_to_end(read: &mut OwnedReadHalf, deadline: Duration) -> Ending {
    let mut ending = Ending::default();
    let all = async {
        while let Some(frame) = read_frame(read).await {
            match frame.kind {
                GOAWAY => ending.goaways.extend(frame.goaway_code()),
                RST_STREAM if frame.payload.len() == 4 => ending.resets.push((
                    frame.stream,
                    u32::from_be_bytes(frame.payload[..4].try_into().unwrap()),
                )),
                HEADERS => ending.answered.push(frame.stream),
                PING | SETTINGS if frame.flags & ACK != 0 => ending.acks += 1,
                _ => {}
            }
        }
    };
    ending.closed = tokio::time::timeout(deadline, all).await.is_ok();
    ending
}

/// A connection that has sent its preface and an empty SETTINGS frame, and acknowledged the
/// server's SETTINGS (the first frame read, returned with the halves).
pub async fn handshake(addr: SocketAddr) -> (OwnedReadHalf, OwnedWriteHalf, Frame) {
    handshake_with(addr, settings(&[])).await
}

/// [`handshake`] with `first` after the preface instead of an empty SETTINGS frame (the
/// client's SETTINGS, and whatever else it sends at once).
pub async fn handshake_with(
    addr: SocketAddr,
    first: Vec<u8>,
) -> (OwnedReadHalf, OwnedWriteHalf, Frame) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let (mut read, mut write) = stream.into_split();
    let mut start = PREFACE.to_vec();
    start.extend(first);
    write.write_all(&start).await.expect("send the preface");
    let server = read_frame(&mut read)
        .await
        .expect("the server's SETTINGS after the preface");
    assert_eq!(server.kind, SETTINGS, "{server:?}");
    write
        .write_all(&settings_ack())
        .await
        .expect("acknowledge the server's SETTINGS");
    (read, write, server)
}

/// The value of setting `id` in a SETTINGS frame's payload.
pub fn setting(frame: &Frame, id: u16) -> Option<u32> {
    frame.payload.chunks_exact(6).find_map(|s| {
        (u16::from_be_bytes([s[0], s[1]]) == id)
            .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
    })
}

/// Writes `chunk` again and again until the peer stops taking it (it closed, or it stopped
/// reading for `stall`), or `max` bytes went; returns the bytes written.
pub async fn flood(write: &mut OwnedWriteHalf, chunk: &[u8], max: usize, stall: Duration) -> usize {
    let mut sent = 0;
    while sent < max {
        match tokio::time::timeout(stall, write.write_all(chunk)).await {
            Ok(Ok(())) => sent += chunk.len(),
            Ok(Err(_)) | Err(_) => break,
        }
    }
    sent
}
