//! The `admin_query` target: any UTF-8 text as the query string of an override
//! (`POST /backends/<pool>/<backend>/down?<text>`, through `capataz::admin::parse_ttl`) and as a
//! duration (`capataz::config::parse_duration`, used by the config, the command line and the
//! admin API).
//!
//! Neither may panic, and neither may return more than `capataz::config::MAX_DURATION`: a TTL
//! or a config value above it is what overflowed a clock reading and crashed the process.

use capataz::config::MAX_DURATION;

/// Checks one input; panics on the first violation.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(Some(ttl)) = capataz::admin::parse_ttl(Some(text)) {
        assert!(ttl <= MAX_DURATION, "{text:?} gave a TTL of {ttl:?}");
    }
    match capataz::config::parse_duration(text) {
        Ok(duration) => assert!(duration <= MAX_DURATION, "{text:?} gave {duration:?}"),
        Err(message) => assert!(!message.to_string().is_empty()),
    }
}
