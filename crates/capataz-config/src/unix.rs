//! Unix domain socket addresses, written `unix:/absolute/path` (nginx's spelling; HAProxy
//! writes the bare path or `unix@/path`). The address as written is the one source of truth:
//! a backend's [`BackendConfig::address`](crate::BackendConfig) starting with [`UNIX_PREFIX`]
//! is a Unix socket backend, whose `socket_addr` is the unused placeholder `0.0.0.0:0`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};

/// What starts a Unix socket address.
pub const UNIX_PREFIX: &str = "unix:";

/// The longest socket path: `sun_path` holds 108 bytes on Linux, the last one the NUL.
pub const MAX_UNIX_PATH: usize = 107;

/// The address a client of a Unix socket listener stands as (it has no IP): `0.0.0.0:0`, which
/// no TCP peer can have. The access log writes it `unix`; such a client gets no
/// `X-Forwarded-For` or `Forwarded` entry, a `LOCAL` PROXY header to backends, and all such
/// clients share one key for `client_ip` hashing and rate limits.
pub const UNIX_CLIENT: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// A listener on a Unix domain socket (`address = "unix:/path"`); its
/// [`ListenerConfig::address`](crate::ListenerConfig) is then the unused placeholder
/// `0.0.0.0:0`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnixListen {
    /// The socket file's path.
    pub path: PathBuf,
    /// `socket_mode`: the permission bits the socket file gets (e.g. `0o660`); `None` (the
    /// default): those the process's umask leaves.
    pub mode: Option<u32>,
}

impl crate::BackendConfig {
    /// The backend's socket path when its address is `unix:/path`; `None` for TCP.
    pub fn unix_path(&self) -> Option<&Path> {
        unix_path(&self.address)
    }
}

/// The socket path of an address written `unix:/path`, `None` for any other address.
pub fn unix_path(address: &str) -> Option<&Path> {
    address.strip_prefix(UNIX_PREFIX).map(Path::new)
}

/// Why a `unix:` address is not a usable socket path, in the operator's words; `None` when it
/// is one: absolute, at most [`MAX_UNIX_PATH`] bytes, no control character (NUL included),
/// not a directory's name.
pub fn unix_path_problem(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return Some("is not an absolute path (write unix:/run/app.sock)".into());
    }
    if path.len() > MAX_UNIX_PATH {
        return Some(format!(
            "is {} bytes long; a Unix socket path holds at most {MAX_UNIX_PATH} (sun_path) \
             (use a shorter directory)",
            path.len()
        ));
    }
    // The path is the backend's default name, written in logs and labels: no line breaks.
    if path.chars().any(char::is_control) {
        return Some("holds a control character (a NUL, a line break, ...)".into());
    }
    if path.ends_with('/') {
        return Some("names a directory, not a socket file".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unix_addresses_have_a_path() {
        assert_eq!(
            unix_path("unix:/run/a.sock"),
            Some(Path::new("/run/a.sock"))
        );
        assert_eq!(unix_path("127.0.0.1:80"), None);
        assert_eq!(unix_path("/run/a.sock"), None);
    }

    #[test]
    fn paths_are_absolute_short_and_files() {
        assert_eq!(unix_path_problem("/run/a.sock"), None);
        assert!(unix_path_problem("run/a.sock").is_some());
        assert!(unix_path_problem("/run/").is_some());
        assert!(unix_path_problem("/a\0b").is_some());
        assert!(unix_path_problem("/a\nb").is_some());
        assert_eq!(unix_path_problem("/run/my app.sock"), None);
        let longest = format!("/{}", "a".repeat(MAX_UNIX_PATH - 1));
        assert_eq!(unix_path_problem(&longest), None);
        let too_long = unix_path_problem(&format!("{longest}a")).expect("108 bytes");
        assert!(too_long.contains("at most 107"), "{too_long}");
    }
}
