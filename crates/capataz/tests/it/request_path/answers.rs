//! The backend's answer on its way to the client (BENCHMARKS.md, "The backend's answer:
//! hop-by-hop fields, whole bodies, names"): a lone `Connection: keep-alive` or `close` is
//! left out of the head when it is parsed, other hop-by-hop fields are stripped, a body that
//! came whole with its head goes back to the pool at once, and custom field names come from a
//! small per-thread cache. Each is attacked here as a hostile backend would: a `close` said
//! in any spelling must end the backend connection (the backend here keeps it open and answers
//! a second request with `POISON`), stray bytes after a whole body must never be read as
//! another answer, no hop-by-hop field (nor one `Connection` names) may reach the client, and
//! field names must arrive as written, whatever the names before them were.

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use capataz::health::Notice;
use tokio::sync::broadcast::error::RecvError;

use super::{balancer, balancer_with, errors};
use crate::support::balancer::{start, ConfigText};
use crate::support::raw::{read_body, read_head, RawBackend};
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// A whole answer `ok`, with `fields` (each line ending in CRLF) in its head.
fn ok_with(fields: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 2\r\n\r\nok").into_bytes()
}

/// What a second answer on a connection that must not carry one says.
const POISON: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nPOISON";

/// The answer the scripted backend gives for `path`, in one write, and whether its connection
/// must never carry another request (the answer said `close`, is HTTP/1.0 without keep-alive,
/// or has bytes after it).
fn script(path: &str) -> (Vec<u8>, bool) {
    let answer = match path {
        "/close/lower" => ok_with("Connection: close\r\n"),
        "/close/upper" => ok_with("CONNECTION: CLOSE\r\n"),
        "/close/mixed" => ok_with("connection: cLoSe\r\n"),
        "/close/blanks" => ok_with("Connection: \t close \t\r\n"),
        "/close/second" => ok_with("Connection: keep-alive\r\nConnection: Close\r\n"),
        "/close/first" => ok_with("Connection: close\r\nConnection: keep-alive\r\n"),
        "/close/twice" => ok_with("Connection: close\r\nConnection: close\r\n"),
        "/close/list" => ok_with("Connection: close, keep-alive\r\n"),
        "/close/list2" => ok_with("Connection: keep-alive,close\r\n"),
        "/close/named" => ok_with("Connection: close, X-Secret\r\nX-Secret: 1\r\n"),
        "/close/ka" => ok_with("Connection: close\r\nKeep-Alive: timeout=5\r\n"),
        "/close/http10" => b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        "/close/http10-ka-close" => {
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok".to_vec()
        }
        "/close/te-cl" => {
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                .to_vec()
        }
        // Stray bytes in the same write as a whole answer: a second answer, unasked.
        "/stray/cl" => [ok_with("Connection: keep-alive\r\n"), POISON.to_vec()].concat(),
        "/stray/cl-plain" => [ok_with(""), POISON.to_vec()].concat(),
        "/stray/204" => [
            b"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\nContent-Length: 45\r\n\r\n".to_vec(),
            POISON.to_vec(),
        ]
        .concat(),
        "/stray/304" => [
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 45\r\n\r\n".to_vec(),
            POISON.to_vec(),
        ]
        .concat(),
        // Asked with HEAD: the body after the head is stray.
        "/stray/head" => [ok_with("Connection: keep-alive\r\n"), POISON.to_vec()].concat(),
        "/stray/100" => [
            b"HTTP/1.1 100 Continue\r\nConnection: close\r\n\r\n".to_vec(),
            ok_with("Connection: keep-alive\r\n"),
            POISON.to_vec(),
        ]
        .concat(),
        // Reusable answers.
        _ => return (ok_with("Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n"), false),
    };
    (answer, true)
}

/// A keep-alive backend answering each request as [`script`] says, that keeps every
/// connection open whatever its answer said: a connection asked again after an answer that
/// forbade it answers `POISON`. Counts requests.
async fn scripted() -> RawBackend {
    RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        let mut spent = false;
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let (answer, ends) = script(&path);
            let answer = if spent { POISON.to_vec() } else { answer };
            spent |= ends;
            if stream.write_all(&answer).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// Paths whose answer forbids reuse, with the method each is asked with.
const ENDING: [(&str, &str); 20] = [
    ("GET", "/close/lower"),
    ("GET", "/close/upper"),
    ("GET", "/close/mixed"),
    ("GET", "/close/blanks"),
    ("GET", "/close/second"),
    ("GET", "/close/first"),
    ("GET", "/close/twice"),
    ("GET", "/close/list"),
    ("GET", "/close/list2"),
    ("GET", "/close/named"),
    ("GET", "/close/ka"),
    ("GET", "/close/http10"),
    ("GET", "/close/http10-ka-close"),
    ("GET", "/close/te-cl"),
    ("GET", "/stray/cl"),
    ("GET", "/stray/cl-plain"),
    ("GET", "/stray/204"),
    ("GET", "/stray/304"),
    ("HEAD", "/stray/head"),
    ("GET", "/stray/100"),
];

/// One request on `stream`: the answer's head and body (none for HEAD, 204 and 304).
async fn ask(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    method: &str,
    path: &str,
) -> (String, Vec<u8>) {
    let request = format!("{method} {path} HTTP/1.1\r\nHost: app.test\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let answer = async {
        let head = read_head(stream, buf).await?;
        let status = &head[9..12];
        if method == "HEAD" || status == "204" || status == "304" {
            return Some((head, Vec::new()));
        }
        let body = read_body(stream, buf, &head).await?;
        Some((head, body))
    };
    tokio::time::timeout(DEADLINE, answer)
        .await
        .expect("an answer in time")
        .unwrap_or_else(|| panic!("{method} {path}: the connection ended without an answer"))
}

/// Asks each of [`ENDING`] on a client connection of its own, then `/ok` on the same client
/// connection and `/ok` on another: neither may be served on the connection that ended.
async fn never_asked_again(pool: &str) {
    let backend = scripted().await;
    let (_balancer, addr) = balancer_with(&[backend.addr], "", "", pool).await;
    for (method, path) in ENDING {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let (head, body) = ask(&mut stream, &mut buf, method, path).await;
        assert!(
            !body.windows(6).any(|w| w == b"POISON"),
            "{pool} {path}: {head}"
        );
        let (head, body) = ask(&mut stream, &mut buf, "GET", "/ok").await;
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{pool} after {path}: {head}"
        );
        assert_eq!(
            body, b"ok",
            "{pool} after {path}: the same client read stray bytes"
        );
        let mut other = TcpStream::connect(addr).await.unwrap();
        let (head, body) = ask(&mut other, &mut Vec::new(), "GET", "/ok").await;
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{pool} after {path}: {head}"
        );
        assert_eq!(
            body, b"ok",
            "{pool} after {path}: another client read stray bytes"
        );
    }
}

#[tokio::test]
async fn a_backend_connection_that_ended_is_never_asked_again_private_reuse() {
    never_asked_again("").await;
}

#[tokio::test]
async fn a_backend_connection_that_ended_is_never_asked_again_shared_reuse() {
    never_asked_again("connection_reuse = \"shared\"").await;
}

/// The names of `head`'s fields, lowercase, and their values.
fn fields(head: &str) -> Vec<(String, String)> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect()
}

/// A keep-alive backend whose answer is `answer` for every request.
async fn always(answer: Vec<u8>) -> RawBackend {
    RawBackend::start(move |mut stream, hits| {
        let answer = answer.clone();
        async move {
            let mut buf = Vec::new();
            while read_head(&mut stream, &mut buf).await.is_some() {
                hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if stream.write_all(&answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// No hop-by-hop field of a backend's answer, nor a field its `Connection` names, reaches an
/// HTTP/1.1 client, whatever else the head holds; a lone `keep-alive` leaves the connection
/// reusable. HAProxy on the same bytes removes `Connection` (and `Keep-Alive`,
/// `Proxy-Connection`, `Upgrade` on a non-101) too.
#[tokio::test]
async fn no_hop_by_hop_field_of_an_answer_reaches_the_client() {
    let cases: [&str; 9] = [
        "Connection: keep-alive\r\nKeep-Alive: timeout=5, max=100\r\n",
        "Connection: X-Secret\r\nX-Secret: 1\r\n",
        "Connection: keep-alive\r\nConnection: x-secret, X-Other\r\nX-Secret: 1\r\nX-Other: 2\r\n",
        "X-Secret: 1\r\nConnection: KEEP-ALIVE\r\nconnection: X-SECRET\r\n",
        "Proxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X-T\r\nUpgrade: h2c\r\n",
        "Connection: upgrade\r\nUpgrade: websocket\r\n",
        "Connection:\r\n",
        "Connection: keep-alive, keep-alive\r\nKeep-Alive: 5\r\n",
        "Connection: keep-alive\r\n",
    ];
    let hop = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "transfer-encoding",
        "x-secret",
        "x-other",
    ];
    for fields_sent in cases {
        let backend = always(ok_with(fields_sent)).await;
        let (_balancer, addr) = balancer(&[backend.addr], "", "").await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        for _ in 0..3 {
            let (head, body) = ask(&mut stream, &mut buf, "GET", "/").await;
            assert!(head.starts_with("HTTP/1.1 200"), "{fields_sent:?}: {head}");
            assert_eq!(body, b"ok", "{fields_sent:?}");
            let leaked: Vec<_> = fields(&head)
                .into_iter()
                .filter(|(name, _)| hop.contains(&name.as_str()))
                .collect();
            assert!(leaked.is_empty(), "{fields_sent:?}: {leaked:?} in {head}");
        }
        // Nothing said `close`: one backend connection carried the three.
        assert_eq!(backend.accepted(), 1, "{fields_sent:?}");
    }
}

/// Bodies around the size of the first read of an answer (2 KB with its head): each arrives
/// whole and byte exact, and the connection carries the next request.
#[tokio::test]
async fn bodies_at_the_first_reads_boundary_arrive_whole_and_the_connection_goes_on() {
    let head_len = |n: usize| format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").len();
    for total in [2047, 2048, 2049, 4096, 8192, 8193] {
        let n = (1..total).find(|&n| head_len(n) + n == total).unwrap();
        let body: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
        let answer = [
            format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").into_bytes(),
            body.clone(),
        ]
        .concat();
        let backend = always(answer).await;
        let (_balancer, addr) = balancer(&[backend.addr], "", "").await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        for _ in 0..3 {
            let (head, got) = ask(&mut stream, &mut buf, "GET", "/").await;
            assert!(head.starts_with("HTTP/1.1 200"), "{total}: {head}");
            assert!(
                got == body,
                "{total}: {} bytes, not the {n} sent",
                got.len()
            );
        }
        assert_eq!(backend.accepted(), 1, "{total}");
    }
}

/// A backend that sends fewer bytes than its `Content-Length` and closes: the client gets no
/// complete answer (its connection ends), the backend is charged, and the next request goes
/// to a new connection.
#[tokio::test]
async fn a_body_shorter_than_its_length_is_cut_and_charged() {
    let backend = RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).await.is_some() {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 10\r\n\r\nshort",
                )
                .await;
        }
    })
    .await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let got = tokio::time::timeout(DEADLINE, async {
        let head = read_head(&mut stream, &mut buf).await?;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        // The head said 10 bytes; the connection ends before them.
        crate::support::raw::read_exact_buf(&mut stream, &mut buf, 10).await
    })
    .await
    .expect("the client connection ends in time");
    assert!(
        got.is_none(),
        "a whole body from a backend that sent half of one"
    );
    wait_until("the backend charged for the cut body", || {
        !errors(&balancer, 0).is_empty()
    })
    .await;
}

/// Custom field names (kept by a per-thread cache of recent names) arrive as the backend
/// wrote them, with their own values, whatever names came before: near misses of a cached
/// name (`x_backend`, `x^backend`), more names than the cache keeps, and case variants.
#[tokio::test]
async fn custom_field_names_arrive_as_written_whatever_came_before() {
    let mut lines = String::new();
    let mut expected = Vec::new();
    for (name, value) in [
        ("X-Backend", "a"),
        ("x_backend", "b"),
        ("X^Backend", "c"),
        ("X-BACKEND", "d"),
        ("X-Request-Id2", "e"),
        ("x-request-id3", "f"),
        ("x-backen", "g"),
        ("x-backend-", "h"),
    ] {
        lines.push_str(&format!("{name}: {value}\r\n"));
        expected.push((name.to_ascii_lowercase(), value.to_owned()));
    }
    for i in 0..12 {
        lines.push_str(&format!("X-Name-{i}: v{i}\r\n"));
        expected.push((format!("x-name-{i}"), format!("v{i}")));
    }
    let backend = always(ok_with(&lines)).await;
    let (_balancer, addr) = balancer(&[backend.addr], "", "").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    for round in 0..4 {
        let (head, body) = ask(&mut stream, &mut buf, "GET", "/").await;
        assert_eq!(body, b"ok");
        let got: Vec<_> = fields(&head)
            .into_iter()
            .filter(|(name, _)| name.starts_with('x'))
            .collect();
        let mut want = expected.clone();
        let mut have = got.clone();
        want.sort();
        have.sort();
        assert_eq!(have, want, "round {round}: {head}");
    }
}

/// A `Retry-After` the backend names in its `Connection` is still read by capataz, the hop's
/// recipient, before the field is stripped (RFC 9110 section 7.6.1: such a field is for the
/// proxy): a `503` asking for relief with it is a shed, not an error that ejects the backend.
#[tokio::test]
async fn a_retry_after_named_in_connection_still_sheds_load() {
    let backend = RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while read_head(&mut stream, &mut buf).await.is_some() {
            let first = hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            let answer: &[u8] = if first {
                b"HTTP/1.1 503 Busy\r\nConnection: retry-after\r\nRetry-After: 1\r\nContent-Length: 2\r\n\r\nno"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            };
            if stream.write_all(answer).await.is_err() {
                return;
            }
        }
    })
    .await;
    let text = ConfigText::new(&[backend.entry("b0")])
        .extra(
            "retries = { attempts = 0 }\n\n[pools.web.active]\nkind = \"none\"\n\n\
             [pools.web.passive.load_shedding]\nenabled = true\nweight_percent = 50\n",
        )
        .build();
    let (balancer, mut events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let (head, _) = ask(&mut stream, &mut buf, "GET", "/").await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("retry-after"), "{head}");
    let shed = tokio::time::timeout(DEADLINE, async {
        loop {
            match events.recv().await {
                Ok(Notice::Shedding { shedding: true, .. }) => return,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("events closed"),
            }
        }
    })
    .await;
    assert!(shed.is_ok(), "the 503 asking for relief was not a shed");
}
