//! Unix socket backends (`address = "unix:/run/app.sock"`): the path checked where it is
//! written, and what a pool with one cannot do: TLS to it (refused; a local socket needs
//! none) and agent checks (an agent answers on a TCP port of the backend's host, and a
//! socket has no host). A listener on a Unix socket: its path, `socket_mode`, and the keys it
//! cannot have.

use std::collections::HashMap;
use std::path::PathBuf;

use toml::Spanned;

use super::{ConfigError, Validator};
use crate::parse::raw::RawListener;
use crate::{unix_path_problem, BackendConfig, ListenerConfig, UnixListen, UNIX_PREFIX};

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

    /// A listener's Unix socket (`address = "unix:/path"`, with `socket_mode`), `None` for a
    /// TCP listener. HAProxy's `/path` and `unix@/path` are pointed to the `unix:` spelling;
    /// the keys that need a client's IP (`proxy_protocol`) or are not served over a socket
    /// (`tls`) are refused.
    pub(super) fn unix_listener(
        &self,
        at: &str,
        raw: &RawListener,
    ) -> Result<Option<UnixListen>, ConfigError> {
        let key = format!("{at}.address");
        let Some(address) = &raw.address else {
            return Ok(None);
        };
        let text = address.get_ref();
        let Some(path) = text.strip_prefix(UNIX_PREFIX) else {
            if text.starts_with('/') || text.starts_with("unix@") {
                let path = text.strip_prefix("unix@").unwrap_or(text);
                return Err(self.error(
                    Some(address.span()),
                    &key,
                    format!("{text:?} looks like a Unix socket path (write it unix:{path})"),
                ));
            }
            if let Some(mode) = &raw.socket_mode {
                return Err(self.error(
                    Some(mode.span()),
                    &format!("{at}.socket_mode"),
                    "socket_mode sets a Unix socket file's permissions, and this listener \
                     binds a TCP address (remove socket_mode, or listen on unix:/path)"
                        .into(),
                ));
            }
            return Ok(None);
        };
        if let Some(why) = unix_path_problem(path) {
            return Err(self.error(
                Some(address.span()),
                &key,
                format!("the socket path {path:?} {why}"),
            ));
        }
        let refused = [
            (
                "proxy_protocol",
                raw.proxy_protocol.is_some(),
                "its trusted sources are IP ranges, and a Unix socket's clients have no IP",
            ),
            (
                "tls",
                raw.tls.is_some(),
                "TLS is not served over a Unix socket listener",
            ),
        ];
        if let Some((name, _, why)) = refused.iter().find(|(_, written, _)| *written) {
            return Err(self.error(
                None,
                &format!("{at}.{name}"),
                format!(
                    "this listener is on a Unix socket ({text:?}), and {name} cannot apply: \
                     {why} (remove {name}, or listen on a TCP address)"
                ),
            ));
        }
        let mode = match &raw.socket_mode {
            None => None,
            Some(mode) => Some(self.socket_mode(mode, &format!("{at}.socket_mode"))?),
        };
        Ok(Some(UnixListen {
            path: PathBuf::from(path),
            mode,
        }))
    }

    /// `socket_mode`: permission bits in octal, written as a string ("0660", "660").
    fn socket_mode(&self, mode: &Spanned<String>, key: &str) -> Result<u32, ConfigError> {
        let text = mode.get_ref();
        // Digits only (`from_str_radix` would take a sign too).
        let digits = text.bytes().all(|b| b.is_ascii_digit());
        match u32::from_str_radix(text, 8) {
            Ok(bits) if digits && (3..=4).contains(&text.len()) && bits <= 0o777 => Ok(bits),
            _ => Err(self.error(
                Some(mode.span()),
                key,
                format!(
                    "{text:?} is not a file mode (write the permission bits in octal, as \
                     chmod takes them, e.g. \"0660\" or \"0600\")"
                ),
            )),
        }
    }

    /// No two listeners on the same socket path (the second bind would replace the first's
    /// socket file).
    pub(super) fn unix_paths_unique(
        &self,
        listeners: &[ListenerConfig],
    ) -> Result<(), ConfigError> {
        let mut seen: HashMap<&PathBuf, &str> = HashMap::new();
        for (index, listener) in listeners.iter().enumerate() {
            let Some(unix) = &listener.unix else { continue };
            if let Some(other) = seen.insert(&unix.path, &listener.name) {
                return Err(self.error(
                    None,
                    &format!("listeners[{index}].address"),
                    format!(
                        "unix:{} is already used by listener {other} (give each listener its \
                         own socket path)",
                        unix.path.display()
                    ),
                ));
            }
        }
        Ok(())
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
