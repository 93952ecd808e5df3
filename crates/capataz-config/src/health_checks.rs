//! A pool's health checks: the active probe (kind, request, expected statuses and content,
//! with the limits that bound them) and the passive checks on real traffic (errors, success
//! rate, load shedding, latency outliers).

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::{GrpcCodes, Percentile, State, StatusSet};

/// What an active check does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// `GET <path>` over a fresh connection; only the status line is read (default). Over
    /// TLS on a pool with `tls`, over HTTP/2 on a pool with `protocol = "h2"` or `"h2c"`.
    Http,
    /// A TCP connect within the timeout passes.
    Tcp,
    /// The standard gRPC health check (`grpc.health.v1.Health/Check`) over HTTP/2: an OK call
    /// that reports `SERVING` passes. HTTP/2 pools only.
    Grpc,
    /// No active checks: the active side stays UP.
    None,
}

/// Active checks of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveCheckConfig {
    /// The kind of probe.
    pub kind: CheckKind,
    /// The path probed (default `/healthz`).
    pub path: String,
    /// The Host header sent; the backend's address when `None`.
    pub host: Option<String>,
    /// The statuses that pass (default 200-399).
    pub expect: StatusSet,
    /// Time between the end of one probe and the start of the next (default 2 s).
    pub interval: Duration,
    /// Deadline for connect and status line together (default 1 s).
    pub timeout: Duration,
    /// Consecutive passes that bring a DOWN backend UP (default 2).
    pub rise: NonZeroU32,
    /// Consecutive failures that take an UP backend DOWN (default 3).
    pub fall: NonZeroU32,
    /// Each interval is drawn uniformly within +-`jitter` of itself, as a fraction 0.0-0.5
    /// (default 0.1, i.e. 10 %).
    pub jitter: f64,
    /// Active state of the pool's backends when the balancer starts (default UP; DOWN for
    /// `first-probe`).
    pub initial: State,
    /// Whether a `404` from the health route drains the backend instead of failing the probe
    /// (default false; HTTP checks only).
    pub disable_on_404: bool,
    /// Passing probes in a row a backend needs after maintenance before traffic (default:
    /// `rise`).
    pub rise_after_maintenance: Option<NonZeroU32>,
    /// `initial = "first-probe"`: a backend's first probe decides at once (DOWN until then).
    pub first_probe: bool,
    /// Time between probes while a streak is under way that may change the active state
    /// (default: `interval`).
    pub fast_interval: Duration,
    /// Time between probes while DOWN with no passing probe (default: `interval`).
    pub down_interval: Duration,
    /// The probe request's method (default `GET`).
    pub method: String,
    /// Extra header fields of the probe request, in order (default none).
    pub headers: Vec<(String, String)>,
    /// The probe request's body (default none).
    pub body: Option<String>,
    /// What the answer must hold beyond an expected status (default nothing).
    pub content: ContentRules,
    /// The service a gRPC health check asks about (default empty: the server as a whole).
    pub grpc_service: String,
    /// What a `tcp` check sends and expects once connected (`send`, `send_hex`, `expect_text`,
    /// `expect_hex`); `None`
    /// (the default): the connect alone.
    pub tcp_exchange: Option<TcpExchange>,
}

/// A `tcp` check's exchange (HAProxy's `tcp-check send` / `send-binary` then `tcp-check
/// expect string` / `rbinary "^..."`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpExchange {
    /// Written once connected (after the PROXY protocol header of a pool that sends one);
    /// may be empty (nothing sent).
    pub send: Vec<u8>,
    /// What the answer must hold; `None`: the check passes once `send` is written.
    pub expect: Option<TcpExpect>,
}

/// What a `tcp` check's answer must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TcpExpect {
    /// `expect_text`: this text, anywhere in the answer's first [`MAX_TCP_ANSWER`] bytes.
    Text(String),
    /// `expect_hex`: these bytes, at the very start of the answer (a binary protocol's
    /// message type and length, say).
    Prefix(Vec<u8>),
}

/// The most bytes of a `tcp` check's answer read to find `expect_text`: 16 KiB.
pub const MAX_TCP_ANSWER: usize = 16 * 1024;

impl ActiveCheckConfig {
    /// Whether the probe is today's fixed `GET` whose status line alone is read.
    pub fn is_plain(&self) -> bool {
        self.method == "GET"
            && self.headers.is_empty()
            && self.body.is_none()
            && self.content.is_empty()
    }
}

/// The most bytes of a body rule's text (`body_contains`, `body_not_contains`) and of an
/// expected header's value text.
pub const MAX_MATCH_TEXT: usize = 256;
/// The default of `body_limit`: the first 16 KiB of a probe answer's body are matched.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;
/// The largest `body_limit`: 1 MiB.
pub const MAX_BODY_LIMIT: usize = 1024 * 1024;
/// The largest probe request body: 64 KiB.
pub const MAX_PROBE_BODY: usize = 64 * 1024;
/// The longest `grpc_service` name, in bytes.
pub const MAX_GRPC_SERVICE: usize = 512;
/// The most extra header fields of a probe request.
pub const MAX_PROBE_HEADERS: usize = 32;

/// What an HTTP probe's answer must hold beyond an expected status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentRules {
    /// Text the first `body_limit` bytes of the body must contain.
    pub body_contains: Option<String>,
    /// Text the first `body_limit` bytes of the body must not contain.
    pub body_not_contains: Option<String>,
    /// How much of the body is read and matched (default 16 KiB, at most 1 MiB).
    pub body_limit: usize,
    /// A header field the answer must carry (its name, lower case), and optionally a text one of
    /// its values must contain.
    pub header: Option<(String, Option<String>)>,
}

impl ContentRules {
    /// Whether no rule is configured.
    pub fn is_empty(&self) -> bool {
        !self.reads_body() && self.header.is_none()
    }

    /// Whether a body rule is configured (only then is the body read).
    pub fn reads_body(&self) -> bool {
        self.body_contains.is_some() || self.body_not_contains.is_some()
    }
}

/// Passive checks of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PassiveCheckConfig {
    /// Whether relayed traffic is judged at all (default true).
    pub enabled: bool,
    /// Consecutive traffic errors that eject a backend (default 3).
    pub consecutive_errors: NonZeroU32,
    /// Whether a 503 counts as an error (default true).
    pub count_503: bool,
    /// The first ejection's length; the n-th lasts n times this (default 30 s).
    pub ejection_time: Duration,
    /// The longest an ejection lasts (default 300 s).
    pub max_ejection_time: Duration,
    /// The most of the pool, in percent, held ejected at once (default 50; at least one backend).
    pub max_ejected_percent: u8,
    /// Whether an ejected backend whose probes bring its active side back from DOWN to UP goes
    /// on probation at once instead of sitting out the rest of its ejection (default true).
    pub probes_end_ejection: bool,
    /// The `grpc-status` codes that count as errors (default 2, 4, 13, 14: UNKNOWN,
    /// DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE).
    pub grpc_error_codes: GrpcCodes,
    /// The latency-outlier detector (`[pools.NAME.passive.latency_outliers]` with
    /// `enabled = true`), or `None`.
    pub latency_outliers: Option<LatencyOutliersConfig>,
    /// Load shedding awareness (`[pools.NAME.passive.load_shedding]` with `enabled = true`),
    /// or `None`.
    pub load_shedding: Option<LoadSheddingConfig>,
    /// The success-rate detector (`[pools.NAME.passive.success_rate]` with `enabled = true`),
    /// or `None`.
    pub success_rate: Option<SuccessRateConfig>,
}

/// The success-rate detector of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuccessRateConfig {
    /// How long one window lasts (default 10 s).
    pub window: Duration,
    /// Outcomes a backend must have within a window to be judged (default 100).
    pub min_requests: u32,
    /// Judged backends a window needs (default 5).
    pub min_backends: u32,
    /// Standard deviations below the mean that make an outlier, in thousandths (default 1900).
    pub stdev_factor_milli: u32,
}

/// Load shedding awareness of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSheddingConfig {
    /// The weight while shedding, in percent of the backend's weight (default 10).
    pub weight_percent: u8,
    /// The longest relief granted, whatever `Retry-After` asks (default 300 s).
    pub max_retry_after: Duration,
    /// The relief a `429` without a usable `Retry-After` gets (default 1 s).
    pub default_retry_after: Duration,
}

/// The latency-outlier detector of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyOutliersConfig {
    /// Which percentile is compared (default p99).
    pub percentile: Percentile,
    /// How many times the pool's median makes an outlier (default 3).
    pub factor: NonZeroU32,
    /// Consecutive outlying windows that eject (default 3).
    pub windows: NonZeroU32,
    /// How long one window lasts (default 10 s).
    pub window: Duration,
    /// Requests a backend must relay within a window to be judged (default 20).
    pub min_requests: u32,
    /// A latency below this is never an outlier (default 5 ms).
    pub min_latency: Duration,
}
