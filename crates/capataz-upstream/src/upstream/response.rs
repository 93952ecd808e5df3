//! A backend's response body read from its connection: the IO around `capataz_h1::body::BodyReader`.
//!
//! It reads from any [`Transport`] into one buffer, hands the reader what arrived, and times
//! the backend's silences: a body the backend sends nothing of for `body_idle` while capataz
//! waits for it has stalled. Only that wait counts: the clock starts when a read finds nothing
//! and stops when data arrives; while the caller does not poll (a client slow to read),
//! nothing is charged. No timer exists until the body first waits.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::{AttemptError, Transport, READ_SIZE};
use capataz_h1::body::{BodyReader, Step};
use capataz_h1::framing::Framing;

/// A response body on its way from a backend's connection.
pub(crate) struct ResponseStream<S> {
    /// The connection, until the body has ended or failed.
    stream: Option<S>,
    /// What was read and not yet handed out.
    buf: BytesMut,
    reader: BodyReader,
    /// How long the backend may leave the body waiting.
    body_idle: Duration,
    /// The idle timer, created the first time the body waits and reset at each later wait.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the body is waiting for the backend (its idle timer runs).
    waiting: bool,
}

impl<S: Transport> ResponseStream<S> {
    /// The body framed as `framing` says, read from `stream`; `buf` holds what was read past
    /// the head.
    #[inline]
    pub(crate) fn new(
        stream: S,
        buf: BytesMut,
        framing: Framing,
        body_idle: Duration,
    ) -> ResponseStream<S> {
        ResponseStream {
            stream: Some(stream),
            buf,
            reader: BodyReader::new(framing),
            body_idle,
            idle: None,
            waiting: false,
        }
    }

    /// The whole body, when its length was given (`Content-Length`) and all of it came with
    /// the head: taken from the buffer without IO, and the body has then ended. `None` (and
    /// nothing taken) otherwise.
    #[inline]
    pub(crate) fn take_whole(&mut self) -> Option<Bytes> {
        let left = self.reader.remaining()?;
        if left == 0 || (self.buf.len() as u64) < left {
            return None;
        }
        match self.reader.decode(&mut self.buf) {
            Ok(Step::Data(data)) if self.reader.is_done() => Some(data),
            // Not reached: a known length all in the buffer is one piece.
            _ => None,
        }
    }

    /// Whether the body has ended (whole or not).
    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.reader.is_done()
    }

    /// How long the backend may leave the body waiting.
    pub(crate) fn body_idle(&self) -> Duration {
        self.body_idle
    }

    /// The bytes of the body still to come, when known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        self.reader.remaining()
    }

    /// The body has ended: its connection if it may carry another request (nothing unread
    /// is left on it), else `None` and the connection is closed.
    pub(crate) fn finish(&mut self) -> Option<S> {
        let reusable = self.reader.reusable(&self.buf);
        self.buf = BytesMut::new();
        self.idle = None;
        let stream = self.stream.take();
        if reusable {
            stream
        } else {
            None
        }
    }

    /// The body will not be read to its end: the connection is closed.
    pub(crate) fn fail(&mut self) {
        self.reader.fail();
        self.stream = None;
        self.idle = None;
    }

    /// The next piece of the body: `Ok(None)` at its end, `BodyBroken` if it was cut short or
    /// is malformed, `BodyStalled` if the backend left it waiting for `body_idle`.
    pub(crate) fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, AttemptError>> {
        loop {
            match self.reader.decode(&mut self.buf) {
                Ok(Step::Data(data)) => return Poll::Ready(Ok(Some(data))),
                Ok(Step::End) => return Poll::Ready(Ok(None)),
                Ok(Step::NeedMore) => {}
                Err(_) => return Poll::Ready(Err(AttemptError::BodyBroken)),
            }
            match std::task::ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    return Poll::Ready(match self.reader.handle_eof() {
                        Ok(()) => Ok(None),
                        Err(_) => Err(AttemptError::BodyBroken),
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    return Poll::Ready(Err(AttemptError::BodyStalled))
                }
                Err(_) => return Poll::Ready(Err(AttemptError::BodyBroken)),
            }
        }
    }

    /// Reads more from the backend into the buffer: `Ready(Ok(0))` at its end of stream, an
    /// error of kind `TimedOut` when the backend left it waiting for `body_idle`.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(stream) = &mut self.stream else {
            return Poll::Ready(Ok(0));
        };
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 2 {
            self.buf.reserve(READ_SIZE);
        }
        match stream.poll_read_buf(cx, &mut self.buf) {
            Poll::Ready(read) => {
                self.waiting = false;
                Poll::Ready(read)
            }
            Poll::Pending => {
                // Waiting on the backend: its idle clock runs from the first wait.
                if !self.waiting {
                    self.waiting = true;
                    let deadline = tokio::time::Instant::now() + self.body_idle;
                    match &mut self.idle {
                        Some(sleep) => sleep.as_mut().reset(deadline),
                        None => self.idle = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                }
                if let Some(sleep) = &mut self.idle {
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                    }
                }
                Poll::Pending
            }
        }
    }
}
