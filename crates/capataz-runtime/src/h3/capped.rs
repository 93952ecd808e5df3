//! A bound on the HTTP/3 frames a client may make capataz hold: h3 reads a frame other than
//! DATA (HEADERS, SETTINGS, an unknown or GREASE type) whole into memory before it looks at it,
//! however long the frame says it is, and QUIC grants the client more credit as h3 reads, so
//! a HEADERS frame announcing a gigabyte was taken in as fast as it came (h3 0.0.8
//! `frame.rs`). This wraps `h3_quinn`'s connection: every stream's frames are followed as they
//! pass (type and length, no copy), and one other than DATA longer than the limit stops the
//! stream (`H3_EXCESSIVE_LOAD`) before h3 buffers it (the control stream's too: h3 then closes
//! the connection, or, when it was still reading the stream's type, drops the stream). DATA is streamed by h3 and bounded by flow control as it is forwarded.
//!
//! Streams are followed from their first byte: a request stream is all frames; a
//! unidirectional stream starts with its type, and only the control stream (type 0) holds
//! frames (QPACK's streams hold instructions, unknown types are discarded by h3).

use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};

/// HTTP/3's code for a peer that made us hold too much (RFC 9114 section 8.1).
const H3_EXCESSIVE_LOAD: u64 = 0x107;

/// A QUIC connection whose streams' frames are bounded (see the module documentation).
pub(crate) struct Connection {
    inner: h3_quinn::Connection,
    /// The longest frame other than DATA taken.
    limit: u64,
}

impl Connection {
    pub(crate) fn new(connection: quinn::Connection, limit: u64) -> Connection {
        Connection {
            inner: h3_quinn::Connection::new(connection),
            limit,
        }
    }
}

/// Where a stream's reader is in its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// A unidirectional stream's type, `got` bytes of it read.
    Kind { got: u8, need: u8, value: u64 },
    /// A frame's type and length: `got` bytes read of the two varints.
    Header { got: u8, head: [u8; 16] },
    /// `left` bytes of the current frame's payload to pass.
    Payload { left: u64 },
    /// Not frames (QPACK instructions, an unknown stream type): not followed.
    Opaque,
    /// A frame over the limit was announced.
    Refused,
}

/// The length of the varint whose first byte is `first`.
fn varint_len(first: u8) -> u8 {
    1 << (first >> 6)
}

/// The varint at the start of `bytes` (which holds all of it).
fn varint(bytes: &[u8]) -> u64 {
    let mut value = u64::from(bytes[0] & 0x3f);
    for byte in &bytes[1..] {
        value = (value << 8) | u64::from(*byte);
    }
    value
}

/// Follows a stream's frames through the bytes it receives.
#[derive(Clone, Copy, Debug)]
struct Frames {
    stage: Stage,
    limit: u64,
}

impl Frames {
    fn request(limit: u64) -> Frames {
        Frames {
            stage: Stage::Header {
                got: 0,
                head: [0; 16],
            },
            limit,
        }
    }

    fn unidirectional(limit: u64) -> Frames {
        Frames {
            stage: Stage::Kind {
                got: 0,
                need: 0,
                value: 0,
            },
            limit,
        }
    }

    /// Follows `bytes`; false once a frame over the limit is announced.
    fn pass(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match &mut self.stage {
                Stage::Opaque => return true,
                Stage::Refused => return false,
                Stage::Payload { left } => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.stage = Frames::request(self.limit).stage;
                    }
                }
                Stage::Kind { got, need, value } => {
                    if *got == 0 {
                        *need = varint_len(bytes[0]);
                        *value = u64::from(bytes[0] & 0x3f);
                    } else {
                        *value = (*value << 8) | u64::from(bytes[0]);
                    }
                    *got += 1;
                    bytes = &bytes[1..];
                    if *got == *need {
                        self.stage = match *value {
                            // The control stream: frames.
                            0 => Frames::request(self.limit).stage,
                            _ => Stage::Opaque,
                        };
                    }
                }
                Stage::Header { got, head } => {
                    head[*got as usize] = bytes[0];
                    *got += 1;
                    bytes = &bytes[1..];
                    let kind_len = varint_len(head[0]);
                    if *got <= kind_len {
                        continue;
                    }
                    let length_len = varint_len(head[kind_len as usize]);
                    if *got < kind_len + length_len {
                        continue;
                    }
                    let kind = varint(&head[..kind_len as usize]);
                    let length = varint(&head[kind_len as usize..*got as usize]);
                    // DATA (type 0) is streamed by h3, never held whole.
                    if kind != 0 && length > self.limit {
                        self.stage = Stage::Refused;
                        return false;
                    }
                    self.stage = match length {
                        0 => Frames::request(self.limit).stage,
                        left => Stage::Payload { left },
                    };
                }
            }
        }
        !matches!(self.stage, Stage::Refused)
    }
}

/// A receiving stream whose frames are bounded.
pub(crate) struct RecvStream {
    inner: h3_quinn::RecvStream,
    frames: Frames,
}

impl quic::RecvStream for RecvStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        if self.frames.stage == Stage::Refused {
            return Poll::Ready(Err(too_large()));
        }
        let polled = self.inner.poll_data(cx);
        if let Poll::Ready(Ok(Some(bytes))) = &polled {
            if !self.frames.pass(bytes.chunk()) {
                self.inner.stop_sending(H3_EXCESSIVE_LOAD);
                return Poll::Ready(Err(too_large()));
            }
        }
        polled
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

fn too_large() -> StreamErrorIncoming {
    StreamErrorIncoming::Unknown("an HTTP/3 frame longer than the limit was announced".into())
}

/// A request stream: the sending half as `h3_quinn`'s, the receiving half bounded.
pub(crate) struct BidiStream<B: Buf> {
    send: h3_quinn::SendStream<B>,
    recv: RecvStream,
}

impl<B: Buf> quic::BidiStream<B> for BidiStream<B> {
    type SendStream = h3_quinn::SendStream<B>;
    type RecvStream = RecvStream;

    fn split(self) -> (Self::SendStream, Self::RecvStream) {
        (self.send, self.recv)
    }
}

impl<B: Buf> quic::RecvStream for BidiStream<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

impl<B: Buf> quic::SendStream<B> for BidiStream<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code)
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}

/// Opens the server's own streams (control, QPACK), as `h3_quinn`'s; a bidirectional one
/// (never opened by a server) would be bounded too.
pub(crate) struct OpenStreams {
    inner: h3_quinn::OpenStreams,
    limit: u64,
}

impl<B: Buf> quic::OpenStreams<B> for OpenStreams {
    type BidiStream = BidiStream<B>;
    type SendStream = h3_quinn::SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        let opened = quic::OpenStreams::<B>::poll_open_bidi(&mut self.inner, cx);
        opened.map_ok(|stream| bounded(stream, self.limit))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.inner, code, reason)
    }
}

/// `stream` with its receiving half bounded at `limit`.
fn bounded<B: Buf>(stream: h3_quinn::BidiStream<B>, limit: u64) -> BidiStream<B> {
    let (send, recv) = quic::BidiStream::split(stream);
    BidiStream {
        send,
        recv: RecvStream {
            inner: recv,
            frames: Frames::request(limit),
        },
    }
}

impl<B: Buf> quic::OpenStreams<B> for Connection {
    type BidiStream = BidiStream<B>;
    type SendStream = h3_quinn::SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        let opened = quic::OpenStreams::<B>::poll_open_bidi(&mut self.inner, cx);
        opened.map_ok(|stream| bounded(stream, self.limit))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.inner, code, reason)
    }
}

impl<B: Buf> quic::Connection<B> for Connection {
    type RecvStream = RecvStream;
    type OpenStreams = OpenStreams;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvStream, ConnectionErrorIncoming>> {
        let accepted = quic::Connection::<B>::poll_accept_recv(&mut self.inner, cx);
        accepted.map_ok(|inner| RecvStream {
            inner,
            frames: Frames::unidirectional(self.limit),
        })
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        let accepted = quic::Connection::<B>::poll_accept_bidi(&mut self.inner, cx);
        accepted.map_ok(|stream| bounded(stream, self.limit))
    }

    fn opener(&self) -> OpenStreams {
        OpenStreams {
            inner: quic::Connection::<B>::opener(&self.inner),
            limit: self.limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `frames` fed `bytes` one byte at a time, and whole: the same answer.
    fn passes(frames: Frames, bytes: &[u8]) -> bool {
        let mut whole = frames;
        let mut bytewise = frames;
        let one_by_one = bytes.chunks(1).all(|byte| bytewise.pass(byte));
        assert_eq!(whole.pass(bytes), one_by_one, "{bytes:?}");
        one_by_one
    }

    #[test]
    fn frames_other_than_data_over_the_limit_are_refused_however_split() {
        // HEADERS of 5 bytes, DATA announcing 2^30 - 1 (streamed, allowed), partly sent.
        let mut ok = vec![0x01, 0x05, 1, 2, 3, 4, 5, 0x00, 0xbf, 0xff, 0xff, 0xff];
        ok.extend_from_slice(&[0; 100]);
        assert!(passes(Frames::request(100), &ok));
        // HEADERS announcing 101 bytes (two-byte length varint): refused.
        assert!(!passes(Frames::request(100), &[0x01, 0x40, 101]));
        assert!(passes(Frames::request(100), &[0x01, 0x40, 100]));
        // An unknown (GREASE) type, two-byte type varint, announcing 2^30 - 1.
        let grease = [0x40, 0x21, 0xbf, 0xff, 0xff, 0xff];
        assert!(!passes(Frames::request(100), &grease));
        // After a small frame, the next one is followed too.
        let mut two = vec![0x21, 0x02, 9, 9];
        two.extend_from_slice(&[0x01, 0x80, 0, 1, 0]);
        assert!(!passes(Frames::request(100), &two));
        // A control stream (type 0) is frames; a QPACK encoder stream (2) is not.
        let mut control = vec![0x00];
        control.extend_from_slice(&grease);
        assert!(!passes(Frames::unidirectional(100), &control));
        let mut qpack = vec![0x02];
        qpack.extend_from_slice(&grease);
        assert!(passes(Frames::unidirectional(100), &qpack));
        // A stream type in a two-byte varint (0x40 0x00 is type 0: control).
        let mut long_kind = vec![0x40, 0x00];
        long_kind.extend_from_slice(&grease);
        assert!(!passes(Frames::unidirectional(100), &long_kind));
    }
}
