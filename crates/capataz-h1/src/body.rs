//! A backend's response body, read without IO: the caller appends what arrives to a buffer and
//! asks [`BodyReader::decode`] for the next piece; at the end of the stream it says so with
//! [`BodyReader::handle_eof`].
//!
//! The reader delimits the body as its [`Framing`] says (`Content-Length`, chunked, or until
//! the close) and decides whether the connection may carry another request once the body has
//! ended: only if the framing allows it and nothing is left unread after the body (bytes a
//! backend sent past its answer must never be read as the answer to the next request).
//! However the bytes arrive, split anywhere, the body decoded is the same.

use bytes::{Bytes, BytesMut};

use super::chunked;
use super::framing::{BodyLength, Framing};

/// How much of a body is left.
#[derive(Debug)]
enum State {
    Exact(u64),
    Chunked(chunked::Decoder),
    UntilClose,
    Done,
}

/// What one step of decoding gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Body bytes; the body may have ended with them ([`BodyReader::is_done`]).
    Data(Bytes),
    /// The buffer holds no complete next piece: read more (or report the end of the stream).
    NeedMore,
    /// The body has ended (no data came with this step).
    End,
}

/// Why a body could not be read whole (the connection is not used again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The chunked coding is malformed.
    #[error("malformed chunked body: {0}")]
    Chunked(chunked::ChunkedError),
    /// The stream ended before the body did.
    #[error("the body was cut short")]
    Truncated,
}

/// The state of one response body being read.
#[derive(Debug)]
pub struct BodyReader {
    state: State,
    reusable: bool,
}

impl BodyReader {
    /// A reader for a body framed as `framing` says.
    #[inline]
    pub fn new(framing: Framing) -> BodyReader {
        let state = match framing.body {
            BodyLength::Empty | BodyLength::Exact(0) => State::Done,
            BodyLength::Exact(n) => State::Exact(n),
            BodyLength::Chunked => State::Chunked(chunked::Decoder::default()),
            BodyLength::UntilClose => State::UntilClose,
        };
        BodyReader {
            state,
            reusable: framing.reusable,
        }
    }

    /// The next piece of the body from `buf` (what arrived and was not taken yet). Bytes after
    /// the body's end stay in `buf`. After an error the body has not ended (it never will):
    /// the caller gives up on it ([`BodyReader::fail`]).
    #[inline]
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, BodyError> {
        match &mut self.state {
            State::Done => Ok(Step::End),
            State::Exact(left) => {
                if buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                let data = buf.split_to(n).freeze();
                *left -= n as u64;
                if *left == 0 {
                    self.state = State::Done;
                }
                Ok(Step::Data(data))
            }
            State::Chunked(decoder) => match decoder.decode(buf) {
                Ok(chunked::Decoded::Data(data)) => Ok(Step::Data(data)),
                Ok(chunked::Decoded::End(_trailers)) => {
                    self.state = State::Done;
                    Ok(Step::End)
                }
                Ok(chunked::Decoded::NeedMore) => Ok(Step::NeedMore),
                Err(error) => Err(BodyError::Chunked(error)),
            },
            State::UntilClose => {
                if buf.is_empty() {
                    Ok(Step::NeedMore)
                } else {
                    Ok(Step::Data(buf.split().freeze()))
                }
            }
        }
    }

    /// The stream ended (after `decode` asked for more): a body delimited by the close has
    /// ended (and its connection is gone), any other was cut short (an error, as `decode`'s).
    pub fn handle_eof(&mut self) -> Result<(), BodyError> {
        match self.state {
            State::Done => Ok(()),
            State::UntilClose => {
                self.state = State::Done;
                self.reusable = false;
                Ok(())
            }
            State::Exact(_) | State::Chunked(_) => Err(BodyError::Truncated),
        }
    }

    /// The body will not be read to its end (an error, a stall): the reader is done and its
    /// connection is not reusable.
    pub fn fail(&mut self) {
        self.state = State::Done;
        self.reusable = false;
    }

    /// Whether the body has ended (or failed).
    #[inline]
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The bytes of the body still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Exact(n) => Some(n),
            State::Done => Some(0),
            State::Chunked(_) | State::UntilClose => None,
        }
    }

    /// Whether the connection may carry another request: the body has ended whole, the framing
    /// allows reuse, and nothing is left unread after it (`leftover`: what is still buffered).
    #[inline]
    pub fn reusable(&self, leftover: &[u8]) -> bool {
        self.is_done() && self.reusable && leftover.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framing(body: BodyLength) -> Framing {
        Framing {
            body,
            reusable: true,
            rewrite_length: false,
        }
    }

    /// What reading `input` split at `cuts` gave: the body, how it ended, whether the
    /// connection is reusable at the end, and what was left unread.
    #[derive(Debug, PartialEq, Eq)]
    struct Read {
        body: Vec<u8>,
        end: Result<(), BodyError>,
        reusable: bool,
        leftover: Vec<u8>,
    }

    /// Feeds `input` in pieces cut at `cuts` (sorted offsets), then the end of the stream.
    fn read(body: BodyLength, input: &[u8], cuts: &[usize]) -> Read {
        let mut reader = BodyReader::new(framing(body));
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut pieces = cuts
            .iter()
            .copied()
            .chain([input.len()])
            .scan(0, |start, end| {
                let end = end.clamp(*start, input.len());
                let piece = &input[*start..end];
                *start = end;
                Some(piece)
            });
        let end = loop {
            if reader.is_done() {
                break Ok(());
            }
            match reader.decode(&mut buf) {
                Ok(Step::Data(data)) => {
                    assert!(!data.is_empty(), "an empty data step");
                    out.extend_from_slice(&data);
                }
                Ok(Step::End) => break Ok(()),
                Ok(Step::NeedMore) => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => break reader.handle_eof(),
                },
                Err(error) => break Err(error),
            }
        };
        // Whatever the backend sent after the body arrives before the connection is judged.
        for piece in pieces {
            buf.extend_from_slice(piece);
        }
        let leftover = if end.is_ok() {
            buf.to_vec()
        } else {
            Vec::new()
        };
        Read {
            body: out,
            end,
            reusable: reader.reusable(&buf),
            leftover,
        }
    }

    #[test]
    fn exact_body_ends_at_its_length_and_leaves_the_rest() {
        let r = read(BodyLength::Exact(5), b"helloNEXT", &[2, 7]);
        assert_eq!(r.body, b"hello");
        assert_eq!(r.end, Ok(()));
        assert_eq!(r.leftover, b"NEXT");
        // Bytes past the body: the connection is not reused.
        assert!(!r.reusable);
        let r = read(BodyLength::Exact(5), b"helloNEXT", &[5]);
        assert_eq!((r.leftover.as_slice(), r.reusable), (&b"NEXT"[..], false));
        let r = read(BodyLength::Exact(5), b"hello", &[1]);
        assert!(r.reusable);
    }

    #[test]
    fn exact_body_cut_short_is_truncated() {
        let r = read(BodyLength::Exact(10), b"hello", &[3]);
        assert_eq!(r.body, b"hello");
        assert_eq!(r.end, Err(BodyError::Truncated));
        assert!(!r.reusable);
    }

    #[test]
    fn empty_bodies_are_done_at_once() {
        for body in [BodyLength::Empty, BodyLength::Exact(0)] {
            let mut reader = BodyReader::new(framing(body));
            assert!(reader.is_done());
            assert_eq!(reader.remaining(), Some(0));
            assert_eq!(reader.decode(&mut BytesMut::new()), Ok(Step::End));
            assert!(reader.reusable(b""));
            assert!(!reader.reusable(b"stray"));
        }
    }

    #[test]
    fn chunked_body_decodes_and_keeps_what_follows() {
        let r = read(
            BodyLength::Chunked,
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            &[4, 9],
        );
        assert_eq!(r.body, b"abcde");
        assert_eq!(r.end, Ok(()));
        assert!(r.reusable);
        let r = read(BodyLength::Chunked, b"1\r\na\r\n0\r\n\r\nX", &[]);
        assert_eq!(
            (r.body.as_slice(), r.leftover.as_slice()),
            (&b"a"[..], &b"X"[..])
        );
        assert!(!r.reusable);
    }

    #[test]
    fn malformed_or_cut_chunked_body_fails() {
        let r = read(BodyLength::Chunked, b"zz\r\nabc\r\n", &[]);
        assert!(matches!(r.end, Err(BodyError::Chunked(_))));
        assert!(!r.reusable);
        let r = read(BodyLength::Chunked, b"5\r\nab", &[]);
        assert_eq!(r.end, Err(BodyError::Truncated));
    }

    #[test]
    fn until_close_body_ends_at_the_close_and_never_reuses() {
        let r = read(BodyLength::UntilClose, b"all of it", &[3]);
        assert_eq!(r.body, b"all of it");
        assert_eq!(r.end, Ok(()));
        assert!(!r.reusable);
    }

    #[test]
    fn not_reusable_when_the_framing_says_so() {
        let mut reader = BodyReader::new(Framing {
            body: BodyLength::Exact(1),
            reusable: false,
            rewrite_length: false,
        });
        let mut buf = BytesMut::from(&b"x"[..]);
        assert_eq!(
            reader.decode(&mut buf),
            Ok(Step::Data(Bytes::from_static(b"x")))
        );
        assert!(reader.is_done());
        assert!(!reader.reusable(&buf));
    }

    fn any_length() -> impl Strategy<Value = BodyLength> {
        prop_oneof![
            Just(BodyLength::Empty),
            (0u64..64).prop_map(BodyLength::Exact),
            Just(BodyLength::Chunked),
            Just(BodyLength::UntilClose),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// However the same bytes are split, the reader decodes the same body, ends the same
        /// way, leaves the same bytes and makes the same reuse decision; it never panics.
        #[test]
        fn any_split_decodes_the_same(
            body in any_length(),
            input in proptest::collection::vec(any::<u8>(), 0..200),
            mut cuts in proptest::collection::vec(0usize..200, 0..12),
        ) {
            cuts.sort_unstable();
            let whole = read(body, &input, &[]);
            let split = read(body, &input, &cuts);
            let bytewise = read(body, &input, &(1..input.len()).collect::<Vec<_>>());
            prop_assert_eq!(&split, &whole);
            prop_assert_eq!(&bytewise, &whole);
        }

        /// A well-formed chunked body with bytes after it comes out whole, split anywhere.
        #[test]
        fn chunked_any_split(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..6),
            after in proptest::collection::vec(any::<u8>(), 0..8),
            mut cuts in proptest::collection::vec(0usize..300, 0..12),
        ) {
            cuts.sort_unstable();
            let mut input = Vec::new();
            for chunk in &chunks {
                input.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                input.extend_from_slice(chunk);
                input.extend_from_slice(b"\r\n");
            }
            input.extend_from_slice(b"0\r\n\r\n");
            input.extend_from_slice(&after);
            let r = read(BodyLength::Chunked, &input, &cuts);
            prop_assert_eq!(r.body, chunks.concat());
            prop_assert_eq!(r.end, Ok(()));
            prop_assert_eq!(r.reusable, after.is_empty());
        }
    }
}
