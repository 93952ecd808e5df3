//! A pool's affinity settings: the key a hashing pool (`algorithm = "hash"`) hashes, its
//! bounded-load factor, and sticky sessions by cookie (`[pools.NAME.sticky]`).

use std::time::Duration;

/// A pool's affinity: hashing (with `algorithm = "hash"`) and sticky sessions (default:
/// neither).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Affinity {
    /// What a hashing pool hashes (`Some` exactly when `algorithm = "hash"`).
    pub hash: Option<HashConfig>,
    /// Sticky sessions by cookie (`[pools.NAME.sticky]`).
    pub sticky: Option<StickyConfig>,
}

/// Consistent hashing of one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashConfig {
    /// What is hashed (`hash_key`, default the client's address).
    pub key: HashKey,
    /// Bounded loads, in percent of the average outstanding requests per unit of weight
    /// (`hash_balance_factor`, default 0: off; else 101 to 10,000).
    pub balance_factor: u32,
}

/// The part of a request a hashing pool hashes (`hash_key`). A request without it (no such
/// header, cookie or parameter, or an empty value) is balanced round robin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HashKey {
    /// The client's IP address (`"client_ip"`; the PROXY protocol's when it names one).
    ClientIp,
    /// The path, without the query (`"path"`).
    Path,
    /// The first value of a request header (`"header:NAME"`).
    Header(http::HeaderName),
    /// The value of a cookie (`"cookie:NAME"`).
    Cookie(String),
    /// The value of the first query parameter so named (`"query:NAME"`), as sent (not
    /// percent-decoded).
    Query(String),
}

impl std::fmt::Display for HashKey {
    /// As `hash_key` writes it (a header's name lowercased).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HashKey::ClientIp => f.write_str("client_ip"),
            HashKey::Path => f.write_str("path"),
            HashKey::Header(name) => write!(f, "header:{name}"),
            HashKey::Cookie(name) => write!(f, "cookie:{name}"),
            HashKey::Query(name) => write!(f, "query:{name}"),
        }
    }
}

impl OnDrain {
    /// `keep` or `move`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDrain::Keep => "keep",
            OnDrain::Move => "move",
        }
    }
}

/// Sticky sessions by cookie of one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StickyConfig {
    /// The cookie's name (`cookie`, required).
    pub cookie: String,
    /// Its `Path` attribute (default `/`).
    pub path: String,
    /// Its `Max-Age` (default: none, a session cookie).
    pub max_age: Option<Duration>,
    /// Whether it is `Secure` (default false).
    pub secure: bool,
    /// Whether it is `HttpOnly` (default true).
    pub http_only: bool,
    /// Its `SameSite` attribute (default `Lax`).
    pub same_site: SameSite,
    /// What a draining backend does with its sticky clients (default keep).
    pub on_drain: OnDrain,
}

/// A cookie's `SameSite` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SameSite {
    /// `SameSite=Lax` (default).
    Lax,
    /// `SameSite=Strict`.
    Strict,
    /// `SameSite=None` (browsers require `Secure` with it).
    None,
}

impl SameSite {
    /// `Lax`, `Strict` or `None`, as the attribute spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SameSite::Lax => "Lax",
            SameSite::Strict => "Strict",
            SameSite::None => "None",
        }
    }
}

/// What a draining backend does with its sticky clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDrain {
    /// They stay on it while it drains and its health verdict is UP (HAProxy's behaviour
    /// with a server at weight 0 or in drain): only new clients go elsewhere.
    Keep,
    /// They are moved at their next request, as from a backend that is DOWN.
    Move,
}
