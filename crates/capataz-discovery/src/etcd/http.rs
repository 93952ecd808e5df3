//! HTTP/1.1 to one etcd endpoint's JSON gateway: a request with a bounded answer
//! ([`call`]), and a watch whose answer is a stream of JSON lines ([`Watch`]). One connection
//! per request (a watch holds its own for as long as it runs); every step within a deadline.
//!
//! Both go through the endpoint's access: TLS for `https://` (verified, with the source's
//! client certificate if any), and with credentials a token in the `Authorization` header,
//! got from `/v3/auth/authenticate` on the connection before the first request, kept for
//! every call of the source, and got again once when etcd refuses it (it expired, or a change
//! of etcd's users and roles revoked it). Neither the password nor the token is ever logged
//! or put in an error.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rustls::pki_types::ServerName;
use tokio::time::{timeout_at, Instant};

use super::error::{chain, EtcdError};
use super::wire::WatchLine;
use capataz_config::{EtcdEndpoint, EtcdToken};
use capataz_upstream::oneshot;

/// The largest answer to an authentication (a token).
const MAX_TOKEN_ANSWER: usize = 64 << 10;

/// The largest answer to a request (a range of up to `MAX_MEMBERS` keys of `MAX_VALUE`
/// bytes, in base64, fits).
pub(crate) const MAX_ANSWER: usize = 64 << 20;

/// The longest line of a watch stream (one watch response, with its events).
pub(crate) const MAX_LINE: usize = 32 << 20;

/// A connection's request sender, its driver task aborted on drop.
type Connection = oneshot::Connection<Full<Bytes>>;

/// When a call or the opening of a watch must be done, and what it says when it is not.
struct Due {
    by: Instant,
    /// The endpoint.
    url: String,
    /// A call's path and deadline; `None` for the opening of a watch.
    call: Option<(String, Duration)>,
}

impl Due {
    /// The error of being late.
    fn late(&self) -> EtcdError {
        let url = self.url.clone();
        match &self.call {
            Some((path, deadline)) => EtcdError::CallTimeout {
                url,
                path: path.clone(),
                deadline: *deadline,
            },
            None => EtcdError::WatchTimeout { url },
        }
    }
}

/// Connects to `endpoint` (its name resolved on the blocking pool, by tokio) by `by`: TCP,
/// then TLS for an `https://` endpoint (etcd's certificate verified against the source's
/// roots, the source's client certificate presented when etcd asks), then HTTP/1.1.
async fn connect(endpoint: &EtcdEndpoint, by: Instant) -> Result<Connection, EtcdError> {
    let url = || endpoint.url.clone();
    let attempt = async {
        let addresses = tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|source| EtcdError::Resolve { url: url(), source })?;
        let mut last = EtcdError::NoAddress { url: url() };
        for address in addresses.take(8) {
            match oneshot::tcp(address).await {
                Ok(stream) => {
                    let Some(tls) = &endpoint.access.tls else {
                        return handshake(stream, endpoint).await;
                    };
                    let config = tls
                        .client
                        .clone()
                        .ok_or_else(|| EtcdError::TlsNotLoaded { url: url() })?;
                    let name = tls.server_name.as_deref().unwrap_or(&endpoint.host);
                    let name = ServerName::try_from(name.to_owned()).map_err(|source| {
                        EtcdError::ServerName {
                            url: url(),
                            name: name.to_owned(),
                            source,
                        }
                    })?;
                    let stream = oneshot::tls(stream, oneshot::Tls { config, name })
                        .await
                        .map_err(|source| EtcdError::Tls {
                            url: url(),
                            address,
                            source,
                        })?;
                    return handshake(stream, endpoint).await;
                }
                Err(source) => {
                    last = EtcdError::Connect {
                        url: url(),
                        address,
                        source,
                    };
                }
            }
        }
        Err(last)
    };
    timeout_at(by, attempt)
        .await
        .map_err(|_| EtcdError::ConnectTimeout { url: url() })?
}

/// HTTP/1.1 over a connected `io`.
async fn handshake<T>(io: T, endpoint: &EtcdEndpoint) -> Result<Connection, EtcdError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + oneshot::Peer + Unpin + Send + 'static,
{
    Connection::over(io)
        .await
        .map_err(|source| EtcdError::Handshake {
            url: endpoint.url.clone(),
            source,
        })
}

/// An answer other than 200: its status and etcd's message.
#[derive(Debug)]
struct Refusal {
    status: hyper::StatusCode,
    message: String,
}

impl Refusal {
    /// Whether etcd refused the token (expired, revoked) or the want of one: authenticating
    /// again may help.
    fn is_auth(&self) -> bool {
        self.status == hyper::StatusCode::UNAUTHORIZED
            || [
                "invalid auth token",
                "user name is empty",
                "auth store is old",
            ]
            .iter()
            .any(|m| self.message.contains(m))
    }

    /// The refusal as an error of `path` on `endpoint`.
    fn say(self, endpoint: &EtcdEndpoint, path: &str) -> EtcdError {
        let hint = if self.is_auth() && endpoint.access.auth.is_none() {
            " (etcd has authentication on: set the source's username and password)"
        } else {
            ""
        };
        EtcdError::Refused {
            url: endpoint.url.clone(),
            path: path.to_owned(),
            status: self.status,
            message: self.message,
            hint,
        }
    }
}

/// Sends `body` to `path` with `token` and returns the answer's body (the connection stays
/// with the body), or etcd's refusal.
async fn send(
    connection: &mut Connection,
    endpoint: &EtcdEndpoint,
    path: &str,
    body: String,
    token: &EtcdToken,
    due: &Due,
) -> Result<Result<Incoming, Refusal>, EtcdError> {
    let mut request = hyper::Request::post(path)
        .header(
            hyper::header::HOST,
            format!("{}:{}", endpoint.host, endpoint.port),
        )
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let EtcdToken::Token(token) = token {
        // Checked to be a header value when it was received.
        request = request.header(hyper::header::AUTHORIZATION, token.as_str());
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|source| EtcdError::Request {
            url: endpoint.url.clone(),
            path: path.to_owned(),
            source,
        })?;
    let response = connection.send(request, due.by).await.map_err(|source| {
        if matches!(source, oneshot::Error::HeadTimeout) {
            return due.late();
        }
        // TLS 1.3: etcd checks the client certificate after the handshake, and says so
        // with an alert on the first request.
        let hint = if endpoint.access.tls.is_some() && chain(&source).contains("alert") {
            " (etcd ended the TLS session: when it asks for client certificates, tls.cert \
                 and tls.key must hold one its CA signed)"
        } else {
            ""
        };
        EtcdError::Send {
            url: endpoint.url.clone(),
            path: path.to_owned(),
            hint,
            source,
        }
    })?;
    let (parts, body) = response.into_parts();
    if parts.status != hyper::StatusCode::OK {
        let text = match oneshot::read_body(body, 4096, due.by).await {
            Err(oneshot::Error::BodyTimeout) => return Err(due.late()),
            read => read.unwrap_or_default(),
        };
        let message = serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&text).chars().take(200).collect());
        return Ok(Err(Refusal {
            status: parts.status,
            message: message.chars().take(500).collect(),
        }));
    }
    Ok(Ok(body))
}

/// The token to send on `connection`, and whether it is fresh (just given, or no credentials
/// at all: a refusal then is final). Authenticates (`/v3/auth/authenticate`) when the source
/// has credentials and no token, or when `refused` is the token in use; calls running at
/// once wait for one authentication.
async fn token(
    connection: &mut Connection,
    endpoint: &EtcdEndpoint,
    refused: Option<&EtcdToken>,
    due: &Due,
) -> Result<(EtcdToken, bool), EtcdError> {
    let Some(auth) = &endpoint.access.auth else {
        return Ok((EtcdToken::None, true));
    };
    let mut slot = auth.session.token.lock().await;
    if *slot != EtcdToken::None && refused != Some(&*slot) {
        return Ok((slot.clone(), false));
    }
    *slot = EtcdToken::None;
    let request = serde_json::json!({ "name": auth.username, "password": auth.password });
    let path = "/v3/auth/authenticate";
    let body = match send(
        connection,
        endpoint,
        path,
        request.to_string(),
        &EtcdToken::None,
        due,
    )
    .await?
    {
        Ok(body) => body,
        Err(refusal) if refusal.message.contains("authentication is not enabled") => {
            // As etcd's own client does: no token while etcd's authentication is off.
            tracing::debug!(endpoint = %endpoint.url, "etcd's authentication is off: no token");
            *slot = EtcdToken::AuthOff;
            return Ok((EtcdToken::AuthOff, true));
        }
        Err(refusal) => {
            return Err(EtcdError::Authenticate {
                username: auth.username.clone(),
                source: Box::new(refusal.say(endpoint, path)),
            })
        }
    };
    let answer = read(body, MAX_TOKEN_ANSWER, endpoint, path, due).await?;
    let token = serde_json::from_slice::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_owned))
        .filter(|t| !t.is_empty() && hyper::header::HeaderValue::from_str(t).is_ok())
        .ok_or_else(|| EtcdError::NoToken {
            url: endpoint.url.clone(),
            path: path.to_owned(),
        })?;
    tracing::debug!(endpoint = %endpoint.url, user = %auth.username, "authenticated to etcd");
    *slot = EtcdToken::Token(token);
    Ok((slot.clone(), true))
}

/// Sends `body` to `path` on a new connection, with the source's token: when etcd refuses a
/// token that was not fresh (expired, revoked), authenticates again once, on another
/// connection, and sends again. The connection stays with the answer's body.
async fn authorized(
    endpoint: &EtcdEndpoint,
    path: &str,
    body: &str,
    due: &Due,
) -> Result<(Connection, Incoming, EtcdToken, bool), EtcdError> {
    let mut connection = connect(endpoint, due.by).await?;
    let (token, fresh) = token(&mut connection, endpoint, None, due).await?;
    match send(
        &mut connection,
        endpoint,
        path,
        body.to_owned(),
        &token,
        due,
    )
    .await?
    {
        Ok(answer) => Ok((connection, answer, token, fresh)),
        Err(refusal) if !fresh && refusal.is_auth() => {
            tracing::debug!(endpoint = %endpoint.url, "etcd refused the token: authenticating again");
            let (connection, answer, token) =
                reauthorized(endpoint, path, body, due, &token).await?;
            Ok((connection, answer, token, true))
        }
        Err(refusal) => Err(refusal.say(endpoint, path)),
    }
}

/// [`authorized`]'s second try: a new connection, a new token (`refused` forgotten), the
/// request again.
async fn reauthorized(
    endpoint: &EtcdEndpoint,
    path: &str,
    body: &str,
    due: &Due,
    refused: &EtcdToken,
) -> Result<(Connection, Incoming, EtcdToken), EtcdError> {
    let mut connection = connect(endpoint, due.by).await?;
    let (token, _) = token(&mut connection, endpoint, Some(refused), due).await?;
    let answer = send(
        &mut connection,
        endpoint,
        path,
        body.to_owned(),
        &token,
        due,
    )
    .await?
    .map_err(|refusal| refusal.say(endpoint, path))?;
    Ok((connection, answer, token))
}

/// One request to `endpoint`: its whole answer (at most [`MAX_ANSWER`] bytes), within
/// `deadline` from connecting to the last byte.
pub async fn call(
    endpoint: &EtcdEndpoint,
    path: &str,
    body: String,
    deadline: Duration,
) -> Result<Bytes, EtcdError> {
    let due = Due {
        by: Instant::now() + deadline,
        url: endpoint.url.clone(),
        call: Some((path.to_owned(), deadline)),
    };
    let exchange = async {
        let (_connection, body, _, _) = authorized(endpoint, path, &body, &due).await?;
        read(body, MAX_ANSWER, endpoint, path, &due).await
    };
    timeout_at(due.by, exchange).await.map_err(|_| due.late())?
}

/// The answer `body` to `path`, at most `limit` bytes, by `due`.
async fn read(
    body: Incoming,
    limit: usize,
    endpoint: &EtcdEndpoint,
    path: &str,
    due: &Due,
) -> Result<Bytes, EtcdError> {
    oneshot::read_body(body, limit, due.by)
        .await
        .map_err(|e| match e {
            oneshot::Error::BodyTimeout => due.late(),
            source => EtcdError::Read {
                url: endpoint.url.clone(),
                path: path.to_owned(),
                source,
            },
        })
}

/// A running watch: the stream of its answer, line by line.
pub struct Watch {
    body: Incoming,
    buffer: Vec<u8>,
    /// Where the lines not taken yet start in `buffer`.
    start: usize,
    /// How much of `buffer` is known to hold no newline (each byte is looked at once).
    scanned: usize,
    _connection: Connection,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("buffered", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Opens a watch on `endpoint` with `request` (connecting and the answer's head within
    /// `deadline`). With credentials and a token that was not fresh, the first line is looked
    /// at: a watch refused for its token (etcd checks it when the watch is created) is opened
    /// again after authenticating again; any other first line is left for [`Watch::next_line`].
    pub async fn open(
        endpoint: &EtcdEndpoint,
        request: String,
        deadline: Duration,
    ) -> Result<Watch, EtcdError> {
        let path = "/v3/watch";
        let due = Due {
            by: Instant::now() + deadline,
            url: endpoint.url.clone(),
            call: None,
        };
        let open = async {
            let (connection, body, token, fresh) =
                authorized(endpoint, path, &request, &due).await?;
            let mut watch = Watch::new(connection, body);
            if fresh {
                return Ok(watch);
            }
            let first = watch.next_line().await.map_err(|e| EtcdError::FirstLine {
                url: endpoint.url.clone(),
                source: Box::new(e),
            })?;
            if !refused_for_token(&first) {
                watch.unread(first);
                return Ok(watch);
            }
            tracing::debug!(endpoint = %endpoint.url, "etcd refused the watch's token: authenticating again");
            let (connection, body, _) =
                reauthorized(endpoint, path, &request, &due, &token).await?;
            Ok(Watch::new(connection, body))
        };
        timeout_at(due.by, open).await.map_err(|_| due.late())?
    }

    fn new(connection: Connection, body: Incoming) -> Watch {
        Watch {
            body,
            buffer: Vec::new(),
            start: 0,
            scanned: 0,
            _connection: connection,
        }
    }

    /// Puts `line` back in front of what is buffered.
    fn unread(&mut self, line: Vec<u8>) {
        let rest = self.buffer.split_off(self.start);
        self.buffer = line;
        self.buffer.push(b'\n');
        self.buffer.extend_from_slice(&rest);
        self.start = 0;
        self.scanned = 0;
    }

    /// A whole line already received, if any (without waiting).
    pub(crate) fn buffered_line(&mut self) -> Option<Vec<u8>> {
        let from = self.scanned.max(self.start);
        let Some(found) = self.buffer[from..].iter().position(|b| *b == b'\n') else {
            self.scanned = self.buffer.len();
            return None;
        };
        let end = from + found;
        let line = self.buffer[self.start..end].to_vec();
        self.start = end + 1;
        self.scanned = self.start;
        Some(line)
    }

    /// The next line; an error when the stream ends, fails, or sends a line longer than
    /// [`MAX_LINE`]. Cancel-safe: what was read stays buffered.
    pub async fn next_line(&mut self) -> Result<Vec<u8>, EtcdError> {
        loop {
            if let Some(line) = self.buffered_line() {
                return Ok(line);
            }
            if self.buffer.len() - self.start > MAX_LINE {
                return Err(EtcdError::LineTooLong(MAX_LINE));
            }
            // What was taken goes before more is read (each byte is moved at most once more).
            self.buffer.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
            match self.body.frame().await {
                None => return Err(EtcdError::StreamEnded),
                Some(Err(e)) => return Err(EtcdError::StreamFailed(e)),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.buffer.extend_from_slice(data);
                    }
                }
            }
        }
    }
}

/// Whether the first line of a watch says etcd refused to create it for want of a valid token
/// (etcd 3.4 cancels it with "permission denied"; a later one may say "invalid auth token").
fn refused_for_token(line: &[u8]) -> bool {
    serde_json::from_slice::<WatchLine>(line)
        .ok()
        .and_then(|line| line.result)
        .is_some_and(|result| {
            result.canceled
                && [
                    "permission denied",
                    "invalid auth token",
                    "user name is empty",
                ]
                .iter()
                .any(|m| result.cancel_reason.contains(m))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_refused_for_its_token_is_told_from_other_first_lines() {
        // As etcd 3.4 answers a watch with a token it does not know, and with one from before
        // a change of users (or without the right to read).
        let unknown = br#"{"result":{"header":{"revision":"2"},"watch_id":"-1","created":true,"canceled":true,"cancel_reason":"rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"}}"#;
        let denied = br#"{"result":{"header":{"revision":"2"},"watch_id":"-1","created":true,"canceled":true,"cancel_reason":"rpc error: code = PermissionDenied desc = etcdserver: permission denied"}}"#;
        assert!(refused_for_token(unknown));
        assert!(refused_for_token(denied));
        let created = br#"{"result":{"header":{"revision":"2"},"created":true}}"#;
        let compacted = br#"{"result":{"canceled":true,"compact_revision":"5"}}"#;
        for line in [&created[..], compacted, b"not json", b"", b"{\"result\":7}"] {
            assert!(
                !refused_for_token(line),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn refusals_of_the_token_are_told_from_other_refusals() {
        let refusal = |status: u16, message: &str| Refusal {
            status: hyper::StatusCode::from_u16(status).expect("a status"),
            message: message.into(),
        };
        assert!(refusal(401, "etcdserver: invalid auth token").is_auth());
        assert!(refusal(400, "etcdserver: user name is empty").is_auth());
        assert!(refusal(400, "etcdserver: revision of auth store is old").is_auth());
        assert!(!refusal(
            400,
            "etcdserver: authentication failed, invalid user ID or password"
        )
        .is_auth());
        assert!(!refusal(403, "etcdserver: permission denied").is_auth());
    }

    /// A gateway on loopback that answers every request on a connection with `answer` (a
    /// whole HTTP/1.1 response), and an endpoint for it with `access`.
    async fn scripted(answer: Vec<u8>, access: capataz_config::EtcdAccess) -> EtcdEndpoint {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    while matches!(socket.read(&mut request).await, Ok(n) if n > 0) {
                        if socket.write_all(&answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        EtcdEndpoint {
            url: format!("http://{address}"),
            host: address.ip().to_string(),
            port: address.port(),
            access: std::sync::Arc::new(access),
        }
    }

    fn with_user() -> capataz_config::EtcdAccess {
        capataz_config::EtcdAccess {
            tls: None,
            auth: Some(capataz_config::EtcdAuth {
                username: "capataz".into(),
                password: "secret-pw-4411".into(),
                session: Default::default(),
            }),
        }
    }

    fn ok(body: &[u8]) -> Vec<u8> {
        answer("200 OK", body)
    }

    fn answer(status: &str, body: &[u8]) -> Vec<u8> {
        let mut answer = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(body);
        answer
    }

    #[tokio::test]
    async fn a_hostile_authentication_answer_is_an_error_that_names_neither_secret() {
        let deadline = Duration::from_secs(5);
        let huge = format!(r#"{{"token":"{}"}}"#, "t".repeat(MAX_TOKEN_ANSWER));
        for body in [
            &br#"{"token":"a\r\nAuthorization: b"}"#[..],
            br#"{"token":""}"#,
            br#"{"token":7}"#,
            b"not json",
            huge.as_bytes(),
        ] {
            let endpoint = scripted(ok(body), with_user()).await;
            let error = call(&endpoint, "/v3/kv/range", "{}".into(), deadline)
                .await
                .expect_err("no usable token")
                .to_string();
            assert!(error.contains("/v3/auth/authenticate"), "{error}");
            assert!(!error.contains("secret-pw-4411"), "{error}");
        }
        // A refusal of the password says so, and not the password.
        let refused = answer(
            "400 Bad Request",
            br#"{"message":"etcdserver: authentication failed, invalid user ID or password"}"#,
        );
        let endpoint = scripted(refused, with_user()).await;
        let error = call(&endpoint, "/v3/kv/range", "{}".into(), deadline)
            .await
            .expect_err("refused")
            .to_string();
        assert!(
            error.starts_with("authenticating as \"capataz\"") && error.contains("invalid user ID"),
            "{error}"
        );
        assert!(!error.contains("secret-pw-4411"), "{error}");
    }

    #[tokio::test]
    async fn a_token_refused_right_after_authenticating_is_not_asked_again_in_a_loop() {
        // A token in use refused; authenticating again refused as well: one more try, then
        // the error (no loop), and no token kept.
        let refused = answer(
            "401 Unauthorized",
            br#"{"message":"etcdserver: invalid auth token"}"#,
        );
        let endpoint = scripted(refused, with_user()).await;
        let auth = endpoint.access.auth.as_ref().expect("credentials");
        *auth.session.token.lock().await = EtcdToken::Token("old".into());
        let error = call(
            &endpoint,
            "/v3/kv/range",
            "{}".into(),
            Duration::from_secs(5),
        )
        .await
        .expect_err("refused")
        .to_string();
        assert!(error.contains("authenticating as"), "{error}");
        assert!(matches!(*auth.session.token.lock().await, EtcdToken::None));
    }

    #[tokio::test]
    async fn a_line_put_back_comes_first_and_the_rest_follows() {
        // A watch over a connection is not needed to test the buffer: build one by hand.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head).await;
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 16\r\n\r\nfirst\nsecond\nth")
                .await;
        });
        let endpoint = capataz_config::EtcdEndpoint {
            url: format!("http://{address}"),
            host: address.ip().to_string(),
            port: address.port(),
            access: Default::default(),
        };
        let mut watch = Watch::open(&endpoint, "{}".into(), Duration::from_secs(5))
            .await
            .expect("a watch");
        let first = watch.next_line().await.expect("a line");
        assert_eq!(first, b"first");
        watch.unread(first);
        assert_eq!(watch.next_line().await.expect("a line"), b"first");
        assert_eq!(watch.next_line().await.expect("a line"), b"second");
        assert!(watch.next_line().await.is_err(), "the stream ends mid-line");
    }
}
