use crate::hpack::{Decoder, Encoder, Header};

use http::header::{HeaderName, HeaderValue};

use bytes::BytesMut;
use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};
use rand::distributions::Slice;
use rand::rngs::StdRng;
use rand::{thread_rng, Rng, SeedableRng};

use std::io::Cursor;
use std::ops::ControlFlow;

const MAX_CHUNK: usize = 2 * 1024;

#[test]
fn hpack_fuzz() {
    let _ = env_logger::try_init();
    fn prop(fuzz: FuzzHpack) -> TestResult {
        fuzz.run();
        TestResult::from_bool(true)
    }

    QuickCheck::new()
        .tests(100)
        .quickcheck(prop as fn(FuzzHpack) -> TestResult)
}

/*
// If wanting to test with a specific feed, uncomment and fill in the seed.
#[test]
fn hpack_fuzz_seeded() {
    let _ = env_logger::try_init();
    let seed = [/* fill me in*/];
    FuzzHpack::new(seed).run();
}
*/

#[derive(Debug, Clone)]
struct FuzzHpack {
    // The set of headers to encode / decode
    frames: Vec<HeaderFrame>,
}

#[derive(Debug, Clone)]
struct HeaderFrame {
    resizes: Vec<usize>,
    headers: Vec<Header<Option<HeaderName>>>,
}

impl FuzzHpack {
    fn new(seed: [u8; 32]) -> FuzzHpack {
        // Seed the RNG
        let mut rng = StdRng::from_seed(seed);

        // Generates a bunch of source headers
        let mut source: Vec<Header<Option<HeaderName>>> = vec![];

        for _ in 0..2000 {
            source.push(gen_header(&mut rng));
        }

        // Actual test run headers
        let num: usize = rng.gen_range(40..500);

        let mut frames: Vec<HeaderFrame> = vec![];
        let mut added = 0;

        let skew: i32 = rng.gen_range(1..5);

        // Rough number of headers to add
        while added < num {
            let mut frame = HeaderFrame {
                resizes: vec![],
                headers: vec![],
            };

            match rng.gen_range(0..20) {
                0 => {
                    // Two resizes
                    let high = rng.gen_range(128..MAX_CHUNK * 2);
                    let low = rng.gen_range(0..high);

                    frame.resizes.extend([low, high]);
                }
                1..=3 => {
                    frame.resizes.push(rng.gen_range(128..MAX_CHUNK * 2));
                }
                _ => {}
            }

            let mut is_name_required = true;

            for _ in 0..rng.gen_range(1..(num - added) + 1) {
                let x: f64 = rng.gen_range(0.0..1.0);
                let x = x.powi(skew);

                let i = (x * source.len() as f64) as usize;

                let header = &source[i];
                match header {
                    Header::Field { name: None, .. } => {
                        if is_name_required {
                            continue;
                        }
                    }
                    Header::Field { .. } => {
                        is_name_required = false;
                    }
                    _ => {
                        // pseudos can't be followed by a header with no name
                        is_name_required = true;
                    }
                }

                frame.headers.push(header.clone());

                added += 1;
            }

            frames.push(frame);
        }

        FuzzHpack { frames }
    }

    // capataz: what `run` encodes, appended to `out` (`hpack_encoding_is_upstreams`).
    fn encode_into(self, out: &mut Vec<u8>) {
        let mut encoder = Encoder::default();
        for frame in self.frames {
            for resize in &frame.resizes {
                encoder.update_max_size(*resize);
            }
            let mut buf = BytesMut::new();
            encoder.encode(frame.headers, &mut buf);
            out.extend_from_slice(&buf);
        }
    }

    fn run(self) {
        let frames = self.frames;
        let mut expect = vec![];

        let mut encoder = Encoder::default();
        let mut decoder = Decoder::default();

        for frame in frames {
            // build "expected" frames, such that decoding headers always
            // includes a name
            let mut prev_name = None;
            for header in &frame.headers {
                match header.clone().reify() {
                    Ok(h) => {
                        prev_name = match h {
                            Header::Field { ref name, .. } => Some(name.clone()),
                            _ => None,
                        };
                        expect.push(h);
                    }
                    Err(value) => {
                        expect.push(Header::Field {
                            name: prev_name.as_ref().cloned().expect("previous header name"),
                            value,
                        });
                    }
                }
            }

            let mut buf = BytesMut::new();

            if let Some(max) = frame.resizes.iter().max() {
                decoder.queue_size_update(*max);
            }

            // Apply resizes
            for resize in &frame.resizes {
                encoder.update_max_size(*resize);
            }

            encoder.encode(frame.headers, &mut buf);

            // Decode the chunk!
            decoder
                .decode(&mut Cursor::new(&mut buf), |h| {
                    let e = expect.remove(0);
                    assert_eq!(h, e);
                    ControlFlow::Continue(())
                })
                .expect("full decode");
        }

        assert_eq!(0, expect.len());
    }
}

// capataz: the encoder's output is pinned to h2 0.4.20's, byte for byte. The table search
// changed (patches/0004: the newest entry looked at first, another hash for the name index,
// each header's size computed once), what it finds must not: the digest below is of the bytes
// upstream's encoder writes for the same input (the same test run on the unpatched crate).
// The input: these fuzz seeds' header lists (random names and values, pseudo-headers, repeated
// names, sensitive values, table resizes), then 20,000 response heads of a proxy-like shape
// (a date that changes every few responses, custom fields inserted at each response so entries
// are evicted all the time, repeated names, sensitive cookies, values too large to index).
#[test]
fn hpack_encoding_is_upstreams() {
    let mut out = Vec::new();
    for seed in 0u8..48 {
        FuzzHpack::new([seed; 32]).encode_into(&mut out);
    }
    encode_responses(&mut out);
    let digest = out.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    assert_eq!(
        (out.len(), digest),
        (2_355_993, 0x4d5b_351a_4a3e_7c5c),
        "(length, FNV-1a digest) of the encoded bytes"
    );
}

fn encode_responses(out: &mut Vec<u8>) {
    use http::header;
    use http::StatusCode;

    let mut rng = StdRng::seed_from_u64(0x6361_7061_7461_7a21);
    let mut encoder = Encoder::default();
    let mut decoder = Decoder::default();
    let mut date = 0u32;
    for i in 0..20_000u32 {
        if rng.gen_ratio(1, 7) {
            date += 1;
        }
        if rng.gen_ratio(1, 2_000) {
            let size = rng.gen_range(0..5_000);
            encoder.update_max_size(size);
            decoder.queue_size_update(size);
        }
        let status = [200, 200, 200, 404, 301, 500, 204, 302][rng.gen_range(0..8)];
        let mut headers: Vec<Header<Option<HeaderName>>> =
            vec![Header::Status(StatusCode::from_u16(status).unwrap())];
        let mut field = |name: Option<HeaderName>, value: String, sensitive: bool| {
            let mut value = HeaderValue::from_str(&value).unwrap();
            value.set_sensitive(sensitive);
            headers.push(Header::Field { name, value });
        };
        field(Some(header::SERVER), "nginx/1.22.1".into(), false);
        field(
            Some(header::DATE),
            format!(
                "Sat, 05 Dec 2026 {:02}:{:02}:{:02} GMT",
                date / 3600 % 24,
                date / 60 % 60,
                date % 60
            ),
            false,
        );
        let types = ["text/plain", "text/html; charset=utf-8", "application/json"];
        field(
            Some(header::CONTENT_TYPE),
            types[rng.gen_range(0..3)].into(),
            false,
        );
        field(
            Some(header::CONTENT_LENGTH),
            rng.gen_range(0..100_000).to_string(),
            false,
        );
        if rng.gen_ratio(1, 3) {
            field(
                Some(header::ETAG),
                format!("\"{:x}\"", rng.gen::<u32>()),
                false,
            );
        }
        if rng.gen_ratio(1, 4) {
            let name = HeaderName::from_static("x-request-id");
            field(Some(name), format!("{:016x}", rng.gen::<u64>()), false);
        }
        if rng.gen_ratio(1, 5) {
            field(Some(header::VARY), "accept-encoding".into(), false);
            field(None, "origin".into(), false);
        }
        if rng.gen_ratio(1, 6) {
            field(
                Some(header::SET_COOKIE),
                format!("id={}", rng.gen::<u32>()),
                true,
            );
            field(None, format!("seen={}", i), rng.gen_ratio(1, 2));
        }
        if rng.gen_ratio(1, 9) {
            field(
                Some(header::CACHE_CONTROL),
                ["no-cache", "max-age=60"][rng.gen_range(0..2)].into(),
                false,
            );
        }
        if rng.gen_ratio(1, 50) {
            let name = HeaderName::from_static("x-large");
            field(Some(name), "v".repeat(rng.gen_range(2_000..4_000)), false);
        }
        if rng.gen_ratio(1, 40) {
            let name = HeaderName::from_static("x-secret");
            field(Some(name), format!("{}", rng.gen::<u16>()), true);
        }
        let mut buf = BytesMut::new();
        encoder.encode(headers, &mut buf);
        let mut decoded = 0;
        decoder
            .decode(&mut Cursor::new(&mut buf.clone()), |_| {
                decoded += 1;
                ControlFlow::Continue(())
            })
            .expect("full decode");
        assert!(decoded >= 5);
        out.extend_from_slice(&buf);
    }
}

// capataz: the decoder still fails, and leaves its input, as h2 0.4.20's did (patches/0004
// drops decoded bytes from the input by `advance` instead of `split_to`). For each input: the
// result, the fields decoded before it, the bytes left in the buffer, then what the dynamic
// table holds (a block of indexed fields 62 to 66 decoded after it). The inputs: valid blocks
// cut at every length (each after the blocks before it, so with their table), then hostile
// blocks: integer overflow, index 0 and out of range, bad Huffman codes and padding, strings
// longer than the input, bad names, pseudo-headers and status, table size updates (allowed,
// too large, after a field). The digest is of upstream's record of the same inputs.
#[test]
fn hpack_decoding_is_upstreams() {
    let mut record = String::new();
    let mut decode = |decoder: &mut Decoder, block: &[u8]| {
        let mut buf = BytesMut::from(block);
        let mut fields = Vec::new();
        let res = decoder.decode(&mut Cursor::new(&mut buf), |h| {
            fields.push(h);
            ControlFlow::Continue(())
        });
        record.push_str(&format!("{:?} {:?} {:?}\n", res, fields, &buf[..]));
    };

    let mut blocks = Vec::new();
    let mut encoder = Encoder::default();
    for frame in FuzzHpack::new([7; 32]).frames.into_iter().take(6) {
        let mut buf = BytesMut::new();
        encoder.encode(frame.headers, &mut buf);
        blocks.push(buf);
    }
    let probe = [0xbe, 0xbf, 0xc0, 0xc1, 0xc2];
    for (k, block) in blocks.iter().enumerate() {
        for cut in 0..=block.len() {
            let mut decoder = Decoder::default();
            for before in &blocks[..k] {
                decode(&mut decoder, before);
            }
            decode(&mut decoder, &block[..cut]);
            for i in 0..probe.len() {
                decode(&mut decoder, &probe[i..i + 1]);
            }
        }
    }

    let hostile: &[&[u8]] = &[
        &[],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        &[0xff, 0x80, 0x80, 0x80, 0x80],
        &[0x80],
        &[0xc0],
        &[0xff, 0x00],
        &[0x40, 0x83, 0xff, 0xff, 0xff, 0x81, b'a'],
        &[0x41, 0x81, 0x00],
        &[0x41, 0x81, 0xff],
        &[0x41, 0x82, 0xff, 0xff],
        &[0x41, 0x8a, 1, 2, 3, 4, 5],
        &[0x41, 0x7f],
        &[0x41, 0x7f, 0x80],
        &[0x00, 0x7f, 0xff, 0xff, 0xff, 0x0f],
        &[0x00, 0x01, b'A', 0x01, b'b'],
        &[0x00, 0x00, 0x01, b'b'],
        &[0x00, 0x01, b'a', 0x01, 0x00],
        &[0x00, 0x03, b':', b'x', b'y', 0x01, b'z'],
        &[0x48, 0x03, b'a', b'b', b'c'],
        &[0x48, 0x03, b'0', b'9', b'9'],
        &[0x43, 0x03, b'G', b' ', b'T'],
        &[0x10, 0x01, b'a', 0x01, b'b'],
        &[0x3f, 0xe1, 0x1f, 0x82],
        &[0x3f, 0xe2, 0x1f, 0x82],
        &[0x20, 0x82, 0x3f, 0xe1, 0x1f],
        &[0x82, 0x20],
        &[0x20, 0x40, 0x01, b'a', 0x01, b'b', 0xbe],
        &[0x40, 0x01, b'a', 0x01, b'b', 0xbe, 0x40, 0x01],
        &[0x5f, 0xff, 0xff, 0xff, 0xff, 0x0f],
        &[0xf0],
        &[0x3f],
    ];
    for block in hostile {
        let mut decoder = Decoder::default();
        decode(&mut decoder, block);
        for i in 0..probe.len() {
            decode(&mut decoder, &probe[i..i + 1]);
        }
    }

    let digest = record.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    assert_eq!(
        (record.len(), digest),
        (21_175_578, 0x3faa_0e03_93b5_3572),
        "(length, FNV-1a digest) of the record"
    );
}

impl Arbitrary for FuzzHpack {
    fn arbitrary(_: &mut Gen) -> Self {
        FuzzHpack::new(thread_rng().gen())
    }
}

fn gen_header(g: &mut StdRng) -> Header<Option<HeaderName>> {
    use http::{Method, StatusCode};

    if g.gen_ratio(1, 10) {
        match g.gen_range(0u32..5) {
            0 => {
                let value = gen_string(g, 4, 20);
                Header::Authority(to_shared(value))
            }
            1 => {
                let method = match g.gen_range(0u32..6) {
                    0 => Method::GET,
                    1 => Method::POST,
                    2 => Method::PUT,
                    3 => Method::PATCH,
                    4 => Method::DELETE,
                    5 => {
                        let n: usize = g.gen_range(3..7);
                        let bytes: Vec<u8> = (0..n)
                            .map(|_| *g.sample(Slice::new(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ").unwrap()))
                            .collect();

                        Method::from_bytes(&bytes).unwrap()
                    }
                    _ => unreachable!(),
                };

                Header::Method(method)
            }
            2 => {
                let value = match g.gen_range(0u32..2) {
                    0 => "http",
                    1 => "https",
                    _ => unreachable!(),
                };

                Header::Scheme(to_shared(value.to_string()))
            }
            3 => {
                let value = match g.gen_range(0u32..100) {
                    0 => "/".to_string(),
                    1 => "/index.html".to_string(),
                    _ => gen_string(g, 2, 20),
                };

                Header::Path(to_shared(value))
            }
            4 => {
                let status = (g.gen::<u16>() % 500) + 100;

                Header::Status(StatusCode::from_u16(status).unwrap())
            }
            _ => unreachable!(),
        }
    } else {
        let name = if g.gen_ratio(1, 10) {
            None
        } else {
            Some(gen_header_name(g))
        };
        let mut value = gen_header_value(g);

        if g.gen_ratio(1, 30) {
            value.set_sensitive(true);
        }

        Header::Field { name, value }
    }
}

fn gen_header_name(g: &mut StdRng) -> HeaderName {
    use http::header;

    if g.gen_ratio(1, 2) {
        g.sample(
            Slice::new(&[
                header::ACCEPT,
                header::ACCEPT_CHARSET,
                header::ACCEPT_ENCODING,
                header::ACCEPT_LANGUAGE,
                header::ACCEPT_RANGES,
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                header::ACCESS_CONTROL_ALLOW_METHODS,
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                header::ACCESS_CONTROL_MAX_AGE,
                header::ACCESS_CONTROL_REQUEST_HEADERS,
                header::ACCESS_CONTROL_REQUEST_METHOD,
                header::AGE,
                header::ALLOW,
                header::ALT_SVC,
                header::AUTHORIZATION,
                header::CACHE_CONTROL,
                header::CONNECTION,
                header::CONTENT_DISPOSITION,
                header::CONTENT_ENCODING,
                header::CONTENT_LANGUAGE,
                header::CONTENT_LENGTH,
                header::CONTENT_LOCATION,
                header::CONTENT_RANGE,
                header::CONTENT_SECURITY_POLICY,
                header::CONTENT_SECURITY_POLICY_REPORT_ONLY,
                header::CONTENT_TYPE,
                header::COOKIE,
                header::DNT,
                header::DATE,
                header::ETAG,
                header::EXPECT,
                header::EXPIRES,
                header::FORWARDED,
                header::FROM,
                header::HOST,
                header::IF_MATCH,
                header::IF_MODIFIED_SINCE,
                header::IF_NONE_MATCH,
                header::IF_RANGE,
                header::IF_UNMODIFIED_SINCE,
                header::LAST_MODIFIED,
                header::LINK,
                header::LOCATION,
                header::MAX_FORWARDS,
                header::ORIGIN,
                header::PRAGMA,
                header::PROXY_AUTHENTICATE,
                header::PROXY_AUTHORIZATION,
                header::PUBLIC_KEY_PINS,
                header::PUBLIC_KEY_PINS_REPORT_ONLY,
                header::RANGE,
                header::REFERER,
                header::REFERRER_POLICY,
                header::REFRESH,
                header::RETRY_AFTER,
                header::SERVER,
                header::SET_COOKIE,
                header::STRICT_TRANSPORT_SECURITY,
                header::TE,
                header::TRAILER,
                header::TRANSFER_ENCODING,
                header::USER_AGENT,
                header::UPGRADE,
                header::UPGRADE_INSECURE_REQUESTS,
                header::VARY,
                header::VIA,
                header::WARNING,
                header::WWW_AUTHENTICATE,
                header::X_CONTENT_TYPE_OPTIONS,
                header::X_DNS_PREFETCH_CONTROL,
                header::X_FRAME_OPTIONS,
                header::X_XSS_PROTECTION,
            ])
            .unwrap(),
        )
        .clone()
    } else {
        let value = gen_string(g, 1, 25);
        HeaderName::from_bytes(value.as_bytes()).unwrap()
    }
}

fn gen_header_value(g: &mut StdRng) -> HeaderValue {
    let value = gen_string(g, 0, 70);
    HeaderValue::from_bytes(value.as_bytes()).unwrap()
}

fn gen_string(g: &mut StdRng, min: usize, max: usize) -> String {
    let bytes: Vec<_> = (min..max)
        .map(|_| {
            // Chars to pick from
            *g.sample(Slice::new(b"ABCDEFGHIJKLMNOPQRSTUVabcdefghilpqrstuvwxyz----").unwrap())
        })
        .collect();

    String::from_utf8(bytes).unwrap()
}

fn to_shared(src: String) -> crate::hpack::BytesStr {
    crate::hpack::BytesStr::from(src.as_str())
}
