//! The event stream (`GET /events`): transitions as Server-Sent Events.

use super::*;

#[tokio::test]
async fn the_event_stream_carries_transitions() {
    let (b, r) = two_backends().await;
    let mut stream = TcpStream::connect(r.admin).await.unwrap();
    stream
        .write_all(format!("GET /events HTTP/1.1\r\nHost: {}\r\n\r\n", r.admin).as_bytes())
        .await
        .unwrap();
    let mut seen = String::new();
    let end = tokio::time::Instant::now() + DEADLINE;
    // The greeting comes once the stream is subscribed, so nothing after it is missed.
    read_until(&mut stream, &mut seen, end, |s| {
        s.contains(": capataz events")
    })
    .await;
    let head = seen.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{seen}");
    assert!(head.contains("content-type: text/event-stream"), "{seen}");

    b[1].set_health(Mode::Status(503));
    let message = |s: &str| -> Option<Value> {
        s.split("event: transition\ndata: ")
            .skip(1)
            .filter_map(|rest| rest.split_once('\n'))
            .filter_map(|(line, _)| serde_json::from_str::<Value>(line).ok())
            .find(|data| data["backend"] == "b" && data["to"] == "DOWN")
    };
    read_until(&mut stream, &mut seen, end, |s| message(s).is_some()).await;
    let data = message(&seen).unwrap();
    assert_eq!(text(&data, "/type"), "transition");
    assert_eq!(text(&data, "/pool"), "web");
    assert_eq!(text(&data, "/from"), "UP");
    assert_eq!(text(&data, "/side"), "active");
    let reason = text(&data, "/reason");
    assert!(reason.contains("3 consecutive failed probes"), "{reason}");
    text(&data, "/time");
}

/// Reads from `stream` into `seen` until `done(seen)`, failing at `end`.
async fn read_until(
    stream: &mut TcpStream,
    seen: &mut String,
    end: tokio::time::Instant,
    done: impl Fn(&str) -> bool,
) {
    let mut buf = [0u8; 4096];
    while !done(seen) {
        let n = tokio::time::timeout_at(end, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("the event stream went quiet: {seen}"))
            .expect("read the event stream");
        assert!(n > 0, "the event stream closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}
