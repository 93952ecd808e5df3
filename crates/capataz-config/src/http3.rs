//! A TLS listener's HTTP/3 (`[listeners.tls.http3]`): QUIC on a UDP port beside its TCP one,
//! on the same certificates, and the `Alt-Svc` field that tells HTTP/1.1 and HTTP/2 clients.

use std::time::Duration;

use http::HeaderValue;

/// `[listeners.tls.http3]`: HTTP/3 served on `port` (UDP). Off when the table is absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Http3Config {
    /// `port`: the UDP port; `None` (default): the listener's TCP port.
    pub port: Option<u16>,
    /// `max_streams`: request streams a client may have open at once on one connection
    /// (default 100).
    pub max_streams: u32,
    /// `alt_svc_max_age`: how long a client may remember the `Alt-Svc` advertisement (default
    /// 24 hours).
    pub alt_svc_max_age: Duration,
    /// `retry_threshold`: handshakes in progress from which on a new client's address is
    /// checked by a Retry first (default 100; 0: every new client).
    pub retry_threshold: u32,
}

impl Http3Config {
    /// The defaults of every key (the table written empty).
    pub const DEFAULT: Http3Config = Http3Config {
        port: None,
        max_streams: 100,
        alt_svc_max_age: Duration::from_secs(24 * 3600),
        retry_threshold: 100,
    };

    /// The UDP port HTTP/3 is served on, for a listener whose TCP port is `tcp_port`.
    pub fn udp_port(&self, tcp_port: u16) -> u16 {
        self.port.unwrap_or(tcp_port)
    }

    /// The `Alt-Svc` field the listener's HTTP/1.1 and HTTP/2 answers carry (RFC 7838):
    /// `h3=":PORT"; ma=SECONDS`.
    pub fn alt_svc(&self, tcp_port: u16) -> HeaderValue {
        let text = format!(
            "h3=\":{}\"; ma={}",
            self.udp_port(tcp_port),
            self.alt_svc_max_age.as_secs()
        );
        // Digits and fixed characters: always a valid value.
        HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static("clear"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_svc_names_the_udp_port_and_the_max_age() {
        let mut config = Http3Config::DEFAULT;
        assert_eq!(config.alt_svc(8443), "h3=\":8443\"; ma=86400");
        config.port = Some(9443);
        config.alt_svc_max_age = Duration::from_secs(60);
        assert_eq!(config.alt_svc(8443), "h3=\":9443\"; ma=60");
    }
}
