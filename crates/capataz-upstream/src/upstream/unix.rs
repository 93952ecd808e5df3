//! Backends on a Unix domain socket (`address = "unix:/run/app.sock"`): the same keep-alive
//! sets, PROXY protocol header and HTTP/1.1 or h2c exchanges as a TCP backend's, over a
//! `UnixStream` ([`BackendStream::Unix`]). A socket file that is missing, or that nobody
//! listens on, refuses the connect (`AttemptError::ConnectRefused`, charged to the backend),
//! as a closed TCP port does. TLS is never spoken over one (the config refuses it).
//!
//! TCP backends pay nothing for this: `Upstream::connect` branches once on an `Option`.

use std::path::Path;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::{AttemptError, BackendStream, ClientAddrs, Conn, Upstream};

impl Upstream {
    /// The same, connecting to the Unix socket at `path` instead of a TCP address (`None`
    /// leaves it a TCP backend).
    pub fn with_unix(mut self, path: Option<&Path>) -> Upstream {
        self.unix = path.map(Arc::from);
        self
    }

    /// The socket path of a Unix socket backend, `None` for TCP.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix.as_deref()
    }

    /// A fresh connection to the socket at `path`, the PROXY protocol header naming `client`
    /// written first when the pool sends one, all within the connect deadline.
    pub(super) async fn connect_unix(
        &self,
        path: &Path,
        client: ClientAddrs,
    ) -> Result<Conn, AttemptError> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let connect = async {
            let mut stream = UnixStream::connect(path)
                .await
                .map_err(|e| AttemptError::of_connect(&e))?;
            if let Some(version) = self.send_proxy {
                stream
                    .write_all(&super::proxy_header(version, client))
                    .await
                    .map_err(|e| AttemptError::of_connect(&e))?;
            }
            Ok(stream)
        };
        match tokio::time::timeout_at(deadline, connect).await {
            Err(_) => Err(AttemptError::ConnectTimeout),
            Ok(Err(error)) => Err(error),
            Ok(Ok(stream)) => Ok(Conn {
                stream: BackendStream::Unix(stream),
                reused: false,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpStream, UnixListener, UnixStream};

    use super::*;
    use crate::upstream::Transport;
    use capataz_proxy_protocol::Version as ProxyVersion;

    fn upstream(path: &Path) -> Upstream {
        let addr = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
        Upstream::new(addr, Duration::from_secs(1), Duration::from_secs(30)).with_unix(Some(path))
    }

    /// A socket path in a fresh directory under the system's temporary one.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("capataz-up-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("s.sock")
    }

    #[test]
    fn the_unix_variant_adds_one_tag_word_to_the_stream() {
        /// The enum as it was before the Unix variant: a TCP stream's size, the box in its
        /// niche.
        #[allow(dead_code)]
        enum TcpOrTls {
            Tcp(TcpStream),
            Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
        }
        let (now, before) = (
            std::mem::size_of::<BackendStream>(),
            std::mem::size_of::<TcpOrTls>(),
        );
        assert_eq!(before, std::mem::size_of::<TcpStream>());
        assert_eq!(now, before + std::mem::size_of::<usize>());
    }

    #[tokio::test]
    async fn a_missing_socket_or_one_nobody_listens_on_is_refused() {
        let path = scratch("missing");
        let missing = upstream(&path).connect(None).await.err();
        assert_eq!(missing, Some(AttemptError::ConnectRefused));
        drop(UnixListener::bind(&path).unwrap());
        // The file stays, nobody listens.
        assert!(path.exists());
        let stale = upstream(&path).connect(None).await.err();
        assert_eq!(stale, Some(AttemptError::ConnectRefused));
        // Neither a regular file nor a directory is a socket.
        let file = path.with_file_name("file");
        std::fs::write(&file, b"not a socket").unwrap();
        let dir = path.parent().unwrap();
        for not_a_socket in [&file, dir] {
            let refused = upstream(not_a_socket).connect(None).await.err();
            assert_eq!(
                refused,
                Some(AttemptError::ConnectRefused),
                "{not_a_socket:?}"
            );
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn a_fresh_connection_starts_with_the_proxy_header() {
        let path = scratch("proxy");
        let listener = UnixListener::bind(&path).unwrap();
        let up = upstream(&path).with_proxy_protocol(Some(ProxyVersion::V1));
        let client = (
            "192.0.2.1:4000".parse().unwrap(),
            "192.0.2.2:80".parse().unwrap(),
        );
        let conn = up.connect(Some(client)).await.unwrap();
        assert!(matches!(conn.stream, BackendStream::Unix(_)) && !conn.reused);
        let (mut accepted, _) = listener.accept().await.unwrap();
        drop(conn);
        let mut header = Vec::new();
        accepted.read_to_end(&mut header).await.unwrap();
        assert_eq!(header, b"PROXY TCP4 192.0.2.1 192.0.2.2 4000 80\r\n");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn an_idle_socket_connection_is_reused_until_stray_bytes_or_a_close() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut stream = BackendStream::Unix(a);
        assert!(stream.still_open());
        b.write_all(b"x").await.unwrap();
        assert!(
            unusable_soon(&mut stream).await,
            "bytes nobody asked for make it unusable"
        );
        let (a, b) = UnixStream::pair().unwrap();
        let mut stream = BackendStream::Unix(a);
        assert!(stream.still_open());
        drop(b);
        assert!(
            unusable_soon(&mut stream).await,
            "a closed socket is not usable"
        );
    }

    /// Whether `stream` is found unusable once the reactor has seen what arrived (the check
    /// itself never waits), within 5 seconds.
    async fn unusable_soon(stream: &mut BackendStream) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while stream.still_open() {
            if Instant::now() > end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}
