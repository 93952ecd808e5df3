//! How capataz reaches an etcd cluster: TLS (`https://` endpoints, `[pools.NAME.source.tls]`)
//! and authentication (`username` with `password` or `password_file`).
//!
//! One [`EtcdAccess`] per source, shared (in an `Arc`) by its endpoints, so that every call made
//! with an [`EtcdEndpoint`](super::EtcdEndpoint) gets the same TLS and the same token. The TLS
//! material is loaded in stage three (off the runtime threads, at start, in `capataz check` and
//! on every reload, which builds a new access: new certificates take effect with the
//! connections made after the reload). The token is runtime state riding on the config: each
//! build starts without one and authenticates on its first call.
//!
//! Neither the password nor a token is ever printed: [`EtcdAuth`]'s `Debug` leaves them out.

use std::sync::Arc;

use rustls::ClientConfig;

/// TLS and credentials for the endpoints of one etcd source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// TLS, for `https://` endpoints (`None`: plain HTTP).
    pub tls: Option<EtcdTls>,
    /// The user to authenticate as (`None`: no authentication).
    pub auth: Option<EtcdAuth>,
}

/// TLS to etcd: verification always on, against `ca_file` (or the system's roots).
#[derive(Clone)]
pub struct EtcdTls {
    /// The PEM bundle of CA certificates etcd's certificate is verified with (etcdctl's
    /// `--cacert`); `None`: the system's roots. Relative paths already joined to the config
    /// file's directory.
    pub ca_file: Option<String>,
    /// A client certificate chain presented to etcd (etcd's `--client-cert-auth`), with `key`.
    pub cert: Option<String>,
    /// The PEM private key of `cert`.
    pub key: Option<String>,
    /// The name verified in etcd's certificate and sent as SNI; `None`: each endpoint's host
    /// (an IP address is verified as one, without SNI).
    pub server_name: Option<String>,
    /// The rustls configuration built from the files (`None` in an
    /// [`Unresolved`](super::Unresolved) config, before they are read).
    pub client: Option<Arc<ClientConfig>>,
}

impl PartialEq for EtcdTls {
    fn eq(&self, other: &EtcdTls) -> bool {
        self.ca_file == other.ca_file
            && self.cert == other.cert
            && self.key == other.key
            && self.server_name == other.server_name
    }
}

impl Eq for EtcdTls {}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_file", &self.ca_file)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("server_name", &self.server_name)
            .field("loaded", &self.client.is_some())
            .finish()
    }
}

/// A user of etcd's authentication (`/v3/auth/authenticate`), and the token it was given.
#[derive(Clone)]
pub struct EtcdAuth {
    /// The user name.
    pub username: String,
    /// The password (from `password`, or read from `password_file` in stage three).
    pub password: String,
    /// The token in use, shared by every call made with this access.
    pub session: Arc<EtcdSession>,
}

impl PartialEq for EtcdAuth {
    fn eq(&self, other: &EtcdAuth) -> bool {
        self.username == other.username && self.password == other.password
    }
}

impl Eq for EtcdAuth {}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// What etcd said to the last authentication: held while one call authenticates, so calls
/// running at once authenticate once.
#[derive(Default)]
pub struct EtcdSession {
    /// The token calls carry, and the lock one authentication holds.
    pub token: tokio::sync::Mutex<EtcdToken>,
}

impl std::fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSession").finish_non_exhaustive()
    }
}

/// The token calls carry.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum EtcdToken {
    /// Not authenticated yet (or the last token was rejected).
    #[default]
    None,
    /// The token etcd gave, sent as the `Authorization` header.
    Token(String),
    /// etcd answered that its authentication is off: calls carry no token (as etcd's own
    /// client does) until one is refused for the want of it.
    AuthOff,
}
