//! The Unix socket listeners of a handover (`unix:FD=PATH` entries): the path written
//! percent-encoded (a path may hold any byte but NUL, the entry separators included), the
//! descriptor checked to be a listening Unix stream socket, and the socket file's identity
//! (device and inode) read when the new process takes it, so that a file it does not keep is
//! removed only if it is still that socket.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use super::DescriptorError;

/// One Unix listening socket handed over.
#[derive(Debug)]
pub(crate) struct HandedUnix {
    /// The socket file's path.
    pub path: PathBuf,
    /// The socket.
    pub socket: UnixListener,
    /// The device and inode of the socket file at the path when it was taken (`None` if no
    /// socket file was there).
    pub file: Option<(u64, u64)>,
}

impl HandedUnix {
    pub(super) fn new(path: PathBuf, socket: UnixListener) -> HandedUnix {
        let file = std::fs::symlink_metadata(&path)
            .ok()
            .filter(|meta| meta.file_type().is_socket())
            .map(|meta| (meta.dev(), meta.ino()));
        HandedUnix { path, socket, file }
    }

    /// Removes the socket file of a socket nobody took (the new configuration has no listener
    /// there), if it is still the one that was handed over: the old process leaves it.
    pub(super) fn remove_file(&self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| Some((meta.dev(), meta.ino())) == self.file);
        if ours {
            if let Err(error) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), %error, "cannot remove the socket file");
            }
        }
    }
}

/// `path` with `%`, `,`, `=` and every byte that is not printable ASCII written `%XX`.
pub(super) fn encode_path(path: &Path) -> String {
    let mut text = String::new();
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_graphic() && !matches!(byte, b'%' | b',' | b'=') {
            text.push(char::from(byte));
        } else {
            text.push_str(&format!("%{byte:02X}"));
        }
    }
    text
}

/// The path [`encode_path`] wrote, if `text` is one: absolute, no NUL, every `%` followed by
/// two hex digits.
pub(super) fn decode_path(text: &str) -> Option<PathBuf> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    let path = PathBuf::from(OsString::from_vec(bytes));
    (path.is_absolute() && !path.as_os_str().as_bytes().contains(&0)).then_some(path)
}

/// The socket in `owned`, if it is a listening Unix stream socket, set non-blocking for tokio.
pub(super) fn listening_unix(owned: OwnedFd) -> Result<UnixListener, DescriptorError> {
    let socket = socket2::Socket::from(owned);
    if socket.domain()? != socket2::Domain::UNIX {
        return Err(DescriptorError::NotUnix);
    }
    if socket.r#type()? != socket2::Type::STREAM {
        return Err(DescriptorError::NotStream);
    }
    if !socket.is_listener()? {
        return Err(DescriptorError::NotListening);
    }
    socket.set_nonblocking(true)?;
    Ok(UnixListener::from(OwnedFd::from(socket)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_with_separators_and_odd_bytes_survives_the_encoding() {
        let odd = PathBuf::from(OsString::from_vec(b"/run/a,b=c%d e\xff.sock".to_vec()));
        let text = encode_path(&odd);
        assert_eq!(text, "/run/a%2Cb%3Dc%25d%20e%FF.sock");
        assert_eq!(decode_path(&text), Some(odd));
        for hostile in ["relative.sock", "/a%2", "/a%zz", "/a%00b", ""] {
            assert_eq!(decode_path(hostile), None, "{hostile:?} was taken");
        }
    }

    #[test]
    fn only_a_listening_unix_stream_socket_is_taken() {
        let dir = std::env::temp_dir().join(format!("capataz-handover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listening = UnixListener::bind(dir.join("l.sock")).unwrap();
        assert!(listening_unix(OwnedFd::from(listening)).is_ok());
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(listening_unix(OwnedFd::from(a)).is_err());
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(listening_unix(OwnedFd::from(tcp)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_untaken_socket_file_is_removed_only_if_it_is_still_the_one_handed_over() {
        let dir = std::env::temp_dir().join(format!("capataz-untaken-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lb.sock");
        let handed = HandedUnix::new(path.clone(), UnixListener::bind(&path).unwrap());
        // Another socket renamed over it since: left alone.
        let other = dir.join("other.sock");
        let _other = UnixListener::bind(&other).unwrap();
        std::fs::rename(&other, &path).unwrap();
        handed.remove_file();
        assert!(path.exists(), "another process's socket stays");
        let handed = HandedUnix::new(
            path.clone(),
            UnixListener::bind(dir.join("x.sock")).unwrap(),
        );
        handed.remove_file();
        assert!(!path.exists(), "the file handed over is removed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
