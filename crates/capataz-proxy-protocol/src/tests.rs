use std::net::SocketAddr;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

fn header(bytes: &[u8]) -> Header {
    match parse(bytes) {
        Ok(Parsed::Header(header)) => header,
        other => panic!("expected a header from {bytes:?}, got {other:?}"),
    }
}

fn proxied(source: &str, destination: &str) -> Addresses {
    Addresses::Proxied {
        source: addr(source),
        destination: addr(destination),
    }
}

#[test]
fn version_1_tcp4_gives_both_addresses_and_its_length() {
    let line = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n";
    let got = header(line);
    assert_eq!(
        got.addresses,
        proxied("192.0.2.1:56324", "198.51.100.2:443")
    );
    assert_eq!((got.version, got.length), (1, 45));
}

#[test]
fn version_1_tcp6_and_unknown() {
    let got = header(b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n");
    assert_eq!(got.addresses, proxied("[2001:db8::1]:1", "[::1]:65535"));
    let unknown = header(b"PROXY UNKNOWN ffff::1 whatever\r\n");
    assert_eq!(unknown.addresses, Addresses::Local);
    assert_eq!(header(b"PROXY UNKNOWN\r\n").length, 15);
}

#[test]
fn version_1_grammar_errors_are_malformed() {
    for bad in [
        &b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\n"[..],
        b"PROXY TCP4 192.0.2.1 198.51.100.2 56324\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443 9\r\n",
        b"PROXY TCP4 2001:db8::1 198.51.100.2 1 2\r\n",
        b"PROXY TCP6 192.0.2.1 ::1 1 2\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.2 65536 443\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.2 0443 443\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.2 +44 443\r\n",
        b"PROXY TCP4  192.0.2.1 198.51.100.2 1 2\r\n",
        b"PROXY UDP4 192.0.2.1 198.51.100.2 1 2\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2\xff\r\n",
    ] {
        assert!(
            matches!(parse(bad), Err(ParseError::Malformed(_))),
            "{:?} gave {:?}",
            String::from_utf8_lossy(bad),
            parse(bad)
        );
    }
}

#[test]
fn a_version_1_line_without_end_is_too_long_at_107_bytes() {
    let mut line = b"PROXY UNKNOWN ".to_vec();
    line.resize(106, b'x');
    assert_eq!(parse(&line), Ok(Parsed::Incomplete));
    line.push(b'x');
    assert_eq!(parse(&line), Err(ParseError::TooLong));
}

#[test]
fn anything_else_is_missing_and_so_is_http() {
    assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ParseError::Missing));
    assert_eq!(parse(b"\x16\x03\x01"), Err(ParseError::Missing));
    assert_eq!(parse(b"PROXX"), Err(ParseError::Missing));
    assert_eq!(parse(b""), Ok(Parsed::Incomplete));
    assert_eq!(parse(b"PRO"), Ok(Parsed::Incomplete));
    assert_eq!(parse(b"\r\n\r\n\0"), Ok(Parsed::Incomplete));
}

#[test]
fn version_2_ipv4_ipv6_local_and_unix() {
    let v4 = encode_v2(addr("192.0.2.1:56324"), addr("198.51.100.2:443"));
    let got = header(&v4);
    assert_eq!(
        got.addresses,
        proxied("192.0.2.1:56324", "198.51.100.2:443")
    );
    assert_eq!((got.version, got.length), (2, 28));

    let v6 = encode_v2(addr("[2001:db8::1]:7"), addr("[::1]:8"));
    assert_eq!(header(&v6).addresses, proxied("[2001:db8::1]:7", "[::1]:8"));
    assert_eq!(header(&v6).length, 52);

    // LOCAL with an IPv4 block: the addresses are ignored.
    let mut local = v4.clone();
    local[12] = 0x20;
    assert_eq!(header(&local).addresses, Addresses::Local);

    // AF_UNIX, 216 bytes of paths.
    let mut unix = V2_SIGNATURE.to_vec();
    unix.extend_from_slice(&[0x21, 0x31, 0, 216]);
    unix.resize(16 + 216, b'/');
    assert_eq!(header(&unix).addresses, Addresses::Local);
}

#[test]
fn version_2_tlvs_are_skipped_and_counted_in_the_length() {
    let mut with_tlv = encode_v2(addr("192.0.2.1:1"), addr("192.0.2.2:2"));
    // A PP2_TYPE_AUTHORITY TLV with "example.com".
    let tlv = [&[0x02u8, 0, 11][..], b"example.com"].concat();
    with_tlv[15] += tlv.len() as u8;
    with_tlv.extend_from_slice(&tlv);
    with_tlv.extend_from_slice(b"GET /");
    let got = header(&with_tlv);
    assert_eq!(got.length, 28 + 14);
    assert_eq!(got.addresses, proxied("192.0.2.1:1", "192.0.2.2:2"));
}

#[test]
fn version_2_errors() {
    let good = encode_v2(addr("192.0.2.1:1"), addr("192.0.2.2:2"));
    let with = |at: usize, value: u8| {
        let mut bytes = good.clone();
        bytes[at] = value;
        bytes
    };
    assert!(
        matches!(parse(&with(12, 0x11)), Err(ParseError::Malformed(_))),
        "version 1 byte"
    );
    assert!(
        matches!(parse(&with(12, 0x22)), Err(ParseError::Malformed(_))),
        "command 2"
    );
    assert!(
        matches!(parse(&with(13, 0x12)), Err(ParseError::Malformed(_))),
        "UDP over IPv4"
    );
    assert!(
        matches!(parse(&with(13, 0x41)), Err(ParseError::Malformed(_))),
        "family 4"
    );
    assert!(
        matches!(parse(&with(15, 4)), Err(ParseError::Malformed(_))),
        "too short for IPv4"
    );
    // A length past the limit is refused before its bytes arrive.
    let huge = [&good[..14], &[0xff, 0xff]].concat();
    assert_eq!(parse(&huge), Err(ParseError::TooLong));
    let at_limit = [&good[..14], &((MAX_HEADER - 16) as u16).to_be_bytes()[..]].concat();
    assert_eq!(parse(&at_limit), Ok(Parsed::Incomplete));
}

#[test]
fn mixed_families_are_sent_as_mapped_ipv6() {
    let line = encode_v1(addr("192.0.2.1:1"), addr("[2001:db8::2]:2"));
    assert_eq!(
        line,
        b"PROXY TCP6 ::ffff:192.0.2.1 2001:db8::2 1 2\r\n".to_vec()
    );
    let got = header(&encode_v2(addr("192.0.2.1:1"), addr("[2001:db8::2]:2")));
    assert_eq!(
        got.addresses,
        proxied("[::ffff:192.0.2.1]:1", "[2001:db8::2]:2")
    );
}

fn socket_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
    ]
}

proptest! {
    #[test]
    fn parse_never_panics_and_stays_in_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
        if let Ok(Parsed::Header(header)) = parse(&bytes) {
            prop_assert!(header.length <= bytes.len() && header.length <= MAX_HEADER);
        }
        if bytes.len() >= MAX_HEADER {
            prop_assert_ne!(parse(&bytes), Ok(Parsed::Incomplete));
        }
    }

    #[test]
    fn every_header_written_reads_back_and_every_prefix_asks_for_more(
        source in socket_addr(),
        destination in socket_addr(),
        v2 in any::<bool>(),
    ) {
        let bytes = if v2 { encode_v2(source, destination) } else { encode_v1(source, destination) };
        let got = match parse(&bytes) {
            Ok(Parsed::Header(header)) => header,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        prop_assert_eq!(got.length, bytes.len());
        let (Addresses::Proxied { source: s, destination: d }, want) =
            (got.addresses, same_family(source.ip(), destination.ip()))
        else {
            return Err(TestCaseError::fail("not proxied"));
        };
        prop_assert_eq!((s.ip(), d.ip()), (want.0, want.1));
        prop_assert_eq!((s.port(), d.port()), (source.port(), destination.port()));
        for end in 0..bytes.len() {
            prop_assert_eq!(parse(&bytes[..end]), Ok(Parsed::Incomplete));
        }
    }
}

#[tokio::test]
async fn read_header_takes_the_header_and_rewind_gives_back_what_followed() {
    let (mut client, mut server) = tokio::io::duplex(4096);
    let sent = [
        &encode_v1(addr("192.0.2.1:1000"), addr("127.0.0.1:80"))[..],
        b"GET / HTTP/1.1\r\n\r\n",
    ]
    .concat();
    let writer = tokio::spawn(async move {
        // Split anywhere: a byte at a time.
        for byte in sent {
            client.write_all(&[byte]).await.expect("write");
        }
        client
    });
    let (header, rest) = read_header(&mut server).await.expect("a header");
    assert_eq!(header.addresses, proxied("192.0.2.1:1000", "127.0.0.1:80"));
    let _client = writer.await.expect("writer");
    let mut rewound = Rewind::new(rest, server);
    let mut request = vec![0u8; 18];
    rewound.read_exact(&mut request).await.expect("the request");
    assert_eq!(request, b"GET / HTTP/1.1\r\n\r\n");
}

#[tokio::test]
async fn read_header_fails_on_http_and_on_an_early_close() {
    let (mut client, mut server) = tokio::io::duplex(4096);
    client
        .write_all(b"GET / HTTP/1.1\r\n\r\n")
        .await
        .expect("write");
    assert!(matches!(
        read_header(&mut server).await,
        Err(ReadError::Parse(ParseError::Missing))
    ));

    let (mut client, mut server) = tokio::io::duplex(4096);
    client
        .write_all(b"PROXY TCP4 1.2.3.4")
        .await
        .expect("write");
    drop(client);
    assert!(matches!(
        read_header(&mut server).await,
        Err(ReadError::Closed)
    ));
}

#[test]
fn local_headers_read_back_as_local_in_both_versions() {
    let v1 = encode_local(Version::V1);
    assert_eq!(v1, b"PROXY UNKNOWN\r\n");
    let v2 = encode_local(Version::V2);
    assert_eq!(v2.len(), 16);
    for bytes in [v1, v2] {
        let h = header(&bytes);
        assert_eq!(h.addresses, Addresses::Local);
        assert_eq!(h.length, bytes.len());
    }
    let (s, d) = (addr("192.0.2.7:40000"), addr("198.51.100.1:443"));
    assert_eq!(Version::V1.encode(s, d), encode_v1(s, d));
    assert_eq!(Version::V2.encode(s, d), encode_v2(s, d));
}
