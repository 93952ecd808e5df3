//! HTTP-01 (RFC 8555, section 8.3): the tokens being validated and their key authorizations,
//! shared by every ACME task of a balancer (which adds its tokens while its authorizations are
//! pending and removes them after) and every plaintext listener (which answers
//! `GET /.well-known/acme-challenge/<token>` for a pending token, before routing).
//!
//! Only a pending token is answered: any other path under the prefix goes to routing as any
//! request does (a backend may answer its own challenges). The map is bounded by what the ACME
//! tasks put in it (one token per domain of a pending order, at most 100 per listener); a
//! request is looked up by its exact path, never stored.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use http::Method;

/// The path prefix of HTTP-01 validation requests.
pub(crate) const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// The longest token looked up (RFC 8555 tokens are 43 base64url characters; 128 leaves room).
const MAX_TOKEN: usize = 128;

/// The pending HTTP-01 tokens of every ACME task, by token: the task that set it and the key
/// authorization to answer.
#[derive(Debug, Default)]
pub struct Http01Tokens {
    tokens: Mutex<HashMap<String, (u64, String)>>,
    next_owner: std::sync::atomic::AtomicU64,
}

/// What a plaintext listener answers to a request for a pending token.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Http01Answer {
    /// `200`, the key authorization as the body (`GET`; `HEAD` gets the head alone).
    KeyAuthorization(String),
    /// `405`: a method other than `GET` or `HEAD` on a pending token.
    MethodNotAllowed,
}

impl Http01Tokens {
    /// An empty registry, shared (one per balancer, kept across reloads).
    pub(crate) fn new() -> Arc<Http01Tokens> {
        Arc::new(Http01Tokens::default())
    }

    /// A handle for one ACME task: its tokens are removed when it is dropped (the task ended
    /// or was aborted by a reload).
    pub fn owner(self: &Arc<Self>) -> Http01Owner {
        let id = self
            .next_owner
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Http01Owner {
            tokens: self.clone(),
            id,
        }
    }

    /// The answer to `method` on `path`, if `path` is a pending token's; `None` lets the
    /// request go to routing.
    pub(crate) fn answer(&self, method: &Method, path: &str) -> Option<Http01Answer> {
        let token = path.strip_prefix(CHALLENGE_PREFIX)?;
        if token.is_empty() || token.len() > MAX_TOKEN {
            return None;
        }
        let key_authorization = self.lock().get(token)?.1.clone();
        Some(if method == Method::GET || method == Method::HEAD {
            Http01Answer::KeyAuthorization(key_authorization)
        } else {
            Http01Answer::MethodNotAllowed
        })
    }

    /// How many tokens are pending.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no token is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (u64, String)>> {
        // Inserts and removals are single map operations: a panic elsewhere cannot leave the
        // map half-written, so a poisoned lock is recovered.
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One ACME task's hold on the registry.
#[derive(Debug)]
pub struct Http01Owner {
    tokens: Arc<Http01Tokens>,
    id: u64,
}

impl Http01Owner {
    /// Answers `token` with `key_authorization` until cleared. A token another task set is
    /// left alone (tokens are random: it does not happen unless a server reuses one).
    pub fn set(&self, token: &str, key_authorization: &str) {
        self.tokens
            .lock()
            .entry(token.to_owned())
            .or_insert_with(|| (self.id, key_authorization.to_owned()));
    }

    /// Stops answering this task's tokens.
    pub(crate) fn clear(&self) {
        self.tokens.lock().retain(|_, (owner, _)| *owner != self.id);
    }
}

impl Drop for Http01Owner {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pending_token_is_answered_and_only_to_get_and_head() {
        let tokens = Http01Tokens::new();
        let owner = tokens.owner();
        owner.set("abc_-123", "abc_-123.thumb");
        let path = "/.well-known/acme-challenge/abc_-123";
        assert_eq!(
            tokens.answer(&Method::GET, path),
            Some(Http01Answer::KeyAuthorization("abc_-123.thumb".into()))
        );
        assert_eq!(
            tokens.answer(&Method::HEAD, path),
            Some(Http01Answer::KeyAuthorization("abc_-123.thumb".into()))
        );
        assert_eq!(
            tokens.answer(&Method::POST, path),
            Some(Http01Answer::MethodNotAllowed)
        );
        for other in [
            "/.well-known/acme-challenge/",
            "/.well-known/acme-challenge/other",
            "/.well-known/acme-challenge/abc_-123/",
            "/.well-known/acme-challenge/abc_-1234",
            "/.well-known/acme-challenge//abc_-123",
            "/.WELL-KNOWN/acme-challenge/abc_-123",
            "/abc_-123",
        ] {
            assert_eq!(tokens.answer(&Method::GET, other), None, "{other}");
        }
        let long = format!("{CHALLENGE_PREFIX}{}", "a".repeat(100_000));
        assert_eq!(tokens.answer(&Method::GET, &long), None);
        owner.clear();
        assert_eq!(tokens.answer(&Method::GET, path), None);
    }

    #[test]
    fn a_dropped_owner_takes_only_its_own_tokens() {
        let tokens = Http01Tokens::new();
        let first = tokens.owner();
        let second = tokens.owner();
        first.set("one", "one.k");
        second.set("two", "two.k");
        second.set("one", "stolen");
        drop(first);
        assert_eq!(tokens.len(), 1);
        assert!(tokens
            .answer(&Method::GET, "/.well-known/acme-challenge/two")
            .is_some());
        drop(second);
        assert!(tokens.is_empty());
    }
}
