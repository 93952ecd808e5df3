//! A `tcp` check's exchange: what it writes once connected (`send` as text, or `send_hex` as
//! bytes) and what the answer must hold (`expect_text` anywhere in its first 16 KiB, or
//! `expect_hex` at its very start), each bounded, each refused with its line and key.

use std::ops::Range;

use super::super::raw::RawActive;
use super::{ConfigError, Validator};
use crate::{TcpExchange, TcpExpect, MAX_MATCH_TEXT, MAX_PROBE_BODY};

impl Validator<'_> {
    /// A `tcp` check's `send` or `send_hex` (at most 64 KiB) and `expect_text` or
    /// `expect_hex` (1 to 256 bytes); `send` and `expect_text` as TOML read them (a basic
    /// string's escapes, `\r\n` say, already turned into their bytes). Whether the check is
    /// `kind = "tcp"` is `pool_active`'s to say, once the kind is known.
    pub(super) fn tcp_exchange(
        &self,
        at: &str,
        raw: &RawActive,
    ) -> Result<Option<TcpExchange>, ConfigError> {
        if exchange_key(raw).is_none() {
            return Ok(None);
        }
        let send = match (&raw.send, &raw.send_hex) {
            (Some(_), Some(hex)) => {
                return Err(self.error(
                    Some(hex.span()),
                    &format!("{at}.send_hex"),
                    "send and send_hex both say what the check writes (keep one: send for \
                     text, send_hex for bytes)"
                        .into(),
                ))
            }
            (Some(text), None) => Some((text.span(), "send", text.get_ref().as_bytes().to_vec())),
            (None, Some(hex)) => Some((hex.span(), "send_hex", self.hex(at, "send_hex", hex)?)),
            (None, None) => None,
        };
        if let Some((span, key, bytes)) = &send {
            if bytes.len() > MAX_PROBE_BODY {
                return Err(self.error(
                    Some(span.clone()),
                    &format!("{at}.{key}"),
                    format!(
                        "{} bytes; at most {MAX_PROBE_BODY} (send a shorter request)",
                        bytes.len()
                    ),
                ));
            }
        }
        let expect = match (&raw.expect_text, &raw.expect_hex) {
            (Some(_), Some(hex)) => {
                return Err(self.error(
                    Some(hex.span()),
                    &format!("{at}.expect_hex"),
                    "expect_text and expect_hex both say what the answer must hold (keep one: \
                     expect_text for text anywhere in it, expect_hex for the bytes it starts \
                     with)"
                        .into(),
                ))
            }
            (Some(text), None) => {
                let value = text.get_ref();
                if value.is_empty() || value.len() > MAX_MATCH_TEXT {
                    return Err(self.error(
                        Some(text.span()),
                        &format!("{at}.expect_text"),
                        format!(
                            "expect_text must be 1 to {MAX_MATCH_TEXT} bytes (write the text \
                             the answer holds, e.g. \"+PONG\")"
                        ),
                    ));
                }
                Some(TcpExpect::Text(value.clone()))
            }
            (None, Some(hex)) => {
                let bytes = self.hex(at, "expect_hex", hex)?;
                if bytes.is_empty() || bytes.len() > MAX_MATCH_TEXT {
                    return Err(self.error(
                        Some(hex.span()),
                        &format!("{at}.expect_hex"),
                        format!(
                            "expect_hex must be 1 to {MAX_MATCH_TEXT} bytes (write the bytes the \
                             answer starts with, e.g. \"52\" for PostgreSQL's 'R')"
                        ),
                    ));
                }
                Some(TcpExpect::Prefix(bytes))
            }
            (None, None) => None,
        };
        Ok(Some(TcpExchange {
            send: send.map(|(_, _, bytes)| bytes).unwrap_or_default(),
            expect,
        }))
    }

    /// The bytes `key`'s hex digits spell: pairs of digits (either case), spaces allowed
    /// between the pairs, nothing else.
    fn hex(
        &self,
        at: &str,
        key: &str,
        value: &toml::Spanned<String>,
    ) -> Result<Vec<u8>, ConfigError> {
        decode_hex(value.get_ref()).map_err(|why| {
            self.error(
                Some(value.span()),
                &format!("{at}.{key}"),
                format!(
                    "{why} ({key} is pairs of hex digits, spaces allowed between them, e.g. \
                     \"0000 0008 04d2 162f\")"
                ),
            )
        })
    }
}

/// The first exchange key written (`send`, `send_hex`, `expect_text`, `expect_hex`), and where:
/// what a config error about the exchange as a whole points at.
pub(super) fn exchange_key(raw: &RawActive) -> Option<(&'static str, Range<usize>)> {
    [
        ("send", &raw.send),
        ("send_hex", &raw.send_hex),
        ("expect_text", &raw.expect_text),
        ("expect_hex", &raw.expect_hex),
    ]
    .into_iter()
    .find_map(|(key, value)| value.as_ref().map(|value| (key, value.span())))
}

/// `text`'s hex digit pairs as bytes; spaces between pairs are skipped.
fn decode_hex(text: &str) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(text.len() / 2);
    let mut high: Option<u8> = None;
    for (at, c) in text.char_indices() {
        if c == ' ' {
            if high.is_some() {
                return Err(format!("a space at byte {at} splits a pair of hex digits"));
            }
            continue;
        }
        let Some(digit) = c.to_digit(16) else {
            return Err(format!("{c:?} at byte {at} is not a hex digit"));
        };
        // A hex digit is at most 15.
        let digit = digit as u8;
        match high.take() {
            None => high = Some(digit),
            Some(first) => bytes.push(first << 4 | digit),
        }
    }
    if high.is_some() {
        return Err("an odd number of hex digits (each byte is two)".into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::decode_hex;

    #[test]
    fn hex_is_pairs_of_digits_with_spaces_between_them() {
        assert_eq!(
            decode_hex("0000 0008 04d2162F").unwrap(),
            [0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f]
        );
        assert_eq!(decode_hex("").unwrap(), Vec::<u8>::new());
        assert!(decode_hex("0 8").unwrap_err().contains("splits a pair"));
        assert!(decode_hex("abc").unwrap_err().contains("odd number"));
        assert!(decode_hex("0x52").unwrap_err().contains("'x' at byte 1"));
        assert!(decode_hex("5é").unwrap_err().contains("not a hex digit"));
    }
}
