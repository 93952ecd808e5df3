//! systemd's readiness protocol (`sd_notify(3)`), written by hand: one datagram of
//! `KEY=VALUE` lines to the unix socket named by `NOTIFY_SOCKET`.
//!
//! A path names a socket in the file system; a name starting with `@` names one in Linux's
//! abstract namespace (the `@` stands for the leading NUL byte). Without `NOTIFY_SOCKET`
//! (not started by systemd with `Type=notify`) every call does nothing. A failed send is
//! returned to the caller, which logs it: readiness is a courtesy to the supervisor, and
//! capataz serves whether or not it was heard.
//!
//! What capataz says (see docs/operating.md, "systemd"): `READY=1` once it accepts
//! connections, `RELOADING=1` then `READY=1` around a SIGHUP reload, `STOPPING=1` when it
//! starts to drain, and `MAINPID=<pid>` when a binary upgrade hands the service to a new
//! process.

use std::io;
use std::os::unix::net::UnixDatagram;

/// The environment variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The longest message sent (a few short lines; the kernel would take far more).
const MAX_MESSAGE: usize = 4096;

/// Sends `state` (newline-separated `KEY=VALUE` assignments) to the socket in
/// `NOTIFY_SOCKET`. `Ok(false)` when the variable is not set (nobody listens), `Ok(true)`
/// when the datagram was sent.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os(NOTIFY_SOCKET) {
        None => Ok(false),
        Some(path) => {
            let path = path.into_string().map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET is not UTF-8")
            })?;
            send(&path, state).map(|()| true)
        }
    }
}

/// Sends `state` to the notification socket `path` (a file system path, or `@name` for an
/// abstract one).
pub fn send(path: &str, state: &str) -> io::Result<()> {
    if state.len() > MAX_MESSAGE || state.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a notification is at most 4096 bytes of text",
        ));
    }
    let socket = UnixDatagram::unbound()?;
    let sent = match path.strip_prefix('@') {
        Some(name) => send_abstract(&socket, name, state)?,
        None if path.starts_with('/') => socket.send_to(state.as_bytes(), path)?,
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NOTIFY_SOCKET {path:?} is neither an absolute path nor @name"),
            ))
        }
    };
    if sent != state.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the notification was cut short",
        ));
    }
    Ok(())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn send_abstract(socket: &UnixDatagram, name: &str, state: &str) -> io::Result<usize> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt as _;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt as _;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    socket.send_to_addr(state.as_bytes(), &address)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn send_abstract(_: &UnixDatagram, _: &str, _: &str) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract unix sockets exist on Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receiver() -> (UnixDatagram, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "capataz-notify-unit-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let socket = UnixDatagram::bind(&path).expect("bind a datagram socket");
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("a read timeout");
        (socket, path)
    }

    #[test]
    fn send_delivers_one_datagram_to_a_path() {
        let (socket, path) = receiver();
        send(path.to_str().expect("UTF-8"), "READY=1\nSTATUS=serving").expect("sent");
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).expect("a datagram");
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        let _ = std::fs::remove_file(path);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn send_reaches_an_abstract_socket_named_with_an_at_sign() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!(
            "capataz-notify-unit-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        );
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("an abstract address");
        let socket = UnixDatagram::bind_addr(&address).expect("bind an abstract socket");
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("a read timeout");
        send(&format!("@{name}"), "STOPPING=1").expect("sent");
        let mut buf = [0u8; 64];
        let n = socket.recv(&mut buf).expect("a datagram");
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn send_refuses_a_relative_path_and_oversized_or_nul_messages() {
        assert!(send("relative/socket", "READY=1").is_err());
        assert!(send("/nonexistent-capataz", &"x".repeat(MAX_MESSAGE + 1)).is_err());
        assert!(send("/nonexistent-capataz", "READY=1\0").is_err());
        // Nobody listens there: an error, not a panic or a hang.
        assert!(send("/nonexistent-capataz/socket", "READY=1").is_err());
    }
}
