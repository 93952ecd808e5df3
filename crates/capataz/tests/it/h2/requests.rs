//! The request path over HTTP/2: what an HTTP/1.1 backend receives, and what the client gets.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::io::AsyncWriteExt;

use super::{balancer, echo_backend};
use crate::support::balancer::{backends, pairs, start, ConfigText};
use crate::support::h2client::{channel, connect, empty, full, request};
use crate::support::h2frames::{self, handshake, headers, hpack, read_to_end};
use crate::support::raw::{header, roundtrip};
use crate::support::DEADLINE;

/// The backend's view of one request, from the echo backend's body.
fn backend_head(text: &str) -> (String, Vec<(String, String)>, String) {
    let (head, body) = text.split_once("\n\n").expect("head and body");
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or_default().to_owned();
    let fields = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (line, fields, body.to_owned())
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[tokio::test]
async fn a_get_over_h2c_reaches_an_http1_backend_with_host_from_authority() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let mut conn = connect(addr).await;
    let answer = conn.get("app.test:8080", "/a/b?c=1").await;
    assert_eq!(answer.status, StatusCode::OK);
    let (line, fields, body) = backend_head(&answer.text());
    assert_eq!(line, "GET /a/b?c=1 HTTP/1.1");
    assert_eq!(field(&fields, "host"), ["app.test:8080"]);
    assert_eq!(field(&fields, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(field(&fields, "x-forwarded-proto"), ["http"]);
    assert_eq!(body, "body=0");
    // No request framing field for a bodiless request.
    assert!(field(&fields, "transfer-encoding").is_empty(), "{fields:?}");
    // The answer's hop-by-hop fields stay behind; its own ones come through.
    assert_eq!(answer.header("x-backend"), Some("echo"));
    for gone in [
        "connection",
        "keep-alive",
        "x-hop",
        "proxy-connection",
        "upgrade",
        "transfer-encoding",
    ] {
        assert!(
            answer.header(gone).is_none(),
            "{gone}: {:?}",
            answer.headers
        );
    }
}

#[tokio::test]
async fn request_bodies_reach_the_backend_sized_or_chunked() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let mut conn = connect(addr).await;

    // A whole body: hyper's client sends its content-length, the backend gets it.
    let sized = conn
        .send(request(
            Method::POST,
            "app.test",
            "/sized",
            full(&b"hello"[..]),
        ))
        .await
        .unwrap();
    let (line, fields, body) = backend_head(&sized.text());
    assert_eq!(line, "POST /sized HTTP/1.1");
    assert_eq!(field(&fields, "content-length"), ["5"]);
    assert_eq!(body, "body=5");

    // DATA frames of unknown total length: chunked to the backend, whole.
    let (sender, streamed) = channel();
    let send = tokio::spawn(async move {
        for _ in 0..10 {
            sender.send(Bytes::from(vec![b'x'; 10_000])).await.unwrap();
        }
    });
    let answer = conn
        .send(request(Method::PUT, "app.test", "/streamed", streamed))
        .await
        .unwrap();
    send.await.unwrap();
    let (line, fields, body) = backend_head(&answer.text());
    assert_eq!(line, "PUT /streamed HTTP/1.1");
    assert_eq!(field(&fields, "transfer-encoding"), ["chunked"]);
    assert!(field(&fields, "content-length").is_empty());
    assert_eq!(body, "body=100000");
}

/// One stream at a time on one connection: between two requests the connection has no stream,
/// and h2 (patched, `vendor/h2`) frees its read and write buffers, then allocates them again
/// for the next frame. Heads and bodies larger than those buffers (8 and 16 KB) must still
/// come through whole, both ways, request after request.
#[tokio::test]
async fn requests_one_at_a_time_larger_than_the_buffers_come_through_whole() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("echo")], "max_header_bytes = 65536", "").await;
    let mut conn = connect(addr).await;
    for round in 0..6u8 {
        // A 40 KB field: HEADERS and CONTINUATION frames in, and the backend's echo of the
        // head, over 40 KB, as the answer's DATA frames out.
        let value = char::from(b'a' + round).to_string().repeat(40_000);
        let mut big = request(
            Method::POST,
            "app.test",
            &format!("/round/{round}"),
            full(vec![round; 50_000]),
        );
        big.headers_mut()
            .insert("x-big", value.parse().expect("a valid field value"));
        let answer = conn.send(big).await.expect("a big request answered");
        assert_eq!(answer.status, StatusCode::OK, "round {round}");
        let (line, fields, body) = backend_head(&answer.text());
        assert_eq!(line, format!("POST /round/{round} HTTP/1.1"));
        assert_eq!(field(&fields, "x-big"), [value.as_str()], "round {round}");
        assert_eq!(body, "body=50000", "round {round}");
        // And a small one in between, on the same connection.
        let small = conn.get("app.test", "/small").await;
        assert_eq!(small.status, StatusCode::OK, "round {round}");
        assert!(small.text().ends_with("body=0"), "{}", small.text());
    }
    assert_eq!(backend.hits(), 12);
}

#[tokio::test]
async fn te_trailers_is_accepted_and_not_relayed_and_forwarded_headers_append() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let mut conn = connect(addr).await;
    let mut req = request(Method::GET, "app.test", "/", empty());
    req.headers_mut()
        .insert("te", http::HeaderValue::from_static("trailers"));
    req.headers_mut().insert(
        "x-forwarded-for",
        http::HeaderValue::from_static("10.1.2.3"),
    );
    let answer = conn.send(req).await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    let (_, fields, _) = backend_head(&answer.text());
    assert!(field(&fields, "te").is_empty(), "{fields:?}");
    assert_eq!(field(&fields, "x-forwarded-for"), ["10.1.2.3, 127.0.0.1"]);
}

#[tokio::test]
async fn forwarded_headers_off_leaves_the_request_alone_over_h2() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("echo")], "forwarded_headers = false", "").await;
    let mut conn = connect(addr).await;
    let answer = conn.get("app.test", "/").await;
    let (_, fields, _) = backend_head(&answer.text());
    assert!(field(&fields, "x-forwarded-for").is_empty(), "{fields:?}");
    assert!(field(&fields, "x-forwarded-proto").is_empty(), "{fields:?}");
}

#[tokio::test]
async fn routing_by_authority_picks_the_pool() {
    let web = echo_backend("web-1").await;
    let api = echo_backend("api-1").await;
    let text = ConfigText::new(&[web.entry("web-1")])
        .listener(
            "h2c = true\n\n\
             [[listeners.routes]]\nhost = \"api.test\"\npool = \"api\"\n\n\
             [[listeners.routes]]\npool = \"web\"\n",
        )
        .extra(&format!(
            "[pools.web.active]\nkind = \"none\"\n\n\
             [pools.api]\nbackends = [{{ name = \"api-1\", address = \"{}\" }}]\n\
             [pools.api.active]\nkind = \"none\"\n",
            api.addr
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut conn = connect(addr).await;
    assert_eq!(
        conn.get("api.test", "/x").await.header("x-backend"),
        Some("api-1")
    );
    assert_eq!(
        conn.get("API.test:80", "/x").await.header("x-backend"),
        Some("api-1")
    );
    assert_eq!(
        conn.get("www.test", "/x").await.header("x-backend"),
        Some("web-1")
    );
    // A Host field that disagrees with :authority is refused, as an absolute-form target
    // that disagrees with Host is over HTTP/1.1.
    let mut req = request(Method::GET, "api.test", "/", empty());
    req.headers_mut()
        .insert("host", http::HeaderValue::from_static("www.test"));
    let answer = conn.send(req).await.unwrap();
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!((web.hits(), api.hits()), (1, 2));
}

#[tokio::test]
async fn many_concurrent_streams_on_one_connection_spread_over_backends() {
    let sims = backends(&["a", "b", "c"]).await;
    let (_balancer, addr, _events) = balancer(&pairs(&sims), "", "").await;
    let conn = connect(addr).await;
    let mut tasks = Vec::new();
    for i in 0..90 {
        let mut sender = conn.sender.clone();
        tasks.push(tokio::spawn(async move {
            sender.ready().await.unwrap();
            let response = sender
                .send_request(request(Method::GET, "app.test", &format!("/{i}"), empty()))
                .await
                .unwrap();
            response.status()
        }));
    }
    for task in tasks {
        let status = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    let hits: Vec<u64> = sims.iter().map(|b| b.traffic_hits()).collect();
    assert_eq!(hits.iter().sum::<u64>(), 90, "{hits:?}");
    assert!(
        hits.iter().all(|&h| h >= 20),
        "round robin spreads the streams: {hits:?}"
    );
}

#[tokio::test]
async fn connect_over_h2_gets_501_and_reaches_no_backend() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let mut conn = connect(addr).await;
    let req = http::Request::builder()
        .method(Method::CONNECT)
        .uri("app.test:443")
        .body(empty())
        .unwrap();
    let answer = conn.send(req).await.unwrap();
    assert_eq!(answer.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(backend.hits(), 0);
}

#[tokio::test]
async fn a_request_without_authority_or_host_gets_400() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    let block = hpack(&[(":method", "GET"), (":scheme", "http"), (":path", "/")]);
    write
        .write_all(&headers(1, &block, true, true))
        .await
        .unwrap();
    let answer = loop {
        let frame = h2frames::read_frame(&mut read).await.expect("an answer");
        if frame.kind == h2frames::HEADERS {
            break frame;
        }
    };
    // `:status: 400` is entry 12 of HPACK's static table: one byte, 0x80 | 12.
    assert_eq!(answer.stream, 1);
    assert_eq!(answer.payload.first(), Some(&0x8c), "{answer:?}");
    drop(write);
    let _ = read_to_end(&mut read, Duration::from_secs(1)).await;
    assert_eq!(backend.hits(), 0);
}

#[tokio::test]
async fn http1_is_still_served_on_an_h2c_listener() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    // A request line that starts like the preface, then differs.
    for request in [
        &b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n"[..],
        b"PRI /x HTTP/1.1\r\nHost: app.test\r\n\r\n",
    ] {
        let reply = roundtrip(addr, request).await.expect("an answer");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(header(&reply.head, "x-backend"), Some("echo"));
    }
    assert_eq!(backend.hits(), 2);
}

#[tokio::test]
async fn a_listener_without_h2c_does_not_speak_http2() {
    let backend = echo_backend("echo").await;
    let text = ConfigText::new(&[backend.entry("echo")])
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _events) = start(&text).await;
    let stream = tokio::net::TcpStream::connect(balancer.local_addrs()[0])
        .await
        .unwrap();
    let (mut read, mut write) = stream.into_split();
    let mut start = h2frames::PREFACE.to_vec();
    start.extend(h2frames::settings(&[]));
    write.write_all(&start).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        DEADLINE,
        tokio::io::AsyncReadExt::read_to_end(&mut read, &mut answer),
    )
    .await
    .expect("the connection ends");
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 "),
        "an HTTP/1.1 answer or nothing, never HTTP/2: {:?}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(backend.hits(), 0);
}

#[tokio::test]
async fn connection_specific_fields_in_an_h2_request_reset_the_stream() {
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    for (id, field) in [(1, ("connection", "keep-alive")), (3, ("te", "gzip"))] {
        let mut block = h2frames::request_block("GET", "app.test", "/");
        block.extend(hpack(&[field]));
        write
            .write_all(&headers(id, &block, true, true))
            .await
            .unwrap();
        let reset = loop {
            let frame = h2frames::read_frame(&mut read).await.expect("frames");
            if frame.kind == h2frames::RST_STREAM {
                break frame;
            }
        };
        assert_eq!(reset.stream, id);
        // PROTOCOL_ERROR
        assert_eq!(reset.payload, 1u32.to_be_bytes(), "{field:?}");
    }
    assert_eq!(backend.hits(), 0);
}

#[tokio::test]
async fn streams_side_by_side_reuse_their_own_backend_connections() {
    // A backend that answers only once 20 requests are waiting: each round of 20 streams
    // needs 20 backend connections at once.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let backend = crate::support::raw::RawBackend::start(move |mut stream, hits| {
        let barrier = barrier.clone();
        async move {
            let mut buf = Vec::new();
            while crate::support::raw::read_head(&mut stream, &mut buf)
                .await
                .is_some()
            {
                hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                barrier.wait().await;
                let answer = crate::support::raw::ok_answer("ok");
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
    let conn = connect(addr).await;
    for round in 1..=3 {
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let mut sender = conn.sender.clone();
            tasks.push(tokio::spawn(async move {
                sender.ready().await.unwrap();
                let req = request(Method::GET, "app.test", "/", empty());
                sender.send_request(req).await.unwrap().status()
            }));
        }
        for task in tasks {
            let status = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
            assert_eq!(status, StatusCode::OK);
        }
        assert_eq!(backend.hits(), 20 * round);
    }
    // The first round opened 20 connections; the next rounds found them in the client
    // connection's own idle set (8 kept would have meant 12 new ones per round).
    assert_eq!(backend.accepted(), 20);
}

/// Whole answers (the body in the same write as the head) with a lone `Connection:
/// keep-alive`, a `close` in any case, fields a `Connection` names, and stray bytes after the
/// body: an HTTP/2 client gets each body whole and none of the hop-by-hop fields, and no
/// stream is answered from a connection that said `close` or carried stray bytes.
#[tokio::test]
async fn whole_answers_reach_an_h2_client_without_hop_by_hop_fields() {
    let backend = crate::support::raw::RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        let mut spent = false;
        let poison: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nPOISON";
        while let Some(head) = crate::support::raw::read_head(&mut stream, &mut buf).await {
            let n = hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let fields = [
                "Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n",
                "Connection: CLOSE\r\n",
                "Connection: keep-alive\r\nConnection: x-secret\r\nX-Secret: 1\r\n",
                "Connection: keep-alive\r\n",
            ][n as usize % 4];
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let mut answer = format!(
                "HTTP/1.1 200 OK\r\n{fields}Content-Length: {}\r\n\r\n{path}",
                path.len()
            )
            .into_bytes();
            let stray = n % 4 == 3;
            if stray {
                answer.extend_from_slice(poison);
            }
            let answer = if spent { poison.to_vec() } else { answer };
            spent |= stray || fields.contains("CLOSE");
            if stream.write_all(&answer).await.is_err() {
                return;
            }
        }
    })
    .await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("raw")], "", "").await;
    let mut conn = connect(addr).await;
    for i in 0..16 {
        let path = format!("/item/{i}");
        let answer = conn.get("app.test", &path).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        assert_eq!(answer.text(), path);
        for gone in ["connection", "keep-alive", "x-secret"] {
            assert!(
                answer.header(gone).is_none(),
                "{gone}: {:?}",
                answer.headers
            );
        }
    }
}
