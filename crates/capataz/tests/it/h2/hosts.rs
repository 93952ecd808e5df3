//! Hostile `:authority` and `Host` values over h2c, as raw frames (the Host check by a table,
//! `proxy::headers::REG_NAME_BYTE`): a valid one reaches the backend, every other is refused
//! (400, or the stream reset by h2 for a value it cannot take) and reaches nothing, and the
//! connection serves on.

use tokio::io::AsyncWriteExt;

use super::{balancer, echo_backend};
use crate::support::h2frames::{handshake, headers, hpack, read_frame};
use crate::support::DEADLINE;

const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;

/// How the balancer answered one stream: its status (from the static table's `:status`
/// entries, which is how a small status is encoded) or the reset's code.
#[derive(Debug, PartialEq)]
enum Answer {
    Status(u16),
    Reset(u32),
}

#[tokio::test]
async fn hostile_authorities_and_hosts_are_refused_and_reach_no_backend() {
    let backend = echo_backend("b0").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    let long = "a".repeat(4000);
    let good: Vec<Vec<(&str, &str)>> = vec![
        vec![(":authority", "app.test")],
        vec![(":authority", "app.test:8080")],
        vec![(":authority", "[::1]:80")],
        vec![(":authority", "127.0.0.1")],
        // Percent-encoding and sub-delims: the `http` crate refuses them in `:authority` (the
        // stream is reset before capataz sees it), capataz takes them in a Host field.
        vec![("host", "a%41b.test")],
        vec![("host", "a!$&'()*+,;=-._~z")],
        vec![("host", "a!$&'()*+,;=-._~z:81")],
        vec![(":authority", &long)],
        vec![("host", "app.test")],
        vec![(":authority", "app.test"), ("host", "app.test")],
    ];
    let bad: Vec<Vec<(&str, &str)>> = vec![
        vec![(":authority", "")],
        vec![(":authority", "a b")],
        vec![(":authority", "a%zz")],
        vec![(":authority", "a%4")],
        vec![(":authority", "[::1")],
        vec![(":authority", "[::1]x")],
        vec![(":authority", "[]")],
        vec![(":authority", "[v1.x]")],
        vec![(":authority", "host:80:90")],
        vec![(":authority", "app.test:8o")],
        vec![(":authority", "a\u{1}b")],
        vec![(":authority", "a\tb")],
        vec![(":authority", "\u{e9}.test")],
        vec![(":authority", "user@app.test")],
        vec![(":authority", "a\"b")],
        vec![(":authority", "a<b>")],
        vec![(":authority", "a\\b")],
        vec![(":authority", "a^b")],
        vec![(":authority", "a{b}")],
        vec![(":authority", "a|b")],
        vec![(":authority", "a`b")],
        vec![("host", "a b")],
        vec![("host", "app.test/x")],
        vec![("host", "a#b")],
        vec![("host", "a?b")],
        vec![("host", "\u{e9}.test")],
        vec![(":authority", "app.test"), ("host", "other.test")],
        vec![],
    ];
    let mut id = 1u32;
    let mut ask = |fields: &[(&str, &str)]| {
        let mut all = vec![(":method", "GET"), (":scheme", "http"), (":path", "/")];
        all.extend_from_slice(fields);
        let frame = headers(id, &hpack(&all), true, true);
        id += 2;
        (id - 2, frame)
    };
    let mut hits = 0;
    for (expect_good, cases) in [(true, &good), (false, &bad)] {
        for fields in cases {
            let (stream, frame) = ask(fields);
            write.write_all(&frame).await.unwrap();
            let answer = tokio::time::timeout(DEADLINE, async {
                loop {
                    let frame = read_frame(&mut read).await.expect("the connection stays");
                    if frame.stream != stream {
                        continue;
                    }
                    match frame.kind {
                        HEADERS => {
                            return Answer::Status(match frame.payload[0] {
                                0x88 => 200,
                                0x8c => 400,
                                0x8d => 404,
                                other => u16::from(other),
                            })
                        }
                        RST_STREAM => {
                            let code = frame.payload[..4].try_into().unwrap();
                            return Answer::Reset(u32::from_be_bytes(code));
                        }
                        _ => {}
                    }
                }
            })
            .await
            .expect("an answer in time");
            if expect_good {
                hits += 1;
                assert_eq!(answer, Answer::Status(200), "{fields:?}");
            } else {
                assert!(
                    matches!(answer, Answer::Status(400) | Answer::Reset(1)),
                    "{fields:?}: {answer:?}"
                );
            }
            assert_eq!(backend.hits(), hits, "{fields:?}: {answer:?}");
        }
    }
}
