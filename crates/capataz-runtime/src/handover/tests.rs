//! The handover's parsing and checks.

use super::*;

#[test]
fn parse_entries_reads_descriptors_and_both_addresses() {
    let (entries, unix) = parse_entries(
        "listener:7=127.0.0.1:0=127.0.0.1:40123,admin:9=[::1]:80=[::1]:80,unix:11=/run/a%2Cb.sock",
    )
    .unwrap();
    assert_eq!(unix, vec![(11, PathBuf::from("/run/a,b.sock"))]);
    assert_eq!(
        entries,
        vec![
            (
                Kind::Listener,
                7,
                "127.0.0.1:0".parse().unwrap(),
                "127.0.0.1:40123".parse().unwrap()
            ),
            (
                Kind::Admin,
                9,
                "[::1]:80".parse().unwrap(),
                "[::1]:80".parse().unwrap()
            ),
        ]
    );
    assert_eq!(parse_entries("").unwrap(), (vec![], vec![]));
}

#[test]
fn parse_entries_refuses_hostile_text() {
    for text in [
        "listener:7",
        "7=127.0.0.1:1=127.0.0.1:1",
        "other:7=127.0.0.1:1=127.0.0.1:1",
        "listener:7=127.0.0.1:1",
        "listener:7=127.0.0.1:1=127.0.0.1:1=x",
        "listener:x=127.0.0.1:1=127.0.0.1:1",
        "listener:7=localhost:1=127.0.0.1:1",
        "listener:7=127.0.0.1:1=127.0.0.1:1,admin:7=127.0.0.1:2=127.0.0.1:2",
        ",",
        "listener:-1=127.0.0.1:1=127.0.0.1:1,",
        "unix:7",
        "unix:x=/a.sock",
        "unix:7=a.sock",
        "unix:7=/a.sock,listener:7=127.0.0.1:1=127.0.0.1:1",
    ] {
        assert!(parse_entries(text).is_err(), "{text:?} was taken");
    }
    let many = (0..=MAX_SOCKETS)
        .map(|i| format!("listener:{}=127.0.0.1:1=127.0.0.1:1", i + 3))
        .collect::<Vec<_>>()
        .join(",");
    assert!(parse_entries(&many).is_err());
}

#[test]
fn checked_fd_refuses_standard_streams_and_closed_descriptors() {
    assert!(checked_fd(0).is_err());
    assert!(checked_fd(2).is_err());
    assert!(checked_fd(-5).is_err());
    assert!(checked_fd(RawFd::MAX).is_err());
}

#[test]
fn a_descriptor_that_is_not_a_listening_tcp_socket_is_refused() {
    let (a, _b) = UnixStream::pair().unwrap();
    assert!(listening_tcp(OwnedFd::from(a)).is_err());
    let connected = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stream = std::net::TcpStream::connect(connected.local_addr().unwrap()).unwrap();
    assert!(listening_tcp(OwnedFd::from(stream)).is_err());
    assert!(listening_tcp(OwnedFd::from(connected)).is_ok());
}

#[test]
fn take_matches_the_configured_address_then_the_bound_one_once() {
    let socket = |addr: &str| std::net::TcpListener::bind(addr).unwrap();
    let (ours, _theirs) = UnixStream::pair().unwrap();
    let a = socket("127.0.0.1:0");
    let a_bound = a.local_addr().unwrap();
    let b = socket("127.0.0.1:0");
    let b_bound = b.local_addr().unwrap();
    let mut inherited = Inherited {
        sockets: vec![
            Handed {
                kind: Kind::Admin,
                configured: "127.0.0.1:0".parse().unwrap(),
                bound: b_bound,
                socket: b,
            },
            Handed {
                kind: Kind::Listener,
                configured: "127.0.0.1:0".parse().unwrap(),
                bound: a_bound,
                socket: a,
            },
        ],
        unix: Vec::new(),
        udp: Vec::new(),
        ready: ours,
    };
    let any = "127.0.0.1:0".parse().unwrap();
    let taken = inherited.take(Kind::Listener, any).unwrap();
    assert_eq!(taken.local_addr().unwrap(), a_bound);
    assert!(inherited.take(Kind::Listener, any).is_none());
    assert!(inherited.take(Kind::Listener, a_bound).is_none());
    assert!(
        inherited.take(Kind::Listener, b_bound).is_none(),
        "the admin socket"
    );
    assert_eq!(inherited.untaken(), vec![b_bound]);
    assert!(inherited.take(Kind::Admin, b_bound).is_some());
    assert!(inherited.untaken().is_empty());
}

#[test]
fn the_quic_variable_without_the_listeners_one_is_refused() {
    // It was ignored: the process started as if nothing had been handed over.
    let quic = Some(OsString::from("7=9=a1ff"));
    let error = Inherited::from_vars(None, None, quic).expect_err("taken");
    assert!(
        error.to_string().contains("CAPATAZ_HANDOVER_QUIC"),
        "{error}"
    );
    assert!(Inherited::from_vars(None, None, None).unwrap().is_none());
}
