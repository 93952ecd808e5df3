//! Why a request to an etcd endpoint's gateway failed ([`EtcdError`]): each step's own
//! variant, holding the error under it, displayed in the sentences operators have always read
//! (the source's events and logs, `/status`). Never the password nor the token.

use std::net::SocketAddr;
use std::time::Duration;

use capataz_upstream::oneshot;

/// Why a call, or the opening or reading of a watch, failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The endpoint's host name did not resolve.
    #[error("cannot resolve {url}: {source}")]
    Resolve {
        /// The endpoint.
        url: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The host name resolved to no address.
    #[error("{url} has no address")]
    NoAddress {
        /// The endpoint.
        url: String,
    },
    /// The TCP connection to the last address tried failed.
    #[error("cannot connect to {url} ({address}): {}", inner(.source))]
    Connect {
        /// The endpoint.
        url: String,
        /// The address tried last.
        address: SocketAddr,
        /// The client's error.
        source: oneshot::Error,
    },
    /// The source's TLS client configuration was not built when the config was loaded.
    #[error("{url}: the TLS files were not loaded")]
    TlsNotLoaded {
        /// The endpoint.
        url: String,
    },
    /// The name to verify is not one TLS can verify.
    #[error("{url}: {name:?} is not a name TLS can verify")]
    ServerName {
        /// The endpoint.
        url: String,
        /// The name.
        name: String,
        /// Why not.
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// The TLS handshake failed.
    #[error(
        "{url}: the TLS handshake with {address} failed: {} (check the source's tls.ca_file, \
         tls.server_name, and tls.cert and tls.key when etcd asks for a client certificate)",
        inner(.source)
    )]
    Tls {
        /// The endpoint.
        url: String,
        /// The address connected to.
        address: SocketAddr,
        /// The client's error.
        source: oneshot::Error,
    },
    /// The connection (resolution, TCP, TLS, HTTP/1.1) was not made in time.
    #[error("connecting to {url} timed out")]
    ConnectTimeout {
        /// The endpoint.
        url: String,
    },
    /// hyper refused to start HTTP/1.1 on the connection.
    #[error("{url}: {}", chain(.source))]
    Handshake {
        /// The endpoint.
        url: String,
        /// The client's error.
        source: oneshot::Error,
    },
    /// The request could not be built.
    #[error("building a request to {url}{path} failed")]
    Request {
        /// The endpoint.
        url: String,
        /// The path asked.
        path: String,
        /// Why.
        source: hyper::http::Error,
    },
    /// The request was not sent, or its answer's head not read.
    #[error("{url}{path}: {}{hint}", chain(.source))]
    Send {
        /// The endpoint.
        url: String,
        /// The path asked.
        path: String,
        /// What etcd may want, when the error suggests it (empty otherwise).
        hint: &'static str,
        /// The client's error.
        source: oneshot::Error,
    },
    /// etcd answered with a status other than 200.
    #[error("{url}{path} answered {status}: {message}{hint}")]
    Refused {
        /// The endpoint.
        url: String,
        /// The path asked.
        path: String,
        /// The status.
        status: hyper::StatusCode,
        /// etcd's message (bounded).
        message: String,
        /// What to configure, when the refusal suggests it (empty otherwise).
        hint: &'static str,
    },
    /// Authenticating failed.
    #[error("authenticating as {username:?}: {source}")]
    Authenticate {
        /// The user name.
        username: String,
        /// etcd's refusal.
        source: Box<EtcdError>,
    },
    /// The authentication's answer holds no token that can be sent back in a header.
    #[error("{url}{path}: the answer holds no token that can be sent back")]
    NoToken {
        /// The endpoint.
        url: String,
        /// The path asked.
        path: String,
    },
    /// The answer's body could not be read whole (too long, broken).
    #[error("reading {url}{path}: {source}")]
    Read {
        /// The endpoint.
        url: String,
        /// The path asked.
        path: String,
        /// The client's error.
        source: oneshot::Error,
    },
    /// A call was not done by its deadline.
    #[error("{url}{path} timed out after {deadline:?}")]
    CallTimeout {
        /// The endpoint.
        url: String,
        /// The path asked.
        path: String,
        /// The deadline.
        deadline: Duration,
    },
    /// A watch was not open by its deadline.
    #[error("opening a watch on {url} timed out")]
    WatchTimeout {
        /// The endpoint.
        url: String,
    },
    /// The first line of a watch, read to see whether etcd refused its token, failed.
    #[error("{url}: {source}")]
    FirstLine {
        /// The endpoint.
        url: String,
        /// Why.
        source: Box<EtcdError>,
    },
    /// A watch's line is longer than the limit.
    #[error("the watch sent a line longer than {0} bytes")]
    LineTooLong(usize),
    /// A watch's stream ended.
    #[error("the watch stream ended")]
    StreamEnded,
    /// A watch's stream failed.
    #[error("the watch stream failed: {0}")]
    StreamFailed(#[source] hyper::Error),
}

/// For the callers whose own errors are still sentences (the etcd source's watch, the fleet).
impl From<EtcdError> for String {
    fn from(error: EtcdError) -> String {
        error.to_string()
    }
}

/// The error under a step's own words (the IO error of connecting or of TLS), as one line.
fn inner(error: &oneshot::Error) -> String {
    match error {
        oneshot::Error::Connect(e) => e.to_string(),
        oneshot::Error::Tls(e) => chain(e),
        other => chain(other),
    }
}

/// An error and its sources, as one line (a TLS alert inside a hyper error, for one).
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io::ErrorKind;

    use super::*;

    #[test]
    fn the_errors_keep_their_source_and_say_what_they_always_said() {
        let url = || String::from("https://etcd.test:2379");
        let address: SocketAddr = "127.0.0.1:2379".parse().expect("an address");
        let connect = EtcdError::Connect {
            url: url(),
            address,
            source: oneshot::Error::Connect(ErrorKind::ConnectionRefused.into()),
        };
        let refused = std::io::Error::from(ErrorKind::ConnectionRefused);
        assert_eq!(
            connect.to_string(),
            format!("cannot connect to https://etcd.test:2379 (127.0.0.1:2379): {refused}")
        );
        assert!(connect.source().is_some(), "{connect:?}");

        let tls = EtcdError::Tls {
            url: url(),
            address,
            source: oneshot::Error::Tls(std::io::Error::other("invalid peer certificate")),
        };
        assert_eq!(
            tls.to_string(),
            "https://etcd.test:2379: the TLS handshake with 127.0.0.1:2379 failed: invalid peer \
             certificate (check the source's tls.ca_file, tls.server_name, and tls.cert and \
             tls.key when etcd asks for a client certificate)"
        );
        assert!(tls.source().is_some(), "{tls:?}");

        let authenticate = EtcdError::Authenticate {
            username: "capataz".into(),
            source: Box::new(EtcdError::Refused {
                url: url(),
                path: "/v3/auth/authenticate".into(),
                status: hyper::StatusCode::BAD_REQUEST,
                message: "etcdserver: authentication failed".into(),
                hint: "",
            }),
        };
        let refusal = "https://etcd.test:2379/v3/auth/authenticate answered 400 Bad Request: \
                       etcdserver: authentication failed";
        assert_eq!(
            authenticate.to_string(),
            format!("authenticating as \"capataz\": {refusal}")
        );
        let source = authenticate.source().expect("the refusal");
        assert_eq!(source.to_string(), refusal);

        let late = EtcdError::CallTimeout {
            url: url(),
            path: "/v3/kv/range".into(),
            deadline: Duration::from_millis(1500),
        };
        assert_eq!(
            late.to_string(),
            "https://etcd.test:2379/v3/kv/range timed out after 1.5s"
        );
        assert_eq!(
            EtcdError::LineTooLong(32 << 20).to_string(),
            "the watch sent a line longer than 33554432 bytes"
        );
        assert_eq!(
            String::from(EtcdError::StreamEnded),
            "the watch stream ended"
        );
    }
}
