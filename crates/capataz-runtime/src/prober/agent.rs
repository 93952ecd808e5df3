//! One agent check (HAProxy's `agent-check`): connect to the backend's agent port, read one
//! line of at most [`MAX_AGENT_LINE`] bytes (until `\n` or the close), within one deadline, and
//! parse it ([`AgentReport::parse`]). Nothing is sent. A refusal, a timeout, a reset or
//! garbage is `None`: the engine gets no input, so the backend keeps what its agent last said.

use std::net::SocketAddr;
use std::time::Duration;

use capataz_health::rotation::agent::MAX_AGENT_LINE;
use capataz_health::AgentReport;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Asks the agent at `addr` once; `None` when it could not be reached or said nothing usable.
pub async fn agent_once(addr: SocketAddr, timeout: Duration) -> Option<AgentReport> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let mut buf = [0u8; MAX_AGENT_LINE + 1];
        let mut len = 0;
        loop {
            let n = stream.read(&mut buf[len..]).await.ok()?;
            if n == 0 {
                // The close ends the line.
                return AgentReport::parse(&buf[..len]);
            }
            if let Some(newline) = buf[len..len + n].iter().position(|&b| b == b'\n') {
                return AgentReport::parse(&buf[..len + newline]);
            }
            len += n;
            if len == buf.len() {
                return None;
            }
        }
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}
