//! End-to-end tests of a route's rules: matchers (methods, exact path, path regex, headers,
//! query) over HTTP/1.1 and HTTP/2, and what a route whose pool is down does.
//!
//! The backends echo what they received (the request line and header fields, as the body of
//! their `200`), so a test reads what the route sent them.

mod headers;
mod hsts;
mod matchers;
mod redirects;
mod rewrite;

use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;

use crate::support::raw::{read_body, read_head, RawBackend};

/// A keep-alive backend answering every request `200` with its head (request line and
/// fields, as received) as the body, and `X-Backend: NAME`.
async fn echo_backend(name: &'static str) -> RawBackend {
    RawBackend::start(move |mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            if read_body(&mut stream, &mut buf, &head).await.is_none() {
                return;
            }
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = format!(
                "HTTP/1.1 200 OK\r\nX-Backend: {name}\r\nContent-Length: {}\r\n\r\n{head}",
                head.len()
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// `[pools.NAME]` over one backend at `addr`, without probes.
fn pool(name: &str, addr: SocketAddr) -> String {
    format!(
        "[pools.{name}]\nbackends = [{{ name = \"{name}1\", address = \"{addr}\" }}]\n\
         [pools.{name}.active]\nkind = \"none\"\n"
    )
}

/// The values of field `name` in an echoed head (the body an echo backend answered).
fn echoed<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.lines()
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .filter(|(field, _)| field.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.trim())
        .collect()
}
