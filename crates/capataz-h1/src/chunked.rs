//! A chunked body (RFC 9112 section 7.1), decoded as it arrives.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The longest chunk-size line (size and extensions) accepted.
const MAX_LINE: usize = 4096;
/// The most bytes of trailer fields accepted.
const MAX_TRAILERS: usize = 16384;

/// What one step of decoding gave.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The buffer holds no complete next piece: read more.
    NeedMore,
    /// The body has ended; its trailer fields (often none). Bytes after the body stay in the
    /// buffer.
    End(HeaderMap),
}

/// Why a chunked body is refused (the connection is not used again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkedError {
    /// The size line is not hex digits and extensions.
    #[error("invalid chunk size line")]
    SizeLine,
    /// The size does not fit in 64 bits.
    #[error("chunk size too large")]
    SizeOverflow,
    /// A chunk's data is not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    MissingCrlf,
    /// A size line longer than the limit.
    #[error("chunk size line longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// A trailer field that is not `name: value`.
    #[error("invalid trailer field")]
    Trailer,
    /// Trailer fields longer than the limit.
    #[error("trailer fields longer than {MAX_TRAILERS} bytes")]
    TrailersTooLong,
    /// A size line or trailer field ended by a bare LF (not CRLF).
    #[error("a line ended by a bare LF")]
    BareLf,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

/// Decodes one chunked body from the front of a read buffer, step by step.
#[derive(Debug)]
pub struct Decoder {
    state: State,
    trailer_bytes: usize,
    trailers: HeaderMap,
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder {
            state: State::Size,
            trailer_bytes: 0,
            trailers: HeaderMap::new(),
        }
    }
}

impl Decoder {
    /// Takes the next piece of the body from the front of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ChunkedError> {
        loop {
            match self.state {
                State::Size => {
                    let Some(line) = take_line(buf, MAX_LINE, ChunkedError::LineTooLong)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    let size = chunk_size(&line)?;
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::DataEnd
                    } else {
                        State::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                State::DataEnd => {
                    // Judged on what arrived: a first byte other than CR is wrong already.
                    if !b"\r\n".starts_with(&buf[..buf.len().min(2)]) {
                        return Err(ChunkedError::MissingCrlf);
                    }
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailers => {
                    let room = MAX_TRAILERS.saturating_sub(self.trailer_bytes);
                    let Some(line) = take_line(buf, room, ChunkedError::TrailersTooLong)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    self.trailer_bytes += line.len() + 2;
                    if line.is_empty() {
                        self.state = State::Done;
                        return Ok(Decoded::End(std::mem::take(&mut self.trailers)));
                    }
                    let (name, value) = trailer_field(&line)?;
                    self.trailers.append(name, value);
                }
                State::Done => return Ok(Decoded::End(HeaderMap::new())),
            }
        }
    }
}

/// The next CRLF-terminated line from the front of `buf`, without its CRLF; `None` if no
/// complete line is there yet. A line (or what has arrived of it) longer than `max` is
/// `too_long`; a line ended by a bare LF is `BareLf`, at once (it would never end otherwise).
fn take_line(
    buf: &mut BytesMut,
    max: usize,
    too_long: ChunkedError,
) -> Result<Option<Bytes>, ChunkedError> {
    match line_end(buf, max, too_long)? {
        Some(end) => {
            let line = buf.split_to(end).freeze();
            buf.advance(2);
            Ok(Some(line))
        }
        None => Ok(None),
    }
}

/// Where the CRLF ending the line at the front of `bytes` starts, as `take_line` judges it.
fn line_end(
    bytes: &[u8],
    max: usize,
    too_long: ChunkedError,
) -> Result<Option<usize>, ChunkedError> {
    let window = &bytes[..bytes.len().min(max.saturating_add(2))];
    match window.iter().position(|b| *b == b'\n') {
        Some(lf) if lf > 0 && window[lf - 1] == b'\r' => Ok(Some(lf - 1)),
        Some(_) => Err(ChunkedError::BareLf),
        None if bytes.len() >= max.saturating_add(2) => Err(too_long),
        None => Ok(None),
    }
}

/// Whether the chunk framing at the start of a chunked body is valid as far as `bytes` (what
/// arrived with the response head) holds it: the first error among its complete size lines
/// and chunk ends, if any. A piece cut off by the end of `bytes` is not an error, and the
/// trailer section is not looked at. Nothing is consumed or copied: it lets a body broken
/// from its first bytes get a 502 before any of its answer is relayed.
pub fn check_start(bytes: &[u8]) -> Result<(), ChunkedError> {
    let mut rest = bytes;
    loop {
        let Some(end) = line_end(rest, MAX_LINE, ChunkedError::LineTooLong)? else {
            return Ok(());
        };
        let size = chunk_size(&rest[..end])?;
        rest = &rest[end + 2..];
        if size == 0 {
            return Ok(());
        }
        let Some(data_end) = usize::try_from(size).ok().filter(|n| *n < rest.len()) else {
            return Ok(());
        };
        let crlf = &rest[data_end..rest.len().min(data_end + 2)];
        if !b"\r\n".starts_with(crlf) {
            return Err(ChunkedError::MissingCrlf);
        }
        if crlf.len() < 2 {
            return Ok(());
        }
        rest = &rest[data_end + 2..];
    }
}

/// `chunk-size [ chunk-ext ]`: hex digits, then nothing, or whitespace and `;` extensions
/// (ignored, but they must be visible ASCII, spaces and tabs).
fn chunk_size(line: &[u8]) -> Result<u64, ChunkedError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ChunkedError::SizeLine);
    }
    let rest = &line[digits..];
    let ext_start = rest.iter().position(|b| *b != b' ' && *b != b'\t');
    if let Some(start) = ext_start {
        let ext_ok = rest[start] == b';'
            && rest[start..]
                .iter()
                .all(|b| *b == b'\t' || (b' '..=b'~').contains(b));
        if !ext_ok {
            return Err(ChunkedError::SizeLine);
        }
    }
    let mut size: u64 = 0;
    for b in &line[..digits] {
        let digit = u64::from(char::from(*b).to_digit(16).unwrap_or(0));
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(digit))
            .ok_or(ChunkedError::SizeOverflow)?;
    }
    Ok(size)
}

fn trailer_field(line: &[u8]) -> Result<(HeaderName, HeaderValue), ChunkedError> {
    let colon = line
        .iter()
        .position(|b| *b == b':')
        .ok_or(ChunkedError::Trailer)?;
    let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| ChunkedError::Trailer)?;
    let value = line[colon + 1..].trim_ascii();
    let value = HeaderValue::from_bytes(value).map_err(|_| ChunkedError::Trailer)?;
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `input` in pieces of `step` bytes; returns the body, the trailers and what was
    /// left in the buffer after the end.
    fn decode_all(
        input: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, HeaderMap, Vec<u8>), ChunkedError> {
        let mut decoder = Decoder::default();
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut fed = 0;
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(data) => body.extend_from_slice(&data),
                Decoded::End(trailers) => return Ok((body, trailers, buf.to_vec())),
                Decoded::NeedMore => {
                    assert!(fed < input.len(), "ran out of input before the end");
                    let end = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..end]);
                    fed = end;
                }
            }
        }
    }

    #[test]
    fn chunks_extensions_and_trailers() {
        let input = b"3\r\nabc\r\nA;name=value; x\r\n0123456789\r\n0\r\nX-Sum: 42\r\nX-Tag:  t \r\n\r\nNEXT";
        for step in [1, 2, 5, input.len()] {
            let (body, trailers, rest) = decode_all(input, step).unwrap();
            assert_eq!(body, b"abc0123456789");
            assert_eq!(trailers["x-sum"], "42");
            assert_eq!(trailers["x-tag"], "t");
            // Bytes after the body stay in the buffer (those that had arrived).
            assert!(b"NEXT".starts_with(&rest), "{rest:?}");
            if step == input.len() {
                assert_eq!(rest, b"NEXT");
            }
        }
    }

    #[test]
    fn an_empty_body() {
        let (body, trailers, rest) = decode_all(b"0\r\n\r\n", 1).unwrap();
        assert!(body.is_empty() && trailers.is_empty() && rest.is_empty());
    }

    #[test]
    fn refusals() {
        let cases: [(&[u8], ChunkedError); 13] = [
            (b"g\r\n", ChunkedError::SizeLine),
            (b"\r\n", ChunkedError::SizeLine),
            (b"3 x\r\nabc\r\n0\r\n\r\n", ChunkedError::SizeLine),
            (b"-3\r\n", ChunkedError::SizeLine),
            (b"3\nabc\r\n0\r\n\r\n", ChunkedError::BareLf),
            // A bare LF fails at once, not after more bytes that never come.
            (b"2\nOK\n0\n\n", ChunkedError::BareLf),
            (b"3;ext\n", ChunkedError::BareLf),
            (b"0\r\nX-T: 1\n", ChunkedError::BareLf),
            (b"3\r\nabcX\r\n0\r\n\r\n", ChunkedError::MissingCrlf),
            // A byte other than CR after the data fails at once, as `check_start` judges it
            // (the proptest's find: the decoder waited for a second byte).
            (b"6\r\n0000000", ChunkedError::MissingCrlf),
            (b"10000000000000000\r\n", ChunkedError::SizeOverflow),
            (b"0\r\nno colon\r\n\r\n", ChunkedError::Trailer),
            (b"0\r\nBad Name: x\r\n\r\n", ChunkedError::Trailer),
        ];
        for (input, error) in cases {
            assert_eq!(
                decode_all(input, 1).unwrap_err(),
                error,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        let long_line = format!("1;{}\r\n", "x".repeat(MAX_LINE));
        assert_eq!(
            decode_all(long_line.as_bytes(), 64).unwrap_err(),
            ChunkedError::LineTooLong
        );
        let big_trailers = format!("0\r\n{}\r\n", "X-A: b\r\n".repeat(MAX_TRAILERS / 8 + 1));
        assert_eq!(
            decode_all(big_trailers.as_bytes(), 100).unwrap_err(),
            ChunkedError::TrailersTooLong
        );
    }

    #[test]
    fn check_start_judges_what_arrived_with_the_head() {
        for good in [
            &b""[..],
            b"5",
            b"5\r",
            b"5\r\nhel",
            b"5\r\nhello",
            b"5\r\nhello\r",
            b"5\r\nhello\r\n0\r\n\r\n",
            b"5;a=b\r\nhello\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\nNEXT",
            b"FFFFFFFFFFFFFFFF\r\nabc",
        ] {
            assert_eq!(
                check_start(good),
                Ok(()),
                "{}",
                String::from_utf8_lossy(good)
            );
        }
        for (bad, error) in [
            (&b"zz\r\nOK\r\n"[..], ChunkedError::SizeLine),
            (
                b"FFFFFFFFFFFFFFFFFF\r\nOK\r\n0\r\n\r\n",
                ChunkedError::SizeOverflow,
            ),
            (b"2\r\nOKXX0\r\n\r\n", ChunkedError::MissingCrlf),
            (b"2\r\nOK\rX", ChunkedError::MissingCrlf),
            (b"2\r\nOK\r\nzz\r\n", ChunkedError::SizeLine),
            (b"2\nOK\n0\n\n", ChunkedError::BareLf),
        ] {
            assert_eq!(
                check_start(bad),
                Err(error),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    fn encode(chunks: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in chunks.iter().filter(|c| !c.is_empty()) {
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the chunking and however the bytes arrive, the body comes out whole and
        /// nothing after it is taken.
        #[test]
        fn any_chunking_any_arrival(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            step in 1usize..64,
            after in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut input = encode(&chunks);
            input.extend_from_slice(&after);
            let (body, trailers, rest) = decode_all(&input, step).unwrap();
            prop_assert_eq!(body, chunks.concat());
            prop_assert!(trailers.is_empty());
            // Everything fed after the end stays in the buffer (fed in steps, so possibly
            // only part of `after` had arrived).
            prop_assert!(after.starts_with(&rest));
        }

        /// `check_start` fails exactly when the decoder, given the same bytes at once, fails
        /// before its trailers (which `check_start` leaves alone).
        #[test]
        fn check_start_agrees_with_the_decoder(
            input in proptest::collection::vec(proptest::sample::select(b"0123456789abcdefgxyz;\r\n \t".to_vec()), 0..64),
        ) {
            let mut decoder = Decoder::default();
            let mut buf = BytesMut::from(&input[..]);
            let decoded = loop {
                if matches!(decoder.state, State::Trailers | State::Done) {
                    break Ok(());
                }
                match decoder.decode(&mut buf) {
                    Ok(Decoded::Data(_)) => {}
                    Ok(_) => break Ok(()),
                    Err(error) => break Err(error),
                }
            };
            prop_assert_eq!(check_start(&input), decoded, "{:?}", String::from_utf8_lossy(&input));
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn arbitrary_input_never_panics(input in proptest::collection::vec(any::<u8>(), 0..512), step in 1usize..32) {
            let mut decoder = Decoder::default();
            let mut buf = BytesMut::new();
            for piece in input.chunks(step) {
                buf.extend_from_slice(piece);
                while let Ok(Decoded::Data(_)) = decoder.decode(&mut buf) {}
            }
        }
    }
}
