//! gRPC backends behind an `h2c` pool: real gRPC servers (Python's grpcio, started from
//! `tests/support/grpc/server.py`; `.ci/deps/grpcio.sh` installs it), and gRPC calls sent to
//! capataz as gRPC-shaped HTTP/1.1 POSTs (`content-type: application/grpc`, `TE: trailers`,
//! a 5-byte-prefixed message) read by hyper's HTTP/1.1 client, trailers included. The calls'
//! `grpc-status` drives the passive checks: UNAVAILABLE ejects by default, and the list of
//! codes that count is the pool's `passive.grpc_error_codes`.
//!
//! Without Python's grpcio the tests fail with the command that installs it: CI runs it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Stdio};

use bytes::{BufMut, Bytes, BytesMut};
use capataz_health::{Outcome, State};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::support::balancer::{start, ConfigText};
use crate::support::events::{transition_of, wait_for};
use crate::support::grpc;
use crate::support::DEADLINE;

/// A Python gRPC server; killed when dropped (its stdin closes, and it is killed anyway).
pub(super) struct GrpcServer {
    child: Child,
    _stdin: ChildStdin,
    addr: SocketAddr,
}

impl GrpcServer {
    /// `server.py name [status]`, once it listens.
    pub(super) fn start(name: &str, failing: Option<&str>) -> GrpcServer {
        let mut command = grpc::peer("server.py");
        command.arg(name).args(failing);
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}: {}", grpc::missing()));
        let stdin = child.stdin.take().expect("stdin");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the server's port");
        let port: u16 = line.trim().parse().unwrap_or_else(|_| {
            panic!(
                "the gRPC server did not start (got {line:?}); {}",
                grpc::missing()
            )
        });
        GrpcServer {
            child,
            _stdin: stdin,
            addr: ([127, 0, 0, 1], port).into(),
        }
    }

    pub(super) fn entry(&self, name: &str) -> (String, SocketAddr) {
        (name.to_owned(), self.addr)
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One unary call's result as an HTTP/1.1 client sees it.
#[derive(Debug)]
struct Call {
    http_status: u16,
    /// `grpc-status`, from the trailers or (trailers-only) the head.
    grpc_status: Option<String>,
    message: Bytes,
}

/// Calls `test.Echo/Call` with `payload` through capataz at `addr`, over HTTP/1.1.
async fn call(addr: SocketAddr, payload: &[u8]) -> Call {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut frame = BytesMut::with_capacity(5 + payload.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(payload.len()).expect("a small payload"));
    frame.put_slice(payload);
    let request = http::Request::builder()
        .method("POST")
        .uri("/test.Echo/Call")
        .header("host", "grpc.test")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(frame.freeze()))
        .expect("request");
    let response = tokio::time::timeout(DEADLINE, sender.send_request(request))
        .await
        .expect("in time")
        .expect("an answer");
    let http_status = response.status().as_u16();
    let head_status = header_text(response.headers(), "grpc-status");
    let body = tokio::time::timeout(DEADLINE, response.into_body().collect())
        .await
        .expect("in time")
        .expect("a whole body");
    let trailer_status = body.trailers().and_then(|t| header_text(t, "grpc-status"));
    let bytes = body.to_bytes();
    let message = if bytes.len() >= 5 {
        bytes.slice(5..)
    } else {
        Bytes::new()
    };
    Call {
        http_status,
        grpc_status: trailer_status.or(head_status),
        message,
    }
}

fn header_text(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

const H2C: &str = r#"
protocol = "h2c"
active.kind = "none"
"#;

#[tokio::test]
async fn grpc_calls_come_back_with_their_trailers() {
    let server = GrpcServer::start("one", None);
    let text = ConfigText::new(&[server.entry("one")]).extra(H2C).build();
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    for i in 0..5 {
        let payload = format!("ping {i}");
        let answer = call(addr, payload.as_bytes()).await;
        assert_eq!(answer.http_status, 200);
        assert_eq!(answer.grpc_status.as_deref(), Some("0"), "{answer:?}");
        assert_eq!(answer.message, Bytes::from(format!("one:ping {i}")));
    }
    let pool = balancer.pool("web").expect("pool");
    assert!(pool.backends[0]
        .traffic
        .recent()
        .iter()
        .all(|o| *o == Outcome::Grpc(0)));
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn a_backend_answering_unavailable_is_ejected() {
    let good = GrpcServer::start("good", None);
    let failing = GrpcServer::start("failing", Some("UNAVAILABLE"));
    let text = ConfigText::new(&[good.entry("good"), failing.entry("failing")])
        .extra(&format!("{H2C}passive.consecutive_errors = 3\n"))
        .build();
    let (balancer, mut events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let wait = wait_for(&mut events, "the failing backend ejected", |event| {
        transition_of(event, "failing", State::Down).is_some()
    });
    tokio::pin!(wait);
    let mut unavailable = 0;
    let event = loop {
        tokio::select! {
            event = &mut wait => break event,
            answer = call(addr, b"x") => {
                assert_eq!(answer.http_status, 200);
                match answer.grpc_status.as_deref() {
                    Some("0") => {}
                    Some("14") => unavailable += 1,
                    other => panic!("unexpected grpc-status {other:?}"),
                }
            }
        }
    };
    let transition = transition_of(&event, "failing", State::Down).expect("transition");
    assert_eq!(transition.reason.last(), Some(Outcome::Grpc(14)));
    assert!(unavailable >= 1);
    // Ejected: every call now goes to the good backend.
    for _ in 0..6 {
        let answer = call(addr, b"y").await;
        assert_eq!(answer.grpc_status.as_deref(), Some("0"));
        assert_eq!(answer.message, Bytes::from_static(b"good:y"));
    }
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn grpc_error_codes_decide_what_counts() {
    let failing = GrpcServer::start("failing", Some("UNAVAILABLE"));
    let text = ConfigText::new(&[failing.entry("failing")])
        .extra(&format!(
            "{H2C}passive.consecutive_errors = 1\npassive.grpc_error_codes = [13]\n"
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    for _ in 0..5 {
        let answer = call(addr, b"x").await;
        assert_eq!(answer.grpc_status.as_deref(), Some("14"));
    }
    let pool = balancer.pool("web").expect("pool");
    assert_eq!(
        pool.backends[0].traffic.recent(),
        vec![Outcome::Grpc(14); 5]
    );
    let views = pool.views();
    assert_eq!(
        views[0].standing.health.verdict(),
        State::Up,
        "UNAVAILABLE is not counted here"
    );
    balancer.shutdown(DEADLINE).await;
}
