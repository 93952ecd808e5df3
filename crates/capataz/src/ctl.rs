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
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http(e.to_string()))?;
    tokio::spawn(conn);
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string());
    if let Some(token) = token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.to_string()))?;
    let response = tokio::time::timeout(Duration::from_secs(30), sender.send_request(request))
        .await
        .map_err(|_| http("no answer within 30 s".into()))?
        .map_err(|e| http(e.to_string()))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| http(e.to_string()))?
        .to_bytes();
    let value: Value =
        serde_json::from_slice(&body).map_err(|e| http(format!("answer is not JSON ({e})")))?;
    if status >= 400 {
        let message = value["error"].as_str().unwrap_or("no message").to_owned();
        return Err(CtlError::Refused { status, message });
    }
    Ok(value)
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
