//! What etcd's v3 JSON gateway sends and takes: requests built as JSON text, answers read into
//! small typed shapes. Keys and values travel in base64; 64-bit integers as strings (proto3's
//! JSON mapping), which [`int64`] also takes as numbers.

use serde::{Deserialize, Deserializer};

/// The header every answer carries.
#[derive(Debug, Default, Deserialize)]
pub struct Header {
    /// The store's revision when the answer was made.
    #[serde(default, deserialize_with = "int64")]
    pub revision: i64,
}

/// One key and its value.
#[derive(Debug, Default, Deserialize)]
pub struct KeyValue {
    /// The key, base64.
    #[serde(default)]
    pub key: String,
    /// The value, base64 (absent in a delete event).
    #[serde(default)]
    pub value: String,
    /// The revision of the key's last change.
    #[serde(default, deserialize_with = "int64")]
    pub(crate) mod_revision: i64,
    /// The lease the key is attached to (0: none).
    #[serde(default, deserialize_with = "int64")]
    pub lease: i64,
}

/// The answer to `/v3/kv/range`.
#[derive(Debug, Default, Deserialize)]
pub struct RangeResponse {
    /// The answer's header.
    #[serde(default)]
    pub header: Header,
    /// The keys found, at most the limit asked for.
    #[serde(default)]
    pub kvs: Vec<KeyValue>,
    /// More keys than the limit asked for.
    #[serde(default)]
    pub more: bool,
}

/// One line of the `/v3/watch` stream: a result, or an error that ends the stream.
#[derive(Debug, Deserialize)]
pub struct WatchLine {
    /// A watch response.
    #[serde(default)]
    pub result: Option<WatchResponse>,
    /// An error, which ends the stream.
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

/// A watch response.
#[derive(Debug, Default, Deserialize)]
pub struct WatchResponse {
    /// The watch was created (the first response).
    #[serde(default)]
    pub(crate) created: bool,
    /// The watch was cancelled by the server.
    #[serde(default)]
    pub canceled: bool,
    /// With `canceled`: the revision the store was compacted to, when that was the cause.
    #[serde(default, deserialize_with = "int64")]
    pub(crate) compact_revision: i64,
    /// With `canceled`: why, when the server says.
    #[serde(default)]
    pub cancel_reason: String,
    /// The changes, in revision order.
    #[serde(default)]
    pub events: Vec<WatchEvent>,
}

/// One change of a key.
#[derive(Debug, Default, Deserialize)]
pub struct WatchEvent {
    /// `PUT` (also when absent: proto3 leaves the default out) or `DELETE`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// The key after the change (its key alone for a delete).
    #[serde(default)]
    pub kv: KeyValue,
}

/// An int64 written as a string (proto3 JSON) or a number.
fn int64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(deserializer)? {
        Int::Number(n) => Ok(n),
        Int::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `range_end`): the prefix with
/// its last byte below 0xff incremented and what follows dropped; `\0` (every key) when all
/// its bytes are 0xff.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A range request for every key under `prefix` (at most `limit`), or only their count.
pub fn range_request(prefix: &[u8], limit: usize, count_only: bool) -> String {
    serde_json::json!({
        "key": encode(prefix),
        "range_end": encode(&prefix_end(prefix)),
        "limit": limit.to_string(),
        "count_only": count_only,
    })
    .to_string()
}

/// A watch request for every key under `prefix` from `revision` on.
pub fn watch_request(prefix: &[u8], revision: i64) -> String {
    serde_json::json!({
        "create_request": {
            "key": encode(prefix),
            "range_end": encode(&prefix_end(prefix)),
            "start_revision": revision.to_string(),
        }
    })
    .to_string()
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> shift) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64, padding optional; `None` for anything else.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_length_and_refuses_stray_bytes() {
        for len in 0..10 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 250) as u8).collect();
            assert_eq!(decode(&encode(&bytes)), Some(bytes));
        }
        assert_eq!(encode(b"foo"), "Zm9v");
        assert_eq!(encode(b"foo1"), "Zm9vMQ==");
        assert_eq!(decode("Zm9vMQ"), Some(b"foo1".to_vec()));
        assert_eq!(decode("Zm9v!"), None);
        assert_eq!(decode("Z"), None);
    }

    #[test]
    fn the_prefix_range_ends_past_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"/web/"), b"/web0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn gateway_answers_read_int64_as_text_or_number() {
        let line: WatchLine = serde_json::from_str(
            r#"{"result":{"header":{"revision":"7"},"canceled":true,"compact_revision":5}}"#,
        )
        .expect("a watch line");
        assert_eq!(line.result.expect("a result").compact_revision, 5);
        let range: RangeResponse =
            serde_json::from_str(r#"{"header":{"revision":9},"kvs":[],"more":true}"#)
                .expect("a range answer");
        assert_eq!(range.header.revision, 9);
        assert!(serde_json::from_str::<RangeResponse>(r#"{"header":{"revision":"x"}}"#).is_err());
    }
}
