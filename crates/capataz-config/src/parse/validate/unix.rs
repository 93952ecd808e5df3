//! Unix socket backends (`address = "unix:/run/app.sock"`): the path checked where it is
//! written, and what a pool with one cannot do: TLS to it (refused; a local socket needs
//! none) and agent checks (an agent answers on a TCP port of the backend's host, and a
//! socket has no host). A listener on a Unix socket is refused with its own sentence.

use toml::Spanned;

use super::{ConfigError, Validator};
use crate::{unix_path_problem, BackendConfig, UNIX_PREFIX};

impl Validator<'_> {
    /// Checks a `unix:` backend address's path (`address` holds the whole text); HAProxy's
    /// `/path` and `unix@/path` are pointed to the `unix:` spelling.
    pub(super) fn unix_backend(
        &self,
        address: &Spanned<String>,
        key: &str,
    ) -> Result<(), ConfigError> {
        let text = address.get_ref();
        let Some(path) = text.strip_prefix(UNIX_PREFIX) else {
            // HAProxy's spellings, `/path` and `unix@/path`.
            let path = text.strip_prefix("unix@").unwrap_or(text);
            return Err(self.error(
                Some(address.span()),
                key,
                format!("{text:?} looks like a Unix socket path (write it unix:{path})"),
            ));
        };
        match unix_path_problem(path) {
            None => Ok(()),
            Some(why) => Err(self.error(
                Some(address.span()),
                key,
                format!("the socket path {path:?} {why}"),
            )),
        }
    }

    /// Refuses a listener `address` that names a Unix socket (`unix:/path`, or HAProxy's
    /// `/path`): capataz listens on TCP only, and says so rather than "not an address".
    pub(super) fn unix_listener(
        &self,
        address: &Spanned<String>,
        key: &str,
    ) -> Result<(), ConfigError> {
        let text = address.get_ref();
        if !(text.starts_with(UNIX_PREFIX) || text.starts_with('/') || text.starts_with("unix@")) {
            return Ok(());
        }
        Err(self.error(
            Some(address.span()),
            key,
            format!(
                "{text:?} is a Unix socket, and listeners bind TCP addresses only (Unix socket \
                 listeners are not supported: listen on a loopback address such as \
                 \"127.0.0.1:8080\"; Unix sockets are for backends, address = \"unix:/path\")"
            ),
        ))
    }

    /// Refuses TLS and agent checks in a pool with a Unix socket backend.
    pub(super) fn unix_pool(
        &self,
        at: &str,
        backends: &[BackendConfig],
        tls: bool,
        agent: bool,
    ) -> Result<(), ConfigError> {
        let Some(index) = backends.iter().position(|b| b.unix_path().is_some()) else {
            return Ok(());
        };
        let address = &backends[index].address;
        let key = format!("{at}.backends[{index}].address");
        if tls {
            return Err(self.error(
                None,
                &key,
                format!(
                    "{address:?} is a Unix socket, and the pool speaks TLS to its backends \
                     (TLS over a Unix socket is not supported: remove the pool's tls \
                     settings, or put this backend in a pool without TLS)"
                ),
            ));
        }
        if agent {
            return Err(self.error(
                None,
                &key,
                format!(
                    "{address:?} is a Unix socket, and the pool has agent checks, which \
                     connect to a TCP port on the backend's host (a socket has none: remove \
                     the agent table, or put this backend in a pool without agent checks)"
                ),
            ));
        }
        Ok(())
    }
}
