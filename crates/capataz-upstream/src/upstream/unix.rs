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
