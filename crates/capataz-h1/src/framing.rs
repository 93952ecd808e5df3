//! How a response's body is delimited (RFC 9112 section 6.3) and whether its connection may
//! carry another request afterwards.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use super::head::{folded_eq, ResponseHead};

/// How the body of a response ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLength {
    /// No body at all (a HEAD request, 1xx, 204, 304).
    Empty,
    /// Exactly this many bytes (`Content-Length`).
    Exact(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the backend closes the connection.
    UntilClose,
}

/// A response's body length, and whether the connection is reusable once it has been read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    /// How the body ends.
    pub body: BodyLength,
    /// Whether the connection may carry another request once the body has been read.
    pub reusable: bool,
    /// Whether the answer's `Content-Length` must not be relayed as written: beside
    /// `Transfer-Encoding` it did not delimit the body (it goes), and written as a list or
    /// repeated it is sent as one number. False for nearly every answer.
    pub rewrite_length: bool,
}

/// Why a response's framing cannot be trusted: the answer is malformed, and the connection
/// must not be used again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// `Content-Length` is not one number (or the same number repeated).
    #[error("invalid Content-Length")]
    ContentLength,
    /// HTTP/1.0 has no transfer codings.
    #[error("Transfer-Encoding in an HTTP/1.0 response")]
    TransferEncodingInHttp10,
    /// `Transfer-Encoding` other than `chunked` once: capataz decodes no other coding, and
    /// relaying one without its field would hand the client bytes it cannot read.
    #[error("Transfer-Encoding other than chunked")]
    TransferCoding,
}

/// What a response head's framing fields say: its `Connection` tokens, its transfer codings
/// and its `Content-Length`, over every field of each name. Gathered by `head::parse` as it
/// builds the head's map ([`FramingFields::note`], one look at each value), so that
/// [`response`] needs no lookup in the map (three lookups cost about 380 instructions a
/// response; a head has five to fifteen fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FramingFields {
    /// A `Connection` token `close`, and one `keep-alive` (read from the bytes: another
    /// token that is not visible ASCII does not hide them, as it does not from HAProxy).
    close: bool,
    keep_alive: bool,
    /// A `Transfer-Encoding` field; its `chunked` codings (empty list elements aside), and
    /// whether it has any other coding or a value that is not visible ASCII.
    transfer_encoding: bool,
    chunked: usize,
    other_coding: bool,
    /// A `Content-Length` field; the number every element so far has been, how many elements
    /// there were, and whether one was not that number (or not a number).
    content_length: bool,
    length: Option<u64>,
    length_elements: usize,
    length_invalid: bool,
}

/// The three fields [`FramingFields`] reads. `head::parse` knows a field's as it names it (its
/// common names include these three), so no name is compared again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FramingName {
    Connection,
    TransferEncoding,
    ContentLength,
}

impl FramingName {
    /// Whether it is a hop-by-hop field (`Connection`, `Transfer-Encoding`).
    pub(crate) fn hop(self) -> bool {
        self != FramingName::ContentLength
    }

    /// Which of the three `name` is, if any.
    pub(crate) fn of(name: &HeaderName) -> Option<FramingName> {
        if *name == header::CONNECTION {
            Some(FramingName::Connection)
        } else if *name == header::TRANSFER_ENCODING {
            Some(FramingName::TransferEncoding)
        } else if *name == header::CONTENT_LENGTH {
            Some(FramingName::ContentLength)
        } else {
            None
        }
    }
}

/// The elements of a comma-separated field value (a `Connection` header's tokens), read from
/// its bytes, trimmed, empty ones skipped: one that is not visible ASCII hides none of the
/// others, as it does not from HAProxy. Every reader of `Connection` tokens reads them so.
pub fn list_tokens(value: &HeaderValue) -> impl Iterator<Item = &[u8]> {
    value
        .as_bytes()
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

impl FramingFields {
    /// Notes one framing field of the head, in the head's order.
    pub(crate) fn note(&mut self, name: FramingName, value: &HeaderValue) {
        if name == FramingName::Connection {
            if self.note_lone_connection(value.as_bytes()) {
                return;
            }
            for token in list_tokens(value) {
                self.close |= token.eq_ignore_ascii_case(b"close");
                self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == FramingName::TransferEncoding {
            self.transfer_encoding = true;
            let Ok(text) = value.to_str() else {
                self.other_coding = true;
                return;
            };
            for coding in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                if coding.eq_ignore_ascii_case("chunked") {
                    self.chunked += 1;
                } else {
                    self.other_coding = true;
                }
            }
        } else {
            self.content_length = true;
            if !self.length_invalid {
                self.length_invalid = !self.add_length(value);
            }
        }
    }

    /// Notes a `Connection` value that is one token, `keep-alive` or `close` (most answers'),
    /// as the list's reading in [`FramingFields::note`] would, without splitting it; false
    /// (nothing noted) for any other value. Compared a word at a time (`folded_eq`: a field
    /// value holds no control byte but tab, so only a letter's other case folds to a letter
    /// or `-`), not byte by byte (`eq_ignore_ascii_case`, about 80 instructions).
    #[inline]
    pub(crate) fn note_lone_connection(&mut self, value: &[u8]) -> bool {
        if folded_eq(value, b"keep-alive") {
            self.keep_alive = true;
            true
        } else if folded_eq(value, b"close") {
            self.close = true;
            true
        } else {
            false
        }
    }

    /// Adds a `Content-Length` value's elements: false if one is not the number the others
    /// are (or not a decimal number).
    fn add_length(&mut self, value: &HeaderValue) -> bool {
        // Most values are one plain number: up to 19 digits (below 2^64), read as the list's
        // reading below reads an element of digits alone, without splitting or trimming.
        let bytes = value.as_bytes();
        if !bytes.is_empty() && bytes.len() <= 19 && bytes.iter().all(u8::is_ascii_digit) {
            self.length_elements += 1;
            let n = bytes
                .iter()
                .fold(0u64, |n, digit| n * 10 + u64::from(digit - b'0'));
            return match self.length {
                Some(previous) if previous != n => false,
                _ => {
                    self.length = Some(n);
                    true
                }
            };
        }
        let Ok(text) = value.to_str() else {
            return false;
        };
        for element in text.split(',') {
            self.length_elements += 1;
            let element = element.trim();
            if element.is_empty()
                || element.len() > 19
                || !element.bytes().all(|b| b.is_ascii_digit())
            {
                return false;
            }
            let Ok(n) = element.parse::<u64>() else {
                return false;
            };
            match self.length {
                Some(previous) if previous != n => return false,
                _ => self.length = Some(n),
            }
        }
        true
    }

    /// Whether the transfer codings, over every `Transfer-Encoding` field (empty list elements
    /// aside), are exactly `chunked`.
    fn only_chunked(&self) -> bool {
        !self.other_coding && self.chunked == 1
    }

    /// The `Content-Length`, if any, and whether it was written plainly (one field, one
    /// number): every value (and every comma-separated element) must be the same decimal
    /// number.
    fn content_length(&self) -> Result<Option<(u64, bool)>, FramingError> {
        if self.length_invalid {
            return Err(FramingError::ContentLength);
        }
        Ok(self.length.map(|n| (n, self.length_elements == 1)))
    }
}

/// The framing of the final (non-1xx) response `head` to a `method` request.
///
/// - HEAD, 204 and 304 have no body, whatever their fields say (and 1xx, which the caller
///   handles before this).
/// - `Transfer-Encoding` wins over `Content-Length`, and must be `chunked` (once): any other
///   coding is refused. A response carrying both is read by its chunks, and its connection is
///   not reused: it is how request smuggling starts.
/// - `Content-Length` must be one number, or a list of the same number repeated.
/// - Otherwise the body runs until the backend closes.
///
/// The connection is reusable if the body has a known end, the response is HTTP/1.1 without
/// `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`.
///
/// The fields are judged as `head::parse` read them (`head.framing_fields`).
pub fn response(method: &Method, head: &ResponseHead) -> Result<Framing, FramingError> {
    let fields = &head.framing_fields;
    let reusable = match head.version {
        Version::HTTP_11 => !fields.close,
        _ => fields.keep_alive && !fields.close,
    };
    let no_body = *method == Method::HEAD
        || head.status.is_informational()
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED;
    if no_body {
        return Ok(Framing {
            body: BodyLength::Empty,
            reusable,
            rewrite_length: false,
        });
    }
    if fields.transfer_encoding {
        if head.version == Version::HTTP_10 {
            return Err(FramingError::TransferEncodingInHttp10);
        }
        let with_length = fields.content_length;
        if !fields.only_chunked() {
            return Err(FramingError::TransferCoding);
        }
        return Ok(Framing {
            body: BodyLength::Chunked,
            reusable: reusable && !with_length,
            rewrite_length: with_length,
        });
    }
    if let Some((length, plain)) = fields.content_length()? {
        return Ok(Framing {
            body: BodyLength::Exact(length),
            reusable,
            rewrite_length: !plain,
        });
    }
    Ok(Framing {
        body: BodyLength::UntilClose,
        reusable: false,
        rewrite_length: false,
    })
}

/// Whether a request's `Transfer-Encoding`, if it has one, is `chunked` once, over all its
/// fields (the rule answers are held to, see [`response`]). hyper reads `chunked, chunked`,
/// `identity, chunked` or two `chunked` fields as one chunked body; a proxy in front of capataz
/// may read them otherwise, which is how request smuggling starts, so they are refused.
pub fn request_codings_ok(headers: &HeaderMap) -> bool {
    let mut fields = FramingFields::default();
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        fields.note(FramingName::TransferEncoding, value);
    }
    !fields.transfer_encoding || fields.only_chunked()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head;

    fn framing(method: &Method, text: &str) -> Result<Framing, FramingError> {
        let mut buf = bytes::BytesMut::from(text.as_bytes());
        let head = head::parse(&mut buf, 16384).unwrap().unwrap();
        response(method, &head)
    }

    fn get(text: &str) -> Result<Framing, FramingError> {
        framing(&Method::GET, text)
    }

    /// As `ok`, with a `Content-Length` that must not be relayed as written.
    const fn rewritten(body: BodyLength, reusable: bool) -> Result<Framing, FramingError> {
        Ok(Framing {
            body,
            reusable,
            rewrite_length: true,
        })
    }

    const fn ok(body: BodyLength, reusable: bool) -> Result<Framing, FramingError> {
        Ok(Framing {
            body,
            reusable,
            rewrite_length: false,
        })
    }

    #[test]
    fn content_length() {
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"),
            ok(BodyLength::Exact(3), true)
        );
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            ok(BodyLength::Exact(0), true)
        );
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\nContent-Length: 7\r\n\r\n"),
            rewritten(BodyLength::Exact(7), true)
        );
        for bad in [
            "3, 4",
            "-1",
            "+3",
            "0x10",
            "3 4",
            "",
            "99999999999999999999",
            "3.0",
        ] {
            let text = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
            assert_eq!(get(&text), Err(FramingError::ContentLength), "{bad:?}");
        }
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
            Err(FramingError::ContentLength)
        );
    }

    #[test]
    fn no_body_whatever_the_fields_say() {
        let text = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n";
        assert_eq!(framing(&Method::HEAD, text), ok(BodyLength::Empty, true));
        for status in ["204 No Content", "304 Not Modified", "100 Continue"] {
            let text = format!("HTTP/1.1 {status}\r\nContent-Length: 10\r\n\r\n");
            assert_eq!(get(&text), ok(BodyLength::Empty, true), "{status}");
        }
    }

    #[test]
    fn transfer_encoding_wins_and_both_forbid_reuse() {
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            ok(BodyLength::Chunked, true)
        );
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"),
            ok(BodyLength::Chunked, true)
        );
        for refused in [
            "gzip, chunked",
            "chunked, chunked",
            "gzip",
            "identity",
            "",
            ",",
        ] {
            let text = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: {refused}\r\n\r\n");
            assert_eq!(get(&text), Err(FramingError::TransferCoding), "{refused:?}");
        }
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(FramingError::TransferCoding)
        );
        // Content-Length with chunked: the chunks delimit the body, the connection ends.
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            rewritten(BodyLength::Chunked, false)
        );
        // So does an invalid Content-Length beside Transfer-Encoding: it is not looked at.
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nContent-Length: x\r\nTransfer-Encoding: chunked\r\n\r\n"),
            rewritten(BodyLength::Chunked, false)
        );
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"),
            rewritten(BodyLength::Chunked, false)
        );
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
            Err(FramingError::TransferCoding)
        );
        assert_eq!(
            get("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(FramingError::TransferEncodingInHttp10)
        );
        assert_eq!(
            get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n"),
            ok(BodyLength::Chunked, true)
        );
        let mut text =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: \xffx\r\n\r\n"
                .to_vec();
        let mut buf = bytes::BytesMut::from(&text[..]);
        let head = head::parse(&mut buf, 16384).unwrap().unwrap();
        assert_eq!(
            response(&Method::GET, &head),
            Err(FramingError::TransferCoding)
        );
        text.clear();
    }

    #[test]
    fn until_close_without_length() {
        assert_eq!(
            get("HTTP/1.1 200 OK\r\n\r\n"),
            ok(BodyLength::UntilClose, false)
        );
        assert_eq!(
            get("HTTP/1.0 200 OK\r\n\r\n"),
            ok(BodyLength::UntilClose, false)
        );
    }

    #[test]
    fn connection_tokens_are_read_from_the_bytes() {
        let judge = |connection: &[u8], version: &[u8]| {
            let mut text = [version, b" 200 OK\r\nContent-Length: 0\r\nConnection: "].concat();
            text.extend_from_slice(connection);
            text.extend_from_slice(b"\r\n\r\n");
            let mut buf = bytes::BytesMut::from(&text[..]);
            let head = head::parse(&mut buf, 16384).unwrap().unwrap();
            response(&Method::GET, &head).unwrap().reusable
        };
        // A token that is not visible ASCII hides neither `close` nor `keep-alive`.
        assert!(!judge(b"close, \xff", b"HTTP/1.1"));
        assert!(!judge(b"\xe9t\xe9 ,CLOSE", b"HTTP/1.1"));
        assert!(judge(b"keep-alive,\xff", b"HTTP/1.0"));
        assert!(judge(b"\xff", b"HTTP/1.1"));
        assert!(!judge(b"\xff", b"HTTP/1.0"));
        assert!(!judge(b"closed, keep-alive-ish", b"HTTP/1.0"));
    }

    /// The fields as `note` reads `values` of `name`, in turn.
    fn noted(name: FramingName, values: &[&[u8]]) -> FramingFields {
        let mut fields = FramingFields::default();
        for value in values {
            fields.note(name, &HeaderValue::from_bytes(value).unwrap());
        }
        fields
    }

    proptest::proptest! {
        /// `Connection: keep-alive` or `close` alone, and a `Content-Length` of digits alone,
        /// are read without the list's split: as the same value with a trailing empty element
        /// or a leading space is read through it.
        #[test]
        fn one_token_and_plain_lengths_read_as_lists_are(
            token in proptest::sample::select(vec![
                "keep-alive", "Keep-Alive", "KEEP-ALIVE", "close", "Close", "keep-alivE", "clos",
                "closed", "upgrade", "",
            ]),
            digits in "[0-9]{0,22}",
            before in proptest::option::of("[0-9]{1,20}"),
        ) {
            let listed = format!("{token},");
            proptest::prop_assert_eq!(
                noted(FramingName::Connection, &[token.as_bytes()]),
                noted(FramingName::Connection, &[listed.as_bytes()])
            );
            let spaced = format!(" {digits}");
            let first: Vec<&[u8]> = before.iter().map(|b| b.as_bytes()).collect();
            let plain = [&first[..], &[digits.as_bytes()]].concat();
            let through_the_list = [&first[..], &[spaced.as_bytes()]].concat();
            proptest::prop_assert_eq!(
                noted(FramingName::ContentLength, &plain),
                noted(FramingName::ContentLength, &through_the_list)
            );
        }
    }

    proptest::proptest! {
        /// A lone `keep-alive` or `close` is found by its folded words exactly when it is
        /// that token in any case, whatever bytes a field value may hold around or instead.
        #[test]
        fn lone_tokens_are_found_as_a_byte_comparison_finds_them(
            token in proptest::sample::select(vec!["keep-alive", "close", "kEEp-aLIve", "CLOSE"]),
            at in 0usize..10,
            byte in proptest::prelude::any::<u8>(),
            replace in proptest::prelude::any::<bool>(),
        ) {
            let mut value = token.as_bytes().to_vec();
            if replace {
                let at = at % value.len();
                value[at] = byte;
            }
            // Only bytes a field value may hold.
            if let Ok(value) = HeaderValue::from_bytes(&value) {
                let bytes = value.as_bytes();
                let mut fields = FramingFields::default();
                let lone = fields.note_lone_connection(bytes);
                let expected = bytes.eq_ignore_ascii_case(b"keep-alive")
                    || bytes.eq_ignore_ascii_case(b"close");
                proptest::prop_assert_eq!(lone, expected, "{:?}", bytes);
            }
        }
    }

    proptest::proptest! {
        /// Whatever a backend sends, parsing its head and judging its framing never panics,
        /// and a head that parses is taken whole off the buffer.
        #[test]
        fn arbitrary_answers_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            prefix in proptest::sample::select(vec![
                &b""[..],
                b"HTTP/1.1 200 OK\r\n",
                b"HTTP/1.0 204 No Content\r\nContent-Length: ",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: ",
            ]),
            head_method in proptest::sample::select(vec![Method::GET, Method::HEAD]),
        ) {
            let mut input = prefix.to_vec();
            input.extend_from_slice(&bytes);
            let mut buf = bytes::BytesMut::from(&input[..]);
            if let Ok(Some(head)) = head::parse(&mut buf, 16384) {
                proptest::prop_assert!(buf.len() < input.len());
                let _ = response(&head_method, &head);
            }
        }
    }

    #[test]
    fn reuse_follows_version_and_connection() {
        let cases = [
            ("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n", true),
            (
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n",
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\nConnection: x-foo, Close\r\nContent-Length: 1\r\n\r\n",
                false,
            ),
            ("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false),
            (
                "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n",
                true,
            ),
        ];
        for (text, reusable) in cases {
            assert_eq!(get(text), ok(BodyLength::Exact(1), reusable), "{text}");
        }
    }
}
