//! `capataz status` and `capataz ctl`: the admin API from a terminal.
//!
//! A few plain HTTP/1.1 requests to the admin listener; the table is drawn from the same
//! `/status` JSON the dashboard reads, so the terminal and the page never disagree.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Why a command against the admin API failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The admin API could not be reached.
    #[error("cannot reach the admin API at {addr}: {source} (is capataz running with an [admin] table?)")]
    Connect {
        /// Where it was looked for.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The exchange failed midway.
    #[error("admin API at {addr}: {message}")]
    Http {
        /// Where.
        addr: SocketAddr,
        /// What.
        message: String,
    },
    /// The admin API answered with an error.
    #[error("admin API answered {status}: {message}")]
    Refused {
        /// The status code.
        status: u16,
        /// Its error message.
        message: String,
    },
}

/// Sends one request to the admin API and returns the JSON answer.
pub async fn request(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    token: Option<&str>,
) -> Result<Value, CtlError> {
    let http = |message: String| CtlError::Http { addr, message };
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| CtlError::Connect {
            addr,
            source: std::io::ErrorKind::TimedOut.into(),
        })?
        .map_err(|source| CtlError::Connect { addr, source })?;
    // Host names the address actually reached (`--admin 0.0.0.0:9901` reaches 127.0.0.1), which
    // the admin API's checks against web pages accept.
    let host = stream.peer_addr().unwrap_or(addr);
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http(e.to_string()))?;
    tokio::spawn(conn);
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, host.to_string());
    if let Some(token) = token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.to_string()))?;
    // The answer, body included, within 30 s: a peer that sends a head and then stalls must
    // not hang the command.
    let exchange = async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((status, body))
    };
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| http("no answer within 30 s".into()))?
        .map_err(|e| http(e.to_string()))?;
    let value: Value =
        serde_json::from_slice(&body).map_err(|e| http(format!("answer is not JSON ({e})")))?;
    if status >= 400 {
        let mut message = value["error"].as_str().unwrap_or("no message").to_owned();
        if status == 401 {
            message.push_str("; pass --token TOKEN or set CAPATAZ_ADMIN_TOKEN");
        }
        return Err(CtlError::Refused { status, message });
    }
    Ok(value)
}

/// The admin path of an override: `/backends/<pool>/<backend>/<verb>[?ttl=<ttl>]`, each part
/// percent-encoded, so that any name the config allows (spaces, `/`, `?`, non-ASCII text) and
/// any `--ttl` text reach the admin API as written.
pub fn override_path(pool: &str, backend: &str, verb: &str, ttl: Option<&str>) -> String {
    let mut path = format!(
        "/backends/{}/{}/{}",
        percent_encode(pool),
        percent_encode(backend),
        percent_encode(verb)
    );
    if let Some(ttl) = ttl {
        path.push_str("?ttl=");
        path.push_str(&percent_encode(ttl));
    }
    path
}

/// `text` with every byte but the unreserved ones of RFC 3986 (letters, digits, `-._~`)
/// written as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn cell(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Renders `/status` as a table, one line per backend plus its explain sentence.
pub fn render_status(status: &Value) -> String {
    let mut out = String::new();
    let empty = Vec::new();
    for pool in status["pools"].as_array().unwrap_or(&empty) {
        out.push_str(&format!(
            "pool {}: {} of {} backends eligible{}\n",
            cell(&pool["name"]),
            cell(&pool["healthy"]),
            cell(&pool["backends_total"]),
            if pool["all_down"].as_bool() == Some(true) {
                format!(" - ALL DOWN ({})", cell(&pool["when_all_down"]))
            } else {
                String::new()
            }
        ));
        out.push_str(&format!(
            "  {:<16} {:<12} {:<22} {:>6} {:>7} {:>9}  {}\n",
            "BACKEND", "STATE", "ADDRESS", "WEIGHT", "EFFECT", "IN-FLIGHT", "LAST PROBE"
        ));
        for b in pool["backends"].as_array().unwrap_or(&empty) {
            out.push_str(&format!(
                "  {:<16} {:<12} {:<22} {:>6} {:>7} {:>9}  {}\n      {}\n",
                cell(&b["name"]),
                cell(&b["state"]),
                cell(&b["address"]),
                cell(&b["weight"]),
                cell(&b["effective_weight"]),
                cell(&b["in_flight"]),
                cell(&b["active"]["last_probe"]["outcome"]),
                cell(&b["explain"]),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the path was pasted together unencoded, so `capataz ctl down web "web 2"`
    /// failed with "invalid uri character" and a `/` or `?` in a name reached another endpoint.
    #[test]
    fn names_with_spaces_slashes_and_unicode_are_percent_encoded_in_the_path() {
        assert_eq!(
            override_path("web", "web1", "drain", Some("10m")),
            "/backends/web/web1/drain?ttl=10m"
        );
        assert_eq!(
            override_path("web", "web 2/x?y#z", "down", None),
            "/backends/web/web%202%2Fx%3Fy%23z/down"
        );
        assert_eq!(
            override_path("web", "w\u{e9}b", "up", Some("1s&ttl=1h")),
            "/backends/web/w%C3%A9b/up?ttl=1s%26ttl%3D1h"
        );
        assert_eq!(
            override_path("web", "[::1]:9001", "clear", None),
            "/backends/web/%5B%3A%3A1%5D%3A9001/clear"
        );
    }
}
