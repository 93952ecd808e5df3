//! Certificates made by rcgen, read back; and the same bytes broken in each way DER can be
//! broken, each refused with an error, never a panic.

use super::*;

fn certificate(names: &[&str]) -> Vec<u8> {
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let params = rcgen::CertificateParams::new(names).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

/// A certificate for `names` with `extension` (OID arcs, DER value) added.
fn with_extension(names: &[&str], arcs: &[u64], value: Vec<u8>) -> Vec<u8> {
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let mut params = rcgen::CertificateParams::new(names).unwrap();
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(arcs, value));
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

/// `bytes` with the first `from` replaced by `to` (same length).
fn replaced(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("present");
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    out
}

#[test]
fn reads_the_expiry_and_the_names_of_an_rcgen_certificate() {
    let mut params =
        rcgen::CertificateParams::new(vec!["Example.com".into(), "*.example.com".into()]).unwrap();
    params.not_after = rcgen::date_time_ymd(2031, 7, 9);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let facts = read(cert.der()).expect("a certificate");
    assert_eq!(facts.dns_names, ["example.com", "*.example.com"]);
    // 2031-07-09T00:00:00Z
    assert_eq!(facts.not_after, 1_941_321_600);
}

#[test]
fn a_certificate_without_names_has_none() {
    assert_eq!(
        read(&certificate(&[])).expect("a certificate").dns_names,
        Vec::<String>::new()
    );
}

#[test]
fn days_and_dates_round_trip() {
    for days in [-719_468, -1, 0, 11_016, 19_782, 20_788, 2_932_896] {
        let (y, m, d) = civil_from_days(days);
        assert_eq!(
            capataz_timefmt::days_from_civil(y.into(), m.into(), d.into()),
            days,
            "{y}-{m}-{d}"
        );
    }
    assert_eq!(civil_from_days(11_017), (2000, 3, 1));
    assert_eq!(civil_from_days(11_016), (2000, 2, 29));
}

/// `notAfter` as UTCTime (to 2049) and as GeneralizedTime (from 2050), and either kind of time
/// broken: no `Z`, a thirteenth month.
#[test]
fn times_of_both_kinds() {
    let expiring = |at| {
        let mut params = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(1970, 1, 1);
        params.not_after = at;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    };
    let last_utc = rcgen::date_time_ymd(2049, 12, 31) + std::time::Duration::from_secs(86_399);
    let utc = expiring(last_utc);
    assert_eq!(read(&utc).expect("read").not_after, 2_524_607_999);
    let generalized = expiring(rcgen::date_time_ymd(2050, 1, 1));
    assert_eq!(read(&generalized).expect("read").not_after, 2_524_608_000);
    for (der, from, to) in [
        (&utc, &b"491231235959Z"[..], &b"491231235959+"[..]),
        (&utc, b"491231235959Z", b"491331235959Z"),
        (&generalized, b"20500101000000Z", b"20500101000000+"),
        (&generalized, b"20500101000000Z", b"20501301000000Z"),
        (&generalized, b"20500101000000Z", b"20500132000000Z"),
    ] {
        let broken = replaced(der, from, to);
        assert!(read(&broken).is_err(), "{}", String::from_utf8_lossy(to));
    }
}

#[test]
fn truncated_or_garbled_certificates_are_refused() {
    let der = certificate(&["a.test"]);
    for end in 0..der.len() {
        assert!(read(&der[..end]).is_err(), "cut at {end}");
    }
    assert!(read(&[]).is_err());
    assert!(read(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
}

/// The outer SEQUENCE broken each way: a wrong tag, a length past the bytes, an indefinite
/// length (BER, not DER), a length in more bytes than it needs, bytes after it, a fourth
/// element in it. Each is refused and says so.
#[test]
fn wrong_tags_and_bad_lengths_are_refused() {
    let der = certificate(&["a.test"]);
    assert_eq!(der[..2], [0x30, 0x82], "a two-byte length");
    let length = usize::from(u16::from_be_bytes([der[2], der[3]]));
    let body = &der[4..];
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    cases.push(("a SET", [&[0x31], &der[1..]].concat()));
    let longer = (length as u16 + 1).to_be_bytes();
    cases.push(("too long", [&[0x30, 0x82], &longer[..], body].concat()));
    cases.push(("indefinite", [&[0x30, 0x80], body, &[0, 0]].concat()));
    let padded = [&[0x30, 0x83, 0][..], &der[2..4], body].concat();
    cases.push(("a padded length", padded));
    cases.push(("trailing bytes", [&der[..], &[0]].concat()));
    let fourth = (length as u16 + 2).to_be_bytes();
    cases.push((
        "a fourth element",
        [&[0x30, 0x82], &fourth[..], body, &[0x05, 0]].concat(),
    ));
    for (what, bytes) in cases {
        let error = read(&bytes).expect_err(what);
        assert!(!error.to_string().is_empty(), "{what}");
    }
}

/// subjectAltName: a dNSName that is not IA5 (ASCII), and the extension twice (RFC 5280: a
/// certificate names an extension once), are refused rather than read half-way.
#[test]
fn a_bad_or_repeated_subject_alt_name_is_refused() {
    const SAN: &[u64] = &[2, 5, 29, 17];
    // SEQUENCE { [2] "b\xfftest" }
    let non_ascii = vec![0x30, 8, 0x82, 6, b'b', 0xff, b't', b'e', b's', b't'];
    assert!(read(&with_extension(&[], SAN, non_ascii)).is_err());
    let names = vec![0x30, 8, 0x82, 6, b'B', b'.', b't', b'e', b's', b't'];
    let facts = read(&with_extension(&[], SAN, names.clone())).expect("read");
    assert_eq!(facts.dns_names, ["b.test"]);
    let twice = with_extension(&["a.test"], SAN, names.clone());
    assert!(read(&twice).is_err(), "two SANs");
    // The same names in another extension change nothing.
    let facts = read(&with_extension(&["a.test"], &[1, 2, 3, 4], names)).expect("read");
    assert_eq!(facts.dns_names, ["a.test"]);
}

/// What a certificate's issuer signed is the certificate's own bytes, and its signature
/// verifies over them with the issuer's key.
#[test]
fn the_signed_part_is_the_bytes_sent_and_verifies() {
    let der = certificate(&["a.test"]);
    let cert = Cert::read(&der).expect("read");
    let start = cert.signed.tbs.as_ptr() as usize - der.as_ptr() as usize;
    assert_eq!(&der[start..start + cert.signed.tbs.len()], cert.signed.tbs);
    let key = cert.public_key().expect("a key");
    let provider = rustls::crypto::ring::default_provider();
    let verified = provider
        .signature_verification_algorithms
        .all
        .iter()
        .filter(|a| a.public_key_alg_id().as_ref() == key.algorithm)
        .filter(|a| a.signature_alg_id().as_ref() == cert.signed.algorithm)
        .any(|a| {
            a.verify_signature(&key.bits, cert.signed.tbs, cert.signed.signature)
                .is_ok()
        });
    assert!(verified);
}

proptest::proptest! {
    /// The reader never panics, whatever the bytes.
    #[test]
    fn the_reader_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = read(&bytes);
    }

    /// Nor on a real certificate with bytes flipped.
    #[test]
    fn the_reader_never_panics_on_a_mangled_certificate(
        flips in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 1..8),
    ) {
        let mut der = certificate(&["a.test"]);
        for (at, byte) in flips {
            let len = der.len();
            der[at % len] = byte;
        }
        let _ = read(&der);
    }
}
