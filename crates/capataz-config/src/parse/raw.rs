//! Stage one: the file as written, for serde.
//!
//! Every key is optional here (required keys are checked in stage two, which can point at the
//! table that lacks one), unknown keys are rejected, and each value that still needs checking
//! keeps its byte span. Tables are never wrapped in `Spanned`: toml 0.8 cannot give a span to a
//! table that is only implied by a dotted key (`active.rise = 2`) and fails to deserialize it.
//! Array elements (listeners, routes, backends, alert hooks) always have one, so they are
//! spanned. Tables and enums are read through `shapes`, so that serde's messages about them
//! say "a table" and `one of "a", "b"` rather than Rust's names for them.

mod shapes;

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::{Spanned, Value};

use shapes::{choice, tables, Table as _};

tables!(
    RawConfig,
    RawFleet,
    RawServer,
    RawLog,
    RawAdmin,
    RawListener,
    RawAccessLog,
    RawTls,
    RawAcme,
    RawAcmeDns01,
    RawCertificate,
    RawHttp2,
    RawProxyProtocol,
    RawErrorPage,
    RawRateLimit,
    RawRoute,
    RawSniRoute,
    RawValueMatch,
    RawRegexRewrite,
    RawRedirect,
    RawHsts,
    RawHttp3,
    RawRequestId,
    RawHeaderRules,
    RawPool,
    RawSource,
    RawTlsTable,
    RawAgent,
    RawSticky,
    RawBackend,
    RawActive,
    RawPassive,
    RawSuccessRate,
    RawLoadShedding,
    RawLatencyOutliers,
    RawRetries,
    RawTimeouts,
    RawAlerts,
    RawWebhook,
    RawCommand,
);

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) log: RawLog,
    pub(super) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(super) listeners: Vec<Spanned<RawListener>>,
    #[serde(default)]
    pub(super) pools: BTreeMap<Spanned<String>, RawPool>,
    #[serde(default)]
    pub(super) alerts: RawAlerts,
    #[serde(default)]
    pub(super) server: RawServer,
    pub(super) fleet: Option<Spanned<RawFleet>>,
}

/// `[fleet]`: shared probing with other instances through etcd.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawFleet {
    pub(super) endpoints: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) prefix: Option<Spanned<String>>,
    pub(super) group: Option<Spanned<String>>,
    pub(super) owners: Option<Spanned<i64>>,
    pub(super) lease_ttl: Option<Spanned<Value>>,
    pub(super) instance: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<Value>>,
    pub(super) tls: Option<Spanned<RawTlsTable>>,
    pub(super) username: Option<Spanned<String>>,
    pub(super) password: Option<Spanned<String>>,
    pub(super) password_file: Option<Spanned<String>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawServer {
    pub(super) shutdown_timeout: Option<Spanned<Value>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawLog {
    pub(super) format: Option<RawLogFormat>,
    pub(super) level: Option<Spanned<String>>,
}

choice! {
    RawLogFormat {
        Text = "text",
        Json = "json",
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawAdmin {
    pub(super) address: Option<Spanned<String>>,
    pub(super) token: Option<Spanned<String>>,
    pub(super) token_file: Option<Spanned<String>>,
    pub(super) open_read_only: Option<bool>,
    pub(super) metrics_backend_histograms: Option<bool>,
    pub(super) allowed_hosts: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawListener {
    pub(super) name: Option<Spanned<String>>,
    pub(super) address: Option<Spanned<String>>,
    pub(super) idle_timeout: Option<Spanned<Value>>,
    pub(super) header_read_timeout: Option<Spanned<Value>>,
    pub(super) request_body_timeout: Option<Spanned<Value>>,
    pub(super) max_header_bytes: Option<Spanned<i64>>,
    pub(super) forwarded_headers: Option<bool>,
    pub(super) h2c: Option<bool>,
    #[serde(default)]
    pub(super) http2: RawHttp2,
    pub(super) proxy_protocol: Option<Spanned<RawProxyProtocol>>,
    #[serde(default)]
    pub(super) routes: Vec<Spanned<RawRoute>>,
    pub(super) tls: Option<RawTls>,
    pub(super) access_log: Option<Spanned<RawAccessLog>>,
    pub(super) https_redirect: Option<Spanned<bool>>,
    pub(super) https_redirect_port: Option<Spanned<i64>>,
    pub(super) forwarded: Option<RawForwarded>,
    pub(super) request_id: Option<Spanned<RawRequestId>>,
    pub(super) request_headers: Option<RawHeaderRules>,
    pub(super) response_headers: Option<RawHeaderRules>,
    pub(super) error_pages: Option<BTreeMap<Spanned<String>, RawErrorPage>>,
    pub(super) mode: Option<Spanned<RawMode>>,
    pub(super) pool: Option<Spanned<String>>,
    pub(super) session_timeout: Option<Spanned<Value>>,
    #[serde(default)]
    pub(super) sni_routes: Vec<Spanned<RawSniRoute>>,
    pub(super) inspect_timeout: Option<Spanned<Value>>,
    pub(super) socket_mode: Option<Spanned<String>>,
    pub(super) max_connections: Option<Spanned<i64>>,
}

/// One `[[listeners.sni_routes]]` of a tcp listener: TLS passthrough by the ClientHello's SNI.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawSniRoute {
    pub(super) server_names: Option<Vec<Spanned<String>>>,
    pub(super) pool: Option<Spanned<String>>,
}

/// One status's page in `[listeners.error_pages]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawErrorPage {
    pub(super) file: Option<Spanned<String>>,
    pub(super) body: Option<Spanned<String>>,
    pub(super) content_type: Option<Spanned<String>>,
}

choice! {
    RawMode {
        Http = "http",
        Tcp = "tcp",
    }
}

choice! {
    RawForwarded {
        XForwarded = "x-forwarded",
        Rfc7239 = "rfc7239",
        Both = "both",
        None = "none",
    }
}

/// A listener's `request_id`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawRequestId {
    pub(super) header: Option<Spanned<String>>,
    pub(super) keep_incoming: Option<bool>,
    pub(super) response: Option<bool>,
}

/// `request_headers` or `response_headers`, on a listener or a route.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawHeaderRules {
    pub(super) remove: Option<Vec<Spanned<String>>>,
    pub(super) set: Option<BTreeMap<Spanned<String>, Spanned<String>>>,
    pub(super) add: Option<BTreeMap<Spanned<String>, Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawAccessLog {
    pub(super) path: Option<Spanned<String>>,
    pub(super) format: Option<Spanned<String>>,
    pub(super) buffer: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawTls {
    pub(super) certificates: Option<Vec<Spanned<RawCertificate>>>,
    pub(super) min_version: Option<Spanned<Value>>,
    pub(super) alpn: Option<Vec<Spanned<String>>>,
    pub(super) client_ca: Option<Spanned<String>>,
    pub(super) client_auth: Option<Spanned<String>>,
    pub(super) ocsp_fetch: Option<bool>,
    pub(super) acme: Option<Spanned<RawAcme>>,
    pub(super) hsts: Option<Spanned<RawHsts>>,
    pub(super) http3: Option<RawHttp3>,
    pub(super) session_tickets: Option<Spanned<bool>>,
    pub(super) session_ticket_lifetime: Option<Spanned<Value>>,
}

/// `[listeners.tls.http3]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawHttp3 {
    pub(super) port: Option<Spanned<i64>>,
    pub(super) max_streams: Option<Spanned<i64>>,
    pub(super) alt_svc_max_age: Option<Spanned<Value>>,
    pub(super) retry_threshold: Option<Spanned<i64>>,
}

/// `[listeners.tls]`'s `hsts`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawHsts {
    pub(super) max_age: Option<Spanned<Value>>,
    pub(super) include_subdomains: Option<bool>,
    pub(super) preload: Option<bool>,
}

/// `[listeners.tls.acme]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawAcme {
    pub(super) directory: Option<Spanned<String>>,
    pub(super) domains: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) email: Option<Spanned<String>>,
    pub(super) storage: Option<Spanned<String>>,
    pub(super) challenge: Option<Spanned<String>>,
    pub(super) renew_before: Option<Spanned<Value>>,
    pub(super) ca_file: Option<Spanned<String>>,
    pub(super) dns01: Option<RawAcmeDns01>,
}

/// `[listeners.tls.acme.dns01]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawAcmeDns01 {
    pub(super) server: Option<Spanned<String>>,
    pub(super) zone: Option<Spanned<String>>,
    pub(super) tsig_key: Option<Spanned<String>>,
    pub(super) tsig_algorithm: Option<Spanned<String>>,
    pub(super) tsig_secret_file: Option<Spanned<String>>,
    pub(super) ttl: Option<Spanned<Value>>,
    pub(super) propagation_timeout: Option<Spanned<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawCertificate {
    pub(super) cert: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
    pub(super) default: Option<bool>,
    pub(super) ocsp_response: Option<Spanned<String>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawHttp2 {
    pub(super) max_concurrent_streams: Option<Spanned<i64>>,
    pub(super) max_backend_connections: Option<Spanned<i64>>,
    pub(super) initial_stream_window_size: Option<Spanned<i64>>,
    pub(super) initial_connection_window_size: Option<Spanned<i64>>,
    pub(super) max_frame_size: Option<Spanned<i64>>,
    pub(super) keepalive_interval: Option<Spanned<Value>>,
    pub(super) keepalive_timeout: Option<Spanned<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawProxyProtocol {
    pub(super) trusted: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawRoute {
    pub(super) host: Option<Spanned<String>>,
    pub(super) path_prefix: Option<Spanned<String>>,
    pub(super) pool: Option<Spanned<String>>,
    pub(super) name: Option<Spanned<String>>,
    pub(super) methods: Option<Vec<Spanned<String>>>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) path_regex: Option<Spanned<String>>,
    pub(super) headers: Option<Vec<Spanned<RawValueMatch>>>,
    pub(super) query: Option<Vec<Spanned<RawValueMatch>>>,
    pub(super) request_headers: Option<RawHeaderRules>,
    pub(super) response_headers: Option<RawHeaderRules>,
    pub(super) strip_prefix: Option<Spanned<bool>>,
    pub(super) replace_prefix: Option<Spanned<String>>,
    pub(super) regex_rewrite: Option<Spanned<RawRegexRewrite>>,
    pub(super) redirect: Option<Spanned<RawRedirect>>,
    pub(super) rate_limit: Option<RawRateLimit>,
}

/// A route's `rate_limit` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawRateLimit {
    pub(super) key: Option<Spanned<String>>,
    pub(super) rate: Option<Spanned<i64>>,
    pub(super) per: Option<Spanned<Value>>,
    pub(super) burst: Option<Spanned<i64>>,
    pub(super) max_keys: Option<Spanned<i64>>,
}

/// A route's `redirect`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawRedirect {
    pub(super) status: Option<Spanned<i64>>,
    pub(super) scheme: Option<Spanned<String>>,
    pub(super) host: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<i64>>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) prefix: Option<Spanned<String>>,
    pub(super) strip_query: Option<bool>,
}

/// A route's `regex_rewrite`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawRegexRewrite {
    pub(super) pattern: Option<Spanned<String>>,
    pub(super) substitution: Option<Spanned<String>>,
}

/// A route's `headers` or `query` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawValueMatch {
    pub(super) name: Option<Spanned<String>>,
    pub(super) value: Option<Spanned<String>>,
    pub(super) value_regex: Option<Spanned<String>>,
    pub(super) present: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawPool {
    pub(super) backends: Option<Vec<Spanned<RawBackend>>>,
    pub(super) algorithm: Option<RawAlgorithm>,
    pub(super) when_all_down: Option<RawAllDown>,
    pub(super) retry_after: Option<Spanned<Value>>,
    #[serde(default)]
    pub(super) active: RawActive,
    #[serde(default)]
    pub(super) passive: RawPassive,
    #[serde(default)]
    pub(super) retries: RawRetries,
    #[serde(default)]
    pub(super) timeouts: RawTimeouts,
    pub(super) slow_start: Option<Spanned<Value>>,
    pub(super) gate_new_backends: Option<bool>,
    pub(super) connection_reuse: Option<RawReuse>,
    pub(super) send_proxy_protocol: Option<RawProxyVersion>,
    pub(super) backups: Option<RawBackupUse>,
    pub(super) min_healthy: Option<Spanned<i64>>,
    pub(super) min_healthy_percent: Option<Spanned<i64>>,
    pub(super) close_tunnels_on_down: Option<bool>,
    pub(super) protocol: Option<RawProtocol>,
    pub(super) tls: Option<RawBackendTls>,
    pub(super) agent: Option<RawAgent>,
    pub(super) source: Option<Spanned<RawSource>>,
    pub(super) max_connections: Option<Spanned<i64>>,
    pub(super) max_requests: Option<Spanned<i64>>,
    pub(super) queue_size: Option<Spanned<i64>>,
    pub(super) queue_timeout: Option<Spanned<Value>>,
    pub(super) hash_key: Option<Spanned<String>>,
    pub(super) hash_balance_factor: Option<Spanned<i64>>,
    pub(super) sticky: Option<RawSticky>,
}

/// `[pools.NAME.sticky]`: sticky sessions by cookie.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawSticky {
    pub(super) cookie: Option<Spanned<String>>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) max_age: Option<Spanned<Value>>,
    pub(super) secure: Option<bool>,
    pub(super) httponly: Option<bool>,
    pub(super) samesite: Option<RawSameSite>,
    pub(super) on_drain: Option<RawOnDrain>,
}

choice! {
    RawSameSite {
        Lax = "lax",
        Strict = "strict",
        None = "none",
    }
}

choice! {
    RawOnDrain {
        Keep = "keep",
        Move = "move",
    }
}

/// `[pools.NAME.source]`: where the pool's backends come from.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawSource {
    pub(super) kind: Option<Spanned<String>>,
    pub(super) name: Option<Spanned<String>>,
    pub(super) record: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<i64>>,
    pub(super) resolver: Option<Spanned<String>>,
    pub(super) ttl_min: Option<Spanned<Value>>,
    pub(super) ttl_max: Option<Spanned<Value>>,
    pub(super) timeout: Option<Spanned<Value>>,
    pub(super) max_drop_percent: Option<Spanned<i64>>,
    pub(super) endpoints: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) prefix: Option<Spanned<String>>,
    pub(super) reconnect_min: Option<Spanned<Value>>,
    pub(super) reconnect_max: Option<Spanned<Value>>,
    pub(super) keepalive: Option<Spanned<Value>>,
    pub(super) confirm_after: Option<Spanned<Value>>,
    pub(super) tls: Option<Spanned<RawTlsTable>>,
    pub(super) username: Option<Spanned<String>>,
    pub(super) password: Option<Spanned<String>>,
    pub(super) password_file: Option<Spanned<String>>,
}

choice! {
    RawBackupUse {
        First = "first",
        All = "all",
    }
}

choice! {
    RawProtocol {
        Http1 = "http1",
        H2 = "h2",
        H2c = "h2c",
        Tcp = "tcp",
    }
}

/// `tls = true | false`, or a `[pools.NAME.tls]` table (which turns TLS on).
pub(super) enum RawBackendTls {
    Flag(bool),
    Table(RawTlsTable),
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawTlsTable {
    pub(super) ca_file: Option<Spanned<String>>,
    pub(super) server_name: Option<Spanned<String>>,
    pub(super) verify: Option<Spanned<bool>>,
    pub(super) cert: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawBackendTls {
    /// A boolean or a table. The table is read by the derived code through serde's
    /// `MapAccessDeserializer`, so its values still come from the TOML deserializer and keep
    /// their spans, and unknown keys are still refused.
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<RawBackendTls, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawBackendTls;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false, or a table of TLS settings")
            }

            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<RawBackendTls, E> {
                Ok(RawBackendTls::Flag(on))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawBackendTls, A::Error> {
                RawTlsTable::from_map(map).map(RawBackendTls::Table)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawAgent {
    pub(super) port: Option<Spanned<i64>>,
    pub(super) interval: Option<Spanned<Value>>,
    pub(super) timeout: Option<Spanned<Value>>,
}

choice! {
    RawProxyVersion {
        V1 = "v1",
        V2 = "v2",
    }
}

choice! {
    RawReuse {
        Private = "private",
        Shared = "shared",
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawBackend {
    pub(super) name: Option<Spanned<String>>,
    pub(super) address: Option<Spanned<String>>,
    pub(super) weight: Option<Spanned<i64>>,
    pub(super) backup: Option<bool>,
    pub(super) agent_port: Option<Spanned<i64>>,
    pub(super) track: Option<Spanned<String>>,
    pub(super) max_connections: Option<Spanned<i64>>,
    pub(super) max_requests: Option<Spanned<i64>>,
}

choice! {
    RawAlgorithm {
        RoundRobin = "round_robin",
        LeastRequest = "least_request",
        Hash = "hash",
        PeakEwma = "peak_ewma",
    }
}

choice! {
    RawAllDown {
        FailOpen = "fail_open",
        Reject = "reject",
    }
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawActive {
    pub(super) kind: Option<RawCheckKind>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) host: Option<Spanned<String>>,
    pub(super) expect: Option<Spanned<String>>,
    pub(super) interval: Option<Spanned<Value>>,
    pub(super) timeout: Option<Spanned<Value>>,
    pub(super) rise: Option<Spanned<i64>>,
    pub(super) fall: Option<Spanned<i64>>,
    pub(super) jitter: Option<Spanned<Value>>,
    pub(super) initial: Option<RawInitial>,
    pub(super) disable_on_404: Option<bool>,
    pub(super) rise_after_maintenance: Option<Spanned<i64>>,
    pub(super) fast_interval: Option<Spanned<Value>>,
    pub(super) down_interval: Option<Spanned<Value>>,
    pub(super) method: Option<Spanned<String>>,
    pub(super) headers: Option<BTreeMap<String, Spanned<String>>>,
    pub(super) body: Option<Spanned<String>>,
    pub(super) body_contains: Option<Spanned<String>>,
    pub(super) body_not_contains: Option<Spanned<String>>,
    pub(super) body_limit: Option<Spanned<i64>>,
    pub(super) expect_header: Option<Spanned<String>>,
    pub(super) expect_header_contains: Option<Spanned<String>>,
    pub(super) grpc_service: Option<Spanned<String>>,
    pub(super) send: Option<Spanned<String>>,
    pub(super) expect_text: Option<Spanned<String>>,
    pub(super) send_hex: Option<Spanned<String>>,
    pub(super) expect_hex: Option<Spanned<String>>,
}

choice! {
    RawCheckKind {
        Http = "http",
        Tcp = "tcp",
        Grpc = "grpc",
        None = "none",
    }
}

choice! {
    RawInitial {
        Up = "up",
        Down = "down",
        FirstProbe = "first-probe" | "first_probe",
    }
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawPassive {
    pub(super) enabled: Option<bool>,
    pub(super) consecutive_errors: Option<Spanned<i64>>,
    pub(super) count_503: Option<bool>,
    pub(super) ejection_time: Option<Spanned<Value>>,
    pub(super) max_ejection_time: Option<Spanned<Value>>,
    pub(super) max_ejected_percent: Option<Spanned<i64>>,
    pub(super) probes_end_ejection: Option<bool>,
    pub(super) grpc_error_codes: Option<Spanned<Vec<Spanned<i64>>>>,
    pub(super) latency_outliers: Option<RawLatencyOutliers>,
    pub(super) load_shedding: Option<RawLoadShedding>,
    pub(super) success_rate: Option<RawSuccessRate>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawSuccessRate {
    pub(super) enabled: Option<bool>,
    pub(super) window: Option<Spanned<Value>>,
    pub(super) min_requests: Option<Spanned<i64>>,
    pub(super) min_backends: Option<Spanned<i64>>,
    pub(super) stdev_factor: Option<Spanned<Value>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawLoadShedding {
    pub(super) enabled: Option<bool>,
    pub(super) weight_percent: Option<Spanned<i64>>,
    pub(super) max_retry_after: Option<Spanned<Value>>,
    pub(super) default_retry_after: Option<Spanned<Value>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawLatencyOutliers {
    pub(super) enabled: Option<bool>,
    pub(super) percentile: Option<Spanned<String>>,
    pub(super) factor: Option<Spanned<i64>>,
    pub(super) windows: Option<Spanned<i64>>,
    pub(super) window: Option<Spanned<Value>>,
    pub(super) min_requests: Option<Spanned<i64>>,
    pub(super) min_latency: Option<Spanned<Value>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawRetries {
    pub(super) attempts: Option<Spanned<i64>>,
    pub(super) budget_percent: Option<Spanned<i64>>,
    pub(super) min_budget: Option<Spanned<i64>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawTimeouts {
    pub(super) connect: Option<Spanned<Value>>,
    pub(super) response_header: Option<Spanned<Value>>,
    pub(super) body_idle: Option<Spanned<Value>>,
    pub(super) idle: Option<Spanned<Value>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawAlerts {
    pub(super) debounce: Option<Spanned<Value>>,
    #[serde(default)]
    pub(super) webhooks: Vec<Spanned<RawWebhook>>,
    #[serde(default)]
    pub(super) commands: Vec<Spanned<RawCommand>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawWebhook {
    pub(super) url: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<Value>>,
    pub(super) retries: Option<Spanned<i64>>,
    pub(super) backoff: Option<Spanned<Value>>,
    pub(super) queue: Option<Spanned<i64>>,
}

/// `command` stays a [`Value`] so that a plain string (a shell line) gets a message that says
/// to write an array, rather than serde's "expected a sequence".
#[derive(Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub(super) struct RawCommand {
    pub(super) command: Option<Spanned<Value>>,
    pub(super) timeout: Option<Spanned<Value>>,
    pub(super) queue: Option<Spanned<i64>>,
}
