//! The request heads HTTP/3 calls malformed (RFC 9114 section 4.1.2) that h3 passes on, refused
//! as h2 refuses the same heads over HTTP/2 (its stream reset, `PROTOCOL_ERROR`), so that a
//! request is refused or relayed alike whichever of the two it came by: a connection-specific
//! field (RFC 9114 section 4.2), and `Content-Length` fields that do not state one number.
//! h3 itself refuses what its own decoding cannot take (no `:method`, no authority, `Host` and
//! `:authority` that differ, an unknown pseudo-header field, uppercase names). It lets a
//! repeated pseudo-header field through (the last one wins), which h2 refuses: that cannot be
//! seen once h3 has decoded the head.

use http::header::{self, HeaderMap, HeaderName};

/// Why a head is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Malformed {
    /// `Connection`, `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, or a
    /// `TE` other than `trailers`.
    ConnectionSpecific,
    /// A `Content-Length` field that is not 1 to 19 digits, or fields that differ.
    NotOneLength,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Malformed::ConnectionSpecific => "a connection-specific header field",
            Malformed::NotOneLength => "Content-Length fields that do not state one number",
        })
    }
}

/// The fields HTTP/3 (and HTTP/2) requests must not carry, as h2 lists them.
const CONNECTION_SPECIFIC: [HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// The request's `Content-Length` (`None`: it has none), or why its head is malformed.
pub(super) fn check(headers: &HeaderMap) -> Result<Option<u64>, Malformed> {
    let connection_specific = CONNECTION_SPECIFIC
        .iter()
        .any(|name| headers.contains_key(name))
        || headers
            .get_all(header::TE)
            .iter()
            .any(|te| te != "trailers");
    if connection_specific {
        return Err(Malformed::ConnectionSpecific);
    }
    content_length(headers)
}

/// The request's `Content-Length`. Refused as h2 refuses it over HTTP/2: a field that is not
/// 1 to 19 ASCII digits (a list such as `5, 6`, a sign, a space) or fields that differ; equal
/// fields state one length. An empty field, which h2 reads as 0, is refused too (RFC 9110
/// section 8.6: at least one digit), as hyper refuses it on HTTP/1.1.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Malformed> {
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        let digits = value.as_bytes();
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return Err(Malformed::NotOneLength);
        }
        // At most 19 digits: below u64::MAX.
        let value = digits
            .iter()
            .fold(0u64, |n, digit| n * 10 + u64::from(digit - b'0'));
        if length.is_some_and(|length| length != value) {
            return Err(Malformed::NotOneLength);
        }
        length = Some(value);
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH};

    use super::{check, Malformed};

    fn head(fields: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            headers.append(name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    fn lengths(fields: &[&str], expected: Result<Option<u64>, Malformed>) {
        let fields: Vec<_> = fields
            .iter()
            .map(|v| (CONTENT_LENGTH.as_str(), *v))
            .collect();
        assert_eq!(check(&head(&fields)), expected, "{fields:?}");
    }

    #[test]
    fn content_length_is_refused_unless_its_fields_state_one_number() {
        lengths(&[], Ok(None));
        lengths(&["0"], Ok(Some(0)));
        lengths(&["5"], Ok(Some(5)));
        lengths(&["5", "5"], Ok(Some(5)));
        lengths(
            &["9999999999999999999"],
            Ok(Some(9_999_999_999_999_999_999)),
        );
        for bad in [
            &["5", "6"][..],
            &["5, 6"],
            &["5, 5"],
            &["5,5"],
            &["abc"],
            &["+5"],
            &["-1"],
            &[" 5"],
            &["5 "],
            &[""],
            &["0x10"],
            &["10000000000000000000"],
            &["5", "abc"],
        ] {
            lengths(bad, Err(Malformed::NotOneLength));
        }
    }

    #[test]
    fn connection_specific_fields_are_refused_as_h2_refuses_them() {
        for field in [
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "gzip"),
        ] {
            let checked = check(&head(&[("x-a", "b"), field]));
            assert_eq!(checked, Err(Malformed::ConnectionSpecific), "{field:?}");
        }
        assert_eq!(check(&head(&[("te", "trailers")])), Ok(None));
        assert_eq!(
            check(&head(&[("te", "trailers"), ("content-length", "3")])),
            Ok(Some(3))
        );
    }
}
