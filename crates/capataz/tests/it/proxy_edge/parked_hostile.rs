//! A parked plain-TCP connection whose socket is registered anew in the IO driver at each park
//! (`downstream::park`), under what a client, an operator and a PROXY-protocol peer can do
//! around it: its `max_connections` slot held while parked and freed once, a reset while
//! parked, a reload while parked, and a PROXY-protocol listener's connections parking too.

use capataz_proxy_protocol::encode_v1;

use super::connections::{counted, expected, post, PARKING};
use super::*;
use crate::support::balancer::parse;
use crate::support::raw::{header, read_reply};
use crate::support::wait::wait_until;

/// A parked connection keeps its slot of a `max_connections = 1` listener through several
/// parks (a second client waits unserved), is served at each of its next requests, and frees
/// the slot once when it closes: the second client is then served, and the counts are right.
#[tokio::test]
async fn a_parked_connection_holds_its_one_slot_through_parks_and_frees_it_once() {
    let backend = counting_backend().await;
    let listener = format!("max_connections = 1\n{PARKING}");
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], &listener, QUIET)).await;
    let addr = balancer.local_addrs()[0];
    let mut first = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let (mut sent, mut received) = (0usize, 0usize);
    for round in 0..4 {
        let body = pattern(1000 + round);
        let request = post(&format!("/{round}"), &body);
        first.write_all(&request).await.unwrap();
        sent += request.len();
        let head = read_head(&mut first, &mut buf).await.expect("an answer");
        let answer = read_body(&mut first, &mut buf, &head)
            .await
            .expect("a body");
        assert_eq!(String::from_utf8(answer.clone()).unwrap(), expected(&body));
        received += head.len() + 4 + answer.len();
        let parks = balancer.parks();
        wait_until("parked", || balancer.parks() > parks).await;
    }
    // The slot is the parked connection's: a second client is taken by no accept.
    let mut second = TcpStream::connect(addr).await.unwrap();
    second.write_all(&post("/second", b"2")).await.unwrap();
    let mut second_buf = Vec::new();
    let early = tokio::time::timeout(
        Duration::from_millis(300),
        read_head(&mut second, &mut second_buf),
    )
    .await;
    assert!(early.is_err(), "served past the limit: {early:?}");
    assert_eq!(balancer.open_connections(), 1);
    drop(first);
    assert_eq!(counted(&mut second, &mut second_buf).await, expected(b"2"));
    assert_eq!(balancer.open_connections(), 1, "the slot freed once");
    drop(second);
    wait_until("both gone", || {
        balancer.open_connections() == 0 && balancer.parked_connections() == 0
    })
    .await;
    let second_sent = post("/second", b"2").len();
    let text = crate::support::balancer::metrics_text(&balancer);
    let value = |family: &str| -> f64 {
        text.lines()
            .find(|line| line.starts_with(&format!("{family}{{")))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(
        value("capataz_client_received_bytes_total"),
        (sent + second_sent) as f64
    );
    assert!(value("capataz_client_sent_bytes_total") > received as f64);
}

/// A client that resets its parked connection (an RST, not a FIN): the connection ends at
/// once, counted closed and no longer parked; a client that half-closes likewise.
#[tokio::test]
async fn a_parked_connection_reset_or_half_closed_by_its_client_ends() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    for reset in [true, false] {
        let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
        let mut buf = Vec::new();
        stream.write_all(&post("/1", b"x")).await.unwrap();
        assert_eq!(counted(&mut stream, &mut buf).await, expected(b"x"));
        wait_until("parked", || balancer.parked_connections() == 1).await;
        if reset {
            stream.set_zero_linger().unwrap();
            drop(stream);
        } else {
            stream.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut rest)).await;
            assert!(matches!(read, Ok(Ok(0))), "{read:?} {rest:?}");
        }
        wait_until("the connection is gone", || {
            balancer.open_connections() == 0 && balancer.parked_connections() == 0
        })
        .await;
    }
}

/// A reload while a connection is parked (its routes changed to another pool): the parked
/// connection's next request is served by the new routes, on the same connection.
#[tokio::test]
async fn a_connection_parked_across_a_reload_serves_by_the_new_config() {
    let old = counting_backend().await;
    let new = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[old.entry("old")], PARKING, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    stream.write_all(&post("/1", b"one")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"one"));
    wait_until("parked", || balancer.parked_connections() == 1).await;
    let text = config_text(&[new.entry("new")], PARKING, QUIET);
    balancer
        .reload(&parse(&text))
        .await
        .expect("the reload applies");
    assert_eq!(balancer.parked_connections(), 1, "still parked");
    stream.write_all(&post("/2", b"two")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"two"));
    assert_eq!((old.hits(), new.hits()), (1, 1));
    wait_until("parked again", || balancer.parks() >= 2).await;
    stream.write_all(&post("/3", b"three")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"three"));
    assert_eq!(new.hits(), 2);
}

/// A PROXY-protocol listener's connection parks and is served after each park, the client its
/// header named still the one the backend is told of.
#[tokio::test]
async fn a_proxy_protocol_connection_parks_and_keeps_its_named_client() {
    let b = backends(&["a"]).await;
    let listener = format!("proxy_protocol = {{ trusted = [\"127.0.0.0/8\"] }}\n{PARKING}");
    let text = ConfigText::sims(&b)
        .listener(&listener)
        .extra("[pools.web.active]\nkind = \"none\"\n")
        .build();
    let (balancer, _rx) = start(&text).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let header_v1 = encode_v1(
        "192.0.2.7:40000".parse().unwrap(),
        "198.51.100.1:443".parse().unwrap(),
    );
    let request = b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n";
    stream
        .write_all(&[&header_v1[..], request].concat())
        .await
        .unwrap();
    let mut buf = Vec::new();
    for round in 0..3 {
        let reply = tokio::time::timeout(DEADLINE, read_reply(&mut stream, &mut buf))
            .await
            .expect("in time")
            .expect("an answer");
        assert_eq!(reply.status, 200, "round {round}");
        assert_eq!(
            header(&reply.head, "x-seen-xff"),
            Some("192.0.2.7"),
            "round {round}"
        );
        wait_until("parked", || balancer.parks() > round).await;
        stream.write_all(request).await.unwrap();
    }
    let reply = read_reply(&mut stream, &mut buf).await.expect("an answer");
    assert_eq!(reply.status, 200);
    assert_eq!(b[0].traffic_hits(), 4);
}

/// A drain with parked connections: one whose client sends its next request gets it answered
/// with `Connection: close` (its hyper connection built again while draining) and is closed
/// after it; one whose client sends nothing is closed after the drain's grace second, without
/// a stray byte; and the shutdown ends with them.
#[tokio::test]
async fn parked_connections_while_draining_answer_with_connection_close_or_close_quietly() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let addr = balancer.local_addrs()[0];
    let mut clients = Vec::new();
    for n in 0..2 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let body = pattern(100 + n);
        stream.write_all(&post("/first", &body)).await.unwrap();
        let answer = read_reply(&mut stream, &mut buf).await.expect("an answer");
        assert_eq!(answer.status, 200, "{}", answer.head);
        clients.push(stream);
    }
    wait_until("both parked", || balancer.parked_connections() == 2).await;
    let shutdown = tokio::spawn(balancer.shutdown(Duration::from_secs(30)));
    // Draining has begun once the listener refuses new connections.
    let end = std::time::Instant::now() + DEADLINE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(std::time::Instant::now() < end, "still accepting");
        tokio::task::yield_now().await;
    }
    let mut quiet = clients.pop().unwrap();
    let mut asking = clients.pop().unwrap();
    let body = pattern(300);
    asking.write_all(&post("/next", &body)).await.unwrap();
    let mut buf = Vec::new();
    let answer = read_reply(&mut asking, &mut buf)
        .await
        .expect("the parked connection's next request answered while draining");
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert!(
        crate::support::raw::has_token(&answer.head, "connection", "close"),
        "{}",
        answer.head
    );
    assert!(crate::support::raw::closes(&mut asking).await, "still open");
    let mut stray = Vec::new();
    let read = tokio::time::timeout(DEADLINE, quiet.read_to_end(&mut stray)).await;
    assert!(read.is_ok(), "the quiet parked connection stays open");
    assert!(stray.is_empty(), "a stray answer: {stray:?}");
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .expect("the shutdown ends with its connections")
        .expect("the shutdown task");
}
