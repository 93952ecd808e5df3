//! Section 7: bodies streamed both ways, chunked, and `Expect: 100-continue`.

use super::*;

#[tokio::test]
async fn a_5mb_chunked_response_streams_through_intact() {
    const LEN: usize = 5 * 1024 * 1024;
    let streamer = RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            if read_body(&mut stream, &mut buf, &head).await.is_none() {
                return;
            }
            hits.fetch_add(1, Ordering::SeqCst);
            let body = pattern(LEN);
            let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            // Uneven chunk sizes, so no frame boundary lines up with another.
            let sizes = [65_536, 1, 4_095, 32_768, 7, 100_000];
            let mut at = 0;
            for size in sizes.iter().cycle() {
                if at == LEN {
                    break;
                }
                let end = (at + size).min(LEN);
                out.extend_from_slice(format!("{:x}\r\n", end - at).as_bytes());
                out.extend_from_slice(&body[at..end]);
                out.extend_from_slice(b"\r\n");
                at = end;
                if out.len() > 256 * 1024 {
                    if stream.write_all(&out).await.is_err() {
                        return;
                    }
                    out.clear();
                }
            }
            out.extend_from_slice(b"0\r\n\r\n");
            if stream.write_all(&out).await.is_err() {
                return;
            }
        }
    })
    .await;
    let (balancer, _rx) = start(&config_text(&[streamer.entry("s")], "", QUIET)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let answer = client.get("/big").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body.len(), LEN);
    assert!(answer.body == pattern(LEN), "the body arrived altered");
    // The upstream connection went back to the pool: a second download works the same.
    let again = client.get("/big").await;
    assert_eq!(again.body.len(), LEN);
    assert_eq!(streamer.hits(), 2);
}

#[tokio::test]
async fn a_2mb_chunked_request_body_reaches_the_backend_intact() {
    let counter = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[counter.entry("counter")], "", QUIET)).await;
    let body = pattern(2 * 1024 * 1024);
    let mut request =
        b"POST /upload HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for chunk in body.chunks(50_000) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let addr = balancer.local_addrs()[0];
    let response = raw_roundtrip(addr, &request).await;
    let text = String::from_utf8_lossy(&response);
    assert_eq!(status_of(&response), Some(200), "{text}");
    let expected = format!("{} {:x}", body.len(), fnv(&body));
    assert!(text.ends_with(&expected), "{text}");
    assert_eq!(counter.hits(), 1);
}

#[tokio::test]
async fn expect_100_continue_gets_the_interim_answer_then_the_body_goes_through() {
    let counter = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[counter.entry("counter")], "", QUIET)).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0])
        .await
        .expect("connect");
    client
        .write_all(
            b"POST /u HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    // Like curl, the client holds its body back until told to go on.
    let mut buf = Vec::new();
    let interim = tokio::time::timeout(DEADLINE, read_head(&mut client, &mut buf))
        .await
        .expect("an interim answer in time")
        .expect("a head");
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    client.write_all(b"hello").await.unwrap();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut client, &mut buf))
        .await
        .expect("a final answer in time")
        .expect("a head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let body = read_body(&mut client, &mut buf, &head).await.expect("body");
    assert_eq!(body, format!("5 {:x}", fnv(b"hello")).as_bytes());
}
