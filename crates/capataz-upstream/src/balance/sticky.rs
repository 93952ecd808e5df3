//! Sticky sessions by cookie (HAProxy's `cookie SRV insert indirect nocache`): the cookie
//! names a client's backend by an opaque id, and the client stays there while the snapshot
//! says that backend may serve it.
//!
//! A backend's id is [`stable_hash`] of the pool's and the backend's names, written as 16
//! lowercase hex digits: the same in every instance and after every restart, and it says
//! nothing of the backend's address. A value that is not one of the pool's ids (forged,
//! garbage, or a backend removed since) is a miss: the client is balanced as a new one and
//! gets a fresh cookie.

use http::header::{HeaderMap, HeaderValue, COOKIE};

pub use super::placement::MoveReason;
use super::ring::stable_hash;
use super::Snapshot;
use capataz_config::{OnDrain, StickyConfig};

/// One pool's sticky cookie: its name, every backend's id and `Set-Cookie` value.
#[derive(Debug)]
pub struct Sticky {
    /// The cookie's name.
    name: Box<str>,
    on_drain: OnDrain,
    /// `(id, backend index)`, by id.
    ids: Vec<(u64, u32)>,
    /// The `Set-Cookie` value naming each backend, in pool order.
    set_cookies: Vec<HeaderValue>,
}

impl Sticky {
    /// The sticky cookie of pool `pool` with backends `names` (in pool order), as `config`
    /// says.
    pub fn new<'a>(
        pool: &str,
        names: impl Iterator<Item = &'a str>,
        config: &StickyConfig,
    ) -> Sticky {
        let mut attributes = format!("; Path={}", config.path);
        if let Some(max_age) = config.max_age {
            attributes.push_str(&format!("; Max-Age={}", max_age.as_secs()));
        }
        if config.secure {
            attributes.push_str("; Secure");
        }
        if config.http_only {
            attributes.push_str("; HttpOnly");
        }
        attributes.push_str("; SameSite=");
        attributes.push_str(config.same_site.as_str());
        let mut ids = Vec::new();
        let mut set_cookies = Vec::new();
        for (index, name) in names.enumerate() {
            let id = backend_id(pool, name);
            ids.push((id, index as u32));
            let value = format!("{}={id:016x}{attributes}", config.cookie);
            // The name and path were validated as tokens and printable text.
            set_cookies.push(
                HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static("")),
            );
        }
        ids.sort_unstable();
        Sticky {
            name: config.cookie.as_str().into(),
            on_drain: config.on_drain,
            ids,
            set_cookies,
        }
    }

    /// The backend the request's sticky cookie names, if it has one naming a backend of the
    /// pool (its first such cookie); anything else is a miss.
    pub fn backend_of(&self, headers: &HeaderMap) -> Option<usize> {
        let value = cookie_value(headers, &self.name)?;
        if value.len() != 16 {
            return None;
        }
        let id = u64::from_str_radix(std::str::from_utf8(value).ok()?, 16).ok()?;
        let at = self.ids.binary_search_by_key(&id, |&(id, _)| id).ok()?;
        Some(self.ids[at].1 as usize)
    }

    /// Whether a client stuck to `backend` stays there by `snapshot`, or why it moves.
    pub fn stays(&self, snapshot: &Snapshot, backend: usize) -> Result<(), MoveReason> {
        if snapshot.serves(backend) {
            return Ok(());
        }
        match (snapshot.drains(backend), self.on_drain) {
            (true, OnDrain::Keep) => Ok(()),
            (true, OnDrain::Move) => Err(MoveReason::Draining),
            (false, _) => Err(MoveReason::OutOfRotation),
        }
    }

    /// The `Set-Cookie` value that sticks a client to `backend`.
    pub fn set_cookie(&self, backend: usize) -> Option<&HeaderValue> {
        self.set_cookies.get(backend)
    }

    /// The cookie's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes the sticky cookie from `headers` (the backend never sees it: HAProxy's
    /// `indirect`), keeping the client's other cookies as sent.
    pub fn strip(&self, headers: &mut HeaderMap) {
        let mut kept: Vec<HeaderValue> = Vec::new();
        for value in headers.get_all(COOKIE) {
            let bytes = value.as_bytes();
            let pairs: Vec<&[u8]> = bytes
                .split(|&b| b == b';')
                .map(trim)
                .filter(|pair| !pair.is_empty() && cookie_name(pair) != self.name.as_bytes())
                .collect();
            if pairs.len() == bytes.split(|&b| b == b';').count() {
                kept.push(value.clone());
            } else if !pairs.is_empty() {
                // A field of pairs taken from a valid field is valid.
                if let Ok(value) = HeaderValue::from_bytes(&pairs.join(&b"; "[..])) {
                    kept.push(value);
                }
            }
        }
        headers.remove(COOKIE);
        for value in kept {
            headers.append(COOKIE, value);
        }
    }
}

/// The opaque id of backend `backend` of pool `pool`.
pub fn backend_id(pool: &str, backend: &str) -> u64 {
    let mut bytes = Vec::with_capacity(pool.len() + backend.len() + 1);
    bytes.extend_from_slice(pool.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(backend.as_bytes());
    stable_hash(&bytes)
}

/// The value of the first cookie named `name` in the request's `Cookie` fields (HTTP/2
/// clients may send several), without surrounding double quotes; `None` without one.
pub fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let (key, value) = split_pair(pair)?;
            (key == name.as_bytes()).then_some(value)
        })
        .map(|value| match value {
            [b'"', inner @ .., b'"'] => inner,
            _ => value,
        })
}

/// A cookie pair's name, for [`Sticky::strip`]; a pair without `=` is all name (so a bare
/// `SRV` is stripped too).
fn cookie_name(pair: &[u8]) -> &[u8] {
    split_pair(pair).map_or(trim(pair), |(key, _)| key)
}

/// A cookie pair's name and value, both trimmed; `None` without `=`.
fn split_pair(pair: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = pair.iter().position(|&b| b == b'=')?;
    Some((trim(&pair[..at]), trim(&pair[at + 1..])))
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use capataz_config::SameSite;

    use super::*;

    fn config(on_drain: OnDrain) -> StickyConfig {
        StickyConfig {
            cookie: "SRV".into(),
            path: "/".into(),
            max_age: Some(Duration::from_secs(3600)),
            secure: true,
            http_only: true,
            same_site: SameSite::Lax,
            on_drain,
        }
    }

    fn headers(cookies: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for c in cookies {
            headers.append(COOKIE, HeaderValue::from_str(c).unwrap());
        }
        headers
    }

    #[test]
    fn a_cookie_names_a_backend_by_an_opaque_stable_id() {
        let sticky = Sticky::new("web", ["a", "b"].into_iter(), &config(OnDrain::Keep));
        let id = backend_id("web", "b");
        assert_eq!(id, backend_id("web", "b"));
        assert_ne!(id, backend_id("api", "b"), "the pool's name counts");
        let set = sticky.set_cookie(1).unwrap().to_str().unwrap();
        assert_eq!(
            set,
            format!("SRV={id:016x}; Path=/; Max-Age=3600; Secure; HttpOnly; SameSite=Lax")
        );
        let cookie = format!("theme=dark; SRV={id:016x}");
        assert_eq!(sticky.backend_of(&headers(&[&cookie])), Some(1));
        // HTTP/2 clients split cookies over several fields; quotes are allowed.
        let quoted = format!("SRV=\"{id:016x}\"");
        assert_eq!(
            sticky.backend_of(&headers(&["theme=dark", &quoted])),
            Some(1)
        );
    }

    #[test]
    fn forged_or_garbage_values_are_misses() {
        let sticky = Sticky::new("web", ["a", "b"].into_iter(), &config(OnDrain::Keep));
        for bad in [
            "SRV=",
            "SRV",
            "SRV=zzzzzzzzzzzzzzzz",
            "SRV=0000000000000000",
            "SRV=+123456789abcdef",
            "SRV=ffffffffffffffffff",
            "SRVX=1",
            "=; ;;",
            "SRV=\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}",
        ] {
            let mut h = HeaderMap::new();
            h.append(COOKIE, HeaderValue::from_bytes(bad.as_bytes()).unwrap());
            assert_eq!(sticky.backend_of(&h), None, "{bad:?}");
        }
        assert_eq!(sticky.backend_of(&HeaderMap::new()), None);
    }

    proptest::proptest! {
        /// Any bytes a client sends as cookies: no panic, and the sticky cookie is gone after
        /// stripping.
        #[test]
        fn hostile_cookie_fields_never_panic(
            fields in proptest::collection::vec(
                proptest::collection::vec(proptest::prop_oneof![
                    proptest::strategy::Just(b';'), proptest::strategy::Just(b'='),
                    proptest::strategy::Just(b'"'), proptest::strategy::Just(b' '),
                    proptest::strategy::Just(b'S'), proptest::strategy::Just(b'R'),
                    proptest::strategy::Just(b'V'), 0x21u8..0x7f, 0x80u8..=0xff,
                ], 0..40),
                0..4,
            ),
        ) {
            let sticky = Sticky::new("web", ["a"].into_iter(), &config(OnDrain::Keep));
            let mut h = HeaderMap::new();
            for field in &fields {
                if let Ok(value) = HeaderValue::from_bytes(field) {
                    h.append(COOKIE, value);
                }
            }
            let _ = sticky.backend_of(&h);
            sticky.strip(&mut h);
            proptest::prop_assert!(cookie_value(&h, "SRV").is_none());
        }
    }

    #[test]
    fn the_sticky_cookie_is_stripped_and_the_others_kept() {
        let sticky = Sticky::new("web", ["a"].into_iter(), &config(OnDrain::Keep));
        let mut h = headers(&["a=1; SRV=00; b=2", "SRV=1", "c=3"]);
        sticky.strip(&mut h);
        let left: Vec<&str> = h
            .get_all(COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(left, ["a=1; b=2", "c=3"]);
    }

    #[test]
    fn a_draining_backend_keeps_or_moves_its_clients() {
        let mut snapshot = Snapshot::new(vec![0], vec![10, 10, 10], false);
        snapshot.draining = vec![1];
        let keep = Sticky::new("web", ["a", "b", "c"].into_iter(), &config(OnDrain::Keep));
        let moving = Sticky::new("web", ["a", "b", "c"].into_iter(), &config(OnDrain::Move));
        assert_eq!(keep.stays(&snapshot, 0), Ok(()));
        assert_eq!(keep.stays(&snapshot, 1), Ok(()));
        assert_eq!(moving.stays(&snapshot, 1), Err(MoveReason::Draining));
        assert_eq!(keep.stays(&snapshot, 2), Err(MoveReason::OutOfRotation));
    }
}
