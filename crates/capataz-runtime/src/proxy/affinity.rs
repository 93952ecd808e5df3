//! Affinity on the request path: the key a hashing pool hashes, taken from the request, and
//! the backend a sticky client's cookie names; the first attempt's pick they make; and the
//! `Set-Cookie` (with the move counted and logged) when a sticky client's answer came from
//! another backend than its cookie named. How the answering backend stands to the one
//! affinity named (`balance::placement`) is one value: the move counter and the access log's
//! `affinity=` are both written from [`Affinity::answered`]'s.
//!
//! A pool with neither costs one check of two `Option`s per request: [`Affinity::of`] then
//! returns [`Affinity::NONE`], and [`Affinity::pick`] leaves the pick to the algorithm.

use crate::client_body::ClientBody;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Response};

use crate::balance::placement::{Home, Placement};
use crate::balance::ring::{client_key, stable_hash};
use crate::balance::sticky::cookie_value;
use crate::balance::{PoolHandle, Snapshot};
use crate::body::RespBody;
use crate::config::HashKey;

use super::ClientInfo;

/// What a request's affinity asks of its pick and its answer.
#[derive(Debug)]
pub(super) struct Affinity {
    /// The hash of the request's key, for a hashing pool (`None`: no key, round robin).
    key: Option<u64>,
    /// Whether the pool is sticky.
    sticky: bool,
    /// Whether the pool hashes or is sticky (the access log then says `affinity=`).
    applies: bool,
    /// The backend affinity names (the client's sticky cookie's, if it names one of the
    /// pool's; else the key's owner on the ring, known at the first pick), and why the request
    /// left it once decided.
    home: Home,
}

impl Affinity {
    /// No affinity: the algorithm picks, no cookie is set.
    pub(super) const NONE: Affinity = Affinity {
        key: None,
        sticky: false,
        applies: false,
        home: Home::NO_KEY,
    };

    /// The affinity of `req` on `pool`; a sticky cookie is taken out of the request (the
    /// backend never sees it).
    #[inline]
    pub(super) fn of(
        pool: &PoolHandle,
        req: &mut Request<ClientBody>,
        client: &ClientInfo,
    ) -> Affinity {
        let hash = pool.config.affinity.hash.as_ref();
        if hash.is_none() && pool.sticky.is_none() {
            return Affinity::NONE;
        }
        let key = hash.and_then(|hash| request_key(&hash.key, req, client));
        let (sticky, home) = match &pool.sticky {
            None => (false, Home::NO_KEY),
            Some(sticky) => {
                let stuck = sticky.backend_of(req.headers());
                let sent = cookie_value(req.headers(), sticky.name()).is_some();
                if sent {
                    sticky.strip(req.headers_mut());
                }
                (true, Home::sticky(stuck, sent))
            }
        };
        Affinity {
            key,
            sticky,
            applies: true,
            home,
        }
    }

    /// The access log's `affinity=` before any answer: `-` on a pool with affinity (the
    /// request may end without one), nothing on the others.
    pub(super) fn unanswered(&self) -> Option<&'static str> {
        self.applies.then_some("-")
    }

    /// The pick affinity makes among the backends not `tried`, or `None` to leave it to the
    /// pool's algorithm: a sticky client's first attempt goes to its backend while the
    /// snapshot lets it stay there; a request with a key goes where the ring says.
    pub(super) fn pick(
        &mut self,
        pool: &PoolHandle,
        snapshot: &Snapshot,
        tried: &[usize],
    ) -> Option<Option<usize>> {
        if let (Some(stuck), Some(sticky)) = (self.home.named(), &pool.sticky) {
            if tried.is_empty() {
                match sticky.stays(snapshot, stuck) {
                    Ok(()) => return Some(Some(stuck)),
                    Err(reason) => self.home.moving(reason),
                }
            }
        }
        if !tried.is_empty() {
            self.home.retried(tried);
        }
        let key = self.key?;
        let factor = pool
            .config
            .affinity
            .hash
            .as_ref()
            .map_or(0, |h| h.balance_factor);
        let picked = snapshot.pick_by_key(key, tried, factor, |b| {
            pool.backends[b]
                .in_flight
                .load(std::sync::atomic::Ordering::Relaxed)
        });
        // A pool that only hashes: the first pick says how it stands to the key's home.
        if !self.sticky && tried.is_empty() {
            self.home = pool.key_home(snapshot, key, picked);
        }
        Some(picked)
    }

    /// The backend affinity picked, `index`, was at its limit: a request named to it that is
    /// served elsewhere moves for that reason.
    pub(super) fn at_limit(&mut self, index: usize) {
        self.home.at_limit(index);
    }

    /// Before relaying backend `index`'s `response`: a sticky client not on `index` gets a
    /// cookie naming it (and `Cache-Control: private` if the answer said nothing of caching,
    /// HAProxy's `nocache`), and a client moved off its backend is counted and logged.
    /// Returns the access log's `affinity=` (`None` on a pool without affinity), from the
    /// same placement the move was counted from.
    pub(super) fn answered(
        &self,
        pool: &PoolHandle,
        index: usize,
        response: &mut Response<RespBody>,
    ) -> Option<&'static str> {
        if !self.applies {
            return None;
        }
        let placement = self.home.placement(index);
        if !self.sticky || placement == Placement::Kept {
            return Some(placement.as_str());
        }
        let Some(set_cookie) = pool.sticky.as_ref().and_then(|s| s.set_cookie(index)) else {
            return Some(placement.as_str());
        };
        let headers: &mut HeaderMap = response.headers_mut();
        headers.append(header::SET_COOKIE, set_cookie.clone());
        if !headers.contains_key(header::CACHE_CONTROL) {
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private"));
        }
        if let (Placement::Moved(reason), Some(from)) = (placement, self.home.named()) {
            let from_name = &pool.backends[from].name;
            pool.metrics.sticky_move(from_name, reason.as_str());
            tracing::debug!(
                pool = %pool.name,
                from = %from_name,
                to = %pool.backends[index].name,
                reason = reason.as_str(),
                "sticky client moved"
            );
        }
        Some(placement.as_str())
    }
}

/// The hash of `req`'s `key`, or `None` when it has none (an absent or empty value).
fn request_key(key: &HashKey, req: &Request<ClientBody>, client: &ClientInfo) -> Option<u64> {
    let bytes: &[u8] = match key {
        HashKey::ClientIp => return Some(client_key(client.addr.ip())),
        HashKey::Path => req.uri().path().as_bytes(),
        HashKey::Header(name) => req.headers().get(name)?.as_bytes(),
        HashKey::Cookie(name) => cookie_value(req.headers(), name)?,
        HashKey::Query(name) => query_value(req.uri().query()?, name)?,
    };
    (!bytes.is_empty()).then(|| stable_hash(bytes))
}

/// The value of the first parameter `name` of `query`, as sent.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q [u8]> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .map(str::as_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_parameter_is_found_by_its_whole_name() {
        assert_eq!(
            query_value("a=1&user=bob&user=eve", "user"),
            Some(&b"bob"[..])
        );
        assert_eq!(
            query_value("username=bob&user=eve", "user"),
            Some(&b"eve"[..])
        );
        assert_eq!(query_value("user", "user"), None);
        assert_eq!(query_value("user=", "user"), Some(&b""[..]));
        assert_eq!(query_value("", "user"), None);
    }
}
