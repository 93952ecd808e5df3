//! The buffers an HTTP/1.1 exchange reads the start of a backend's answer into, kept per
//! thread for the next exchange.
//!
//! Every exchange reads its answer's head into a buffer of `FIRST_READ` bytes. The head's
//! field values and the first pieces of the body are slices of it (`Bytes` sharing its
//! memory), which the client's side holds until it has encoded or written them, so the buffer
//! outlives the exchange by a little. Allocated for each exchange, it cost about 870
//! instructions per request under load (jemalloc's thread cache for its size class refilled
//! from fresh slabs: BENCHMARKS.md, "HTTP/2: where the instructions go"). So a buffer whose
//! answer is done with it comes back here, to a short queue of its thread, and a later
//! exchange on that thread takes it again once nothing else refers to its memory.
//!
//! Most buffers are free again a few exchanges later (the client's side encodes a head and
//! writes a body soon), but some are held much longer: an HTTP/2 client connection's HPACK
//! table keeps each field value it indexes (a new `date` each second), and with it the whole
//! buffer that value is a slice of. So the oldest buffer kept, if still held, is let go
//! rather than kept waiting at the front of the queue: held buffers would fill it.
//!
//! Invariants:
//! - a buffer is handed out only with room for a first read that no other handle can see:
//!   `BytesMut::try_reclaim` gets the whole allocation back only when this handle is its sole
//!   owner (the shared count), and a `BytesMut`'s room is never any other handle's memory, so
//!   nothing read for one answer changes a slice of another, one client's or another's;
//! - it comes back empty (`clear`), so no byte of one answer is read as part of another;
//! - the queue is short ([`KEPT`]) and per thread: what it holds does not grow with
//!   connections or load, and no connection holds a buffer while idle (an idle backend
//!   connection is only its socket).

use std::cell::RefCell;
use std::collections::VecDeque;

use bytes::BytesMut;

use super::FIRST_READ;

/// The most buffers a thread keeps for later exchanges (64 KB at 2 KB each).
const KEPT: usize = 32;

/// How many kept buffers still referred to elsewhere are let go (see the module
/// documentation) before a fresh one is allocated.
const LOOKS: usize = 2;

thread_local! {
    /// The thread's buffers given back, oldest first: the oldest is the likeliest to be free.
    static KEPT_BUFS: RefCell<VecDeque<BytesMut>> = const { RefCell::new(VecDeque::new()) };
}

/// An empty buffer with room for `FIRST_READ` bytes (and no more, so that it can be given
/// back): one given back earlier if one is free again, else a new one.
pub(crate) fn take() -> BytesMut {
    let kept = KEPT_BUFS.try_with(|kept| {
        let mut kept = kept.borrow_mut();
        for _ in 0..LOOKS {
            let mut buf = kept.pop_front()?;
            // Given back empty; the room is the whole allocation once no slice of it is left.
            // One still held is let go: its memory is freed when the last slice is.
            if buf.try_reclaim(FIRST_READ) && buf.capacity() == FIRST_READ {
                return Some(buf);
            }
        }
        None
    });
    match kept {
        Ok(Some(buf)) => buf,
        _ => BytesMut::with_capacity(FIRST_READ),
    }
}

/// Gives back a buffer from [`take`] that was never grown (its allocation is still
/// `FIRST_READ` bytes) once its answer is done with it; slices of it may still be held.
pub(crate) fn give(mut buf: BytesMut) {
    buf.clear();
    let _ = KEPT_BUFS.try_with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() < KEPT {
            kept.push_back(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// An answer read into a buffer from `take`: its head and its body, split off it.
    fn answer() -> (BytesMut, Bytes, Bytes) {
        let mut buf = take();
        buf.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\nbody");
        let head = buf.split_to(19).freeze();
        let body = buf.split_to(4).freeze();
        (buf, head, body)
    }

    /// A buffer comes back out once every slice of it is gone, empty, with its whole room.
    #[test]
    fn taken_again_when_no_slice_is_left() {
        // Another test on this thread may have left buffers: start from none.
        KEPT_BUFS.with(|kept| kept.borrow_mut().clear());
        let (buf, head, body) = answer();
        let at = head.as_ptr();
        give(buf);
        drop((head, body));
        let again = take();
        assert_eq!(again.as_ptr(), at);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), FIRST_READ);
    }

    /// A buffer of which a slice is still held is never handed out; it is let go, and the
    /// slice keeps its bytes.
    #[test]
    fn never_taken_while_a_slice_is_held() {
        KEPT_BUFS.with(|kept| kept.borrow_mut().clear());
        let (buf, head, body) = answer();
        give(buf);
        let mut other = take();
        assert!(!std::ptr::eq(other.as_ptr(), head.as_ptr()));
        assert!(other.is_empty());
        assert_eq!(other.capacity(), FIRST_READ);
        other.extend_from_slice(&[b'x'; FIRST_READ]);
        assert_eq!(&head[..], b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(&body[..], b"body");
        assert_eq!(KEPT_BUFS.with(|kept| kept.borrow().len()), 0);
    }

    /// A buffer given back with bytes in it comes out empty.
    #[test]
    fn given_back_empty() {
        KEPT_BUFS.with(|kept| kept.borrow_mut().clear());
        let mut buf = take();
        buf.extend_from_slice(b"left over");
        give(buf);
        let again = take();
        assert!(again.is_empty());
        assert_eq!(again.capacity(), FIRST_READ);
    }

    /// No more than `KEPT` buffers are kept.
    #[test]
    fn at_most_kept() {
        KEPT_BUFS.with(|kept| kept.borrow_mut().clear());
        let bufs: Vec<_> = (0..KEPT + 5).map(|_| take()).collect();
        bufs.into_iter().for_each(give);
        assert_eq!(KEPT_BUFS.with(|kept| kept.borrow().len()), KEPT);
    }
}
