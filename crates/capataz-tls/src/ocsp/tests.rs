//! OCSP answers built here, byte by byte (not by the crates that read them), and signed with
//! ring: each check that refuses one, and each way the DER of one can be broken.

use super::*;

const NOW: i64 = 1_800_000_000;
/// The ecdsa-with-SHA256 algorithm identifier's contents.
const ECDSA_SHA256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
/// The sha256WithRSAEncryption algorithm identifier's contents.
const RSA_SHA256: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b, 0x05, 0x00,
];
const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
const ENUMERATED: u8 = 0x0a;
const GENERALIZED_TIME: u8 = 0x18;
/// `[0]` EXPLICIT, constructed.
const CONTEXT_0: u8 = 0xa0;
/// `good [0] IMPLICIT NULL`.
const GOOD: u8 = 0x80;
/// `revoked [1] IMPLICIT RevokedInfo`.
const REVOKED: u8 = 0xa1;
/// `unknown [2] IMPLICIT UnknownInfo`.
const UNKNOWN: u8 = 0x82;
/// `uniformResourceIdentifier [6] IA5String`, implicit.
const URI: u8 = 0x86;
/// 1.3.6.1.5.5.7.48.1, id-ad-ocsp.
const AD_OCSP: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 0x30, 1];
/// 1.3.6.1.5.5.7.48.1.1, id-pkix-ocsp-basic.
const OCSP_BASIC: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 0x30, 1, 1];
/// 1.3.6.1.5.5.7.48.1.2, id-pkix-ocsp-nonce (not a response type).
const OCSP_NONCE: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 0x30, 1, 2];
/// 1.3.14.3.2.26, SHA-1.
const SHA1: &[u8] = &[0x2b, 0x0e, 3, 2, 0x1a];

/// A DER element: `tag`, the definite length, `contents`.
fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let length = contents.len();
    if length < 0x80 {
        out.push(length as u8);
    } else {
        let bytes = length.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(contents);
    out
}

fn sha1(bytes: &[u8]) -> Vec<u8> {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, bytes);
    digest.as_ref().to_vec()
}

struct Issuer {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

fn ca() -> Issuer {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test CA");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    Issuer {
        cert: params.self_signed(&key).unwrap(),
        key,
    }
}

/// A leaf of `issuer` with serial 0x1234 and an OCSP URL (and `eku`, for a responder).
fn leaf(
    issuer: &Issuer,
    url: &str,
    ocsp_signing: bool,
) -> (CertificateDer<'static>, rcgen::KeyPair) {
    leaf_valid(issuer, url, ocsp_signing, None)
}

/// [`leaf`], valid from `valid.0` to `valid.1` (Unix days) if given.
fn leaf_valid(
    issuer: &Issuer,
    url: &str,
    ocsp_signing: bool,
    valid: Option<(i64, i64)>,
) -> (CertificateDer<'static>, rcgen::KeyPair) {
    let mut params = rcgen::CertificateParams::new(vec!["leaf.test".to_string()]).unwrap();
    params.serial_number = Some(rcgen::SerialNumber::from(vec![0x12, 0x34]));
    let uri = tlv(URI, url.as_bytes());
    let description = tlv(SEQUENCE, &[tlv(OID, AD_OCSP), uri].concat());
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 5, 5, 7, 1, 1],
            tlv(SEQUENCE, &description),
        ));
    if ocsp_signing {
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::OcspSigning];
    }
    if let Some((from, to)) = valid {
        let date = |days: i64| {
            let (y, m, d) = crate::x509::civil_from_days(days);
            rcgen::date_time_ymd(y, m, d)
        };
        params.not_before = date(from);
        params.not_after = date(to);
    }
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = params.signed_by(&key, &issuer.cert, &issuer.key).unwrap();
    (cert.der().clone(), key)
}

fn generalized(unix: i64) -> Vec<u8> {
    let (y, m, d) = capataz_timefmt::civil_from_days(unix.div_euclid(86_400));
    let s = unix.rem_euclid(86_400);
    let text = format!(
        "{y:04}{m:02}{d:02}{:02}{:02}{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    );
    tlv(GENERALIZED_TIME, text.as_bytes())
}

fn sign(key: &rcgen::KeyPair, message: &[u8]) -> Vec<u8> {
    let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &key.serialize_der(),
        &ring::rand::SystemRandom::new(),
    )
    .unwrap();
    pair.sign(&ring::rand::SystemRandom::new(), message)
        .unwrap()
        .as_ref()
        .to_vec()
}

/// What an answer says, to vary one thing at a time.
struct Answer {
    status: Vec<u8>,
    serial: Vec<u8>,
    this_update: i64,
    next_update: Option<i64>,
    responder: Option<CertificateDer<'static>>,
    /// `version [0] v1` written out (DER leaves a DEFAULT out; some responders do not).
    version_written: bool,
    /// The signature algorithm claimed.
    algorithm: &'static [u8],
    /// One bit of the signature flipped after signing.
    tampered: bool,
}

impl Answer {
    fn good() -> Answer {
        Answer {
            status: vec![GOOD, 0],
            serial: vec![0x12, 0x34],
            this_update: NOW - 3600,
            next_update: Some(NOW + 3600),
            responder: None,
            version_written: false,
            algorithm: ECDSA_SHA256,
            tampered: false,
        }
    }

    /// The DER OCSPResponse about a leaf of `issuer`, signed by `signer`.
    fn build(&self, issuer: &Issuer, signer: &rcgen::KeyPair) -> Vec<u8> {
        let issuer_cert = Cert::read(issuer.cert.der()).unwrap();
        let subject = issuer_cert.tbs.subject.to_der().unwrap();
        let key = issuer_cert.public_key().unwrap().bits;
        let cert_id = tlv(
            SEQUENCE,
            &[
                tlv(SEQUENCE, &[tlv(OID, SHA1), vec![5, 0]].concat()),
                tlv(OCTET_STRING, &sha1(&subject)),
                tlv(OCTET_STRING, &sha1(&key)),
                tlv(INTEGER, &self.serial),
            ]
            .concat(),
        );
        let mut single = [cert_id, self.status.clone(), generalized(self.this_update)].concat();
        if let Some(next) = self.next_update {
            single.extend(tlv(CONTEXT_0, &generalized(next)));
        }
        let version = if self.version_written {
            tlv(CONTEXT_0, &tlv(INTEGER, &[0]))
        } else {
            Vec::new()
        };
        let data = tlv(
            SEQUENCE,
            &[
                version,
                tlv(0xa2, &tlv(OCTET_STRING, &[0; 20])),
                generalized(self.this_update),
                tlv(SEQUENCE, &tlv(SEQUENCE, &single)),
            ]
            .concat(),
        );
        let mut signature = [vec![0], sign(signer, &data)].concat();
        if self.tampered {
            *signature.last_mut().unwrap() ^= 1;
        }
        let mut basic = [
            data,
            tlv(SEQUENCE, self.algorithm),
            tlv(BIT_STRING, &signature),
        ]
        .concat();
        if let Some(responder) = &self.responder {
            basic.extend(tlv(CONTEXT_0, &tlv(SEQUENCE, responder)));
        }
        successful(OCSP_BASIC, &tlv(SEQUENCE, &basic))
    }
}

/// A successful OCSPResponse of type `oid` around `response`.
fn successful(oid: &[u8], response: &[u8]) -> Vec<u8> {
    let bytes = tlv(
        SEQUENCE,
        &[tlv(OID, oid), tlv(OCTET_STRING, response)].concat(),
    );
    tlv(
        SEQUENCE,
        &[tlv(ENUMERATED, &[0]), tlv(CONTEXT_0, &bytes)].concat(),
    )
}

#[test]
fn the_responder_url_and_the_request_are_read_from_the_certificates() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1:8888/ocsp", false);
    assert_eq!(
        responder_url(&leaf).as_deref(),
        Some("http://127.0.0.1:8888/ocsp")
    );
    let (https, _) = self::leaf(&issuer, "https://ocsp.test/", false);
    assert_eq!(responder_url(&https), None, "http:// only");
    assert_eq!(responder_url(issuer.cert.der()), None, "no AIA");
    let request = request(&leaf, issuer.cert.der()).expect("a request");
    // OCSPRequest { TBSRequest { requestList { Request { CertID } } } }, serial last.
    assert_eq!(request[0], SEQUENCE);
    assert!(request.ends_with(&[INTEGER, 2, 0x12, 0x34]));
    // The CertID: SHA-1 with NULL parameters, the hashes of the issuer's name and key.
    let issuer_cert = Cert::read(issuer.cert.der()).unwrap();
    let cert_id = tlv(
        SEQUENCE,
        &[
            tlv(SEQUENCE, &[tlv(OID, SHA1), vec![5, 0]].concat()),
            tlv(
                OCTET_STRING,
                &sha1(&issuer_cert.tbs.subject.to_der().unwrap()),
            ),
            tlv(OCTET_STRING, &sha1(&issuer_cert.public_key().unwrap().bits)),
            tlv(INTEGER, &[0x12, 0x34]),
        ]
        .concat(),
    );
    let whole = tlv(SEQUENCE, &tlv(SEQUENCE, &tlv(SEQUENCE, &cert_id)));
    assert_eq!(request, tlv(SEQUENCE, &whole), "no version, no nonce");
}

#[test]
fn a_good_answer_for_the_certificate_within_its_times_passes() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let answer = Answer::good().build(&issuer, &issuer.key);
    let checked = check(&answer, &leaf, Some(issuer.cert.der()), NOW).expect("good");
    assert_eq!(checked.next_update, Some(NOW + 3600));
    assert_eq!(checked.until, NOW + 3600);
    assert_eq!(checked.this_update, NOW - 3600);
    // Without the issuer, what can be checked is.
    assert!(check(&answer, &leaf, None, NOW).is_ok());
    // No nextUpdate: fresh for a day after thisUpdate.
    let answer = Answer {
        next_update: None,
        ..Answer::good()
    }
    .build(&issuer, &issuer.key);
    let checked = check(&answer, &leaf, Some(issuer.cert.der()), NOW).expect("good");
    assert_eq!(checked.until, NOW - 3600 + FRESH_WITHOUT_NEXT_UPDATE);
}

#[test]
fn each_bad_answer_is_refused_with_its_reason() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let der = issuer.cert.der();
    let refused = |answer: Answer, signer: &rcgen::KeyPair, now: i64| {
        check(&answer.build(&issuer, signer), &leaf, Some(der), now).unwrap_err()
    };
    let revoked = Answer {
        status: tlv(REVOKED, &generalized(NOW - 10)),
        ..Answer::good()
    };
    assert_eq!(refused(revoked, &issuer.key, NOW), Refusal::Revoked);
    let unknown = Answer {
        status: vec![UNKNOWN, 0],
        ..Answer::good()
    };
    assert_eq!(refused(unknown, &issuer.key, NOW), Refusal::Unknown);
    let other = Answer {
        serial: vec![0x12, 0x35],
        ..Answer::good()
    };
    assert_eq!(refused(other, &issuer.key, NOW), Refusal::OtherCertificate);
    assert_eq!(
        refused(Answer::good(), &issuer.key, NOW + 3600),
        Refusal::Stale(NOW + 3600)
    );
    assert_eq!(
        refused(Answer::good(), &issuer.key, NOW - 3600 - CLOCK_SKEW - 1),
        Refusal::NotYetValid
    );
    let stranger = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    assert_eq!(refused(Answer::good(), &stranger, NOW), Refusal::Signature);
    // Another CA's answer about the same serial is about another certificate.
    let other_ca = ca();
    let answer = Answer::good().build(&other_ca, &other_ca.key);
    assert_eq!(
        check(&answer, &leaf, Some(der), NOW),
        Err(Refusal::OtherCertificate)
    );
    let unsuccessful = tlv(SEQUENCE, &tlv(ENUMERATED, &[3]));
    assert_eq!(
        check(&unsuccessful, &leaf, Some(der), NOW),
        Err(Refusal::Unsuccessful(3))
    );
    assert!(matches!(
        check(b"garbage", &leaf, Some(der), NOW),
        Err(Refusal::Malformed { .. })
    ));
}

#[test]
fn a_delegated_responder_is_accepted_only_with_the_ocsp_signing_purpose() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let (responder, responder_key) = self::leaf(&issuer, "http://127.0.0.1/", true);
    let answer = Answer {
        responder: Some(responder),
        ..Answer::good()
    }
    .build(&issuer, &responder_key);
    assert!(check(&answer, &leaf, Some(issuer.cert.der()), NOW).is_ok());
    let (plain, plain_key) = self::leaf(&issuer, "http://127.0.0.1/", false);
    let answer = Answer {
        responder: Some(plain),
        ..Answer::good()
    }
    .build(&issuer, &plain_key);
    assert_eq!(
        check(&answer, &leaf, Some(issuer.cert.der()), NOW),
        Err(Refusal::Signature)
    );
}

/// A responder certificate for OCSP signed by another CA speaks for that CA only.
#[test]
fn a_delegated_responder_of_another_ca_is_refused() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let other_ca = ca();
    let (responder, responder_key) = self::leaf(&other_ca, "http://127.0.0.1/", true);
    let answer = Answer {
        responder: Some(responder),
        ..Answer::good()
    }
    .build(&issuer, &responder_key);
    assert_eq!(
        check(&answer, &leaf, Some(issuer.cert.der()), NOW),
        Err(Refusal::Signature)
    );
}

/// The bug: a delegated responder's certificate was taken whatever its validity, so an answer
/// signed with the key of a responder certificate that had expired (or was not yet valid)
/// was stapled. It is refused now, like OpenSSL's `OCSP_basic_verify` does.
#[test]
fn an_expired_delegated_responder_is_refused() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let today = NOW / 86_400;
    for (valid, accepted) in [
        ((today - 10, today + 10), true),
        ((today - 10, today - 1), false),
        ((today + 1, today + 10), false),
    ] {
        let (responder, key) = leaf_valid(&issuer, "http://127.0.0.1/", true, Some(valid));
        let answer = Answer {
            responder: Some(responder),
            ..Answer::good()
        }
        .build(&issuer, &key);
        let checked = check(&answer, &leaf, Some(issuer.cert.der()), NOW);
        if accepted {
            assert!(checked.is_ok(), "{valid:?}: {checked:?}");
        } else {
            assert_eq!(checked, Err(Refusal::Signature), "{valid:?}");
        }
    }
}

/// A signature that does not verify: a bit flipped, or the signature claimed under another
/// algorithm than the key's.
#[test]
fn a_wrong_signature_is_refused() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    for answer in [
        Answer {
            tampered: true,
            ..Answer::good()
        },
        Answer {
            algorithm: RSA_SHA256,
            ..Answer::good()
        },
    ] {
        let answer = answer.build(&issuer, &issuer.key);
        assert_eq!(
            check(&answer, &leaf, Some(issuer.cert.der()), NOW),
            Err(Refusal::Signature)
        );
    }
}

/// What was signed is checked as it was sent: a `version` written out (a DEFAULT that DER
/// leaves out, and that reading then writing again would drop) still verifies.
#[test]
fn the_signature_is_checked_over_the_bytes_sent() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let answer = Answer {
        version_written: true,
        ..Answer::good()
    }
    .build(&issuer, &issuer.key);
    assert!(check(&answer, &leaf, Some(issuer.cert.der()), NOW).is_ok());
}

/// Every status but `successful` is that status, and a status no RFC defines is malformed.
#[test]
fn each_unsuccessful_status_is_named() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    for status in [1, 2, 3, 5, 6] {
        let answer = tlv(SEQUENCE, &tlv(ENUMERATED, &[status]));
        let refusal = check(&answer, &leaf, Some(issuer.cert.der()), NOW).unwrap_err();
        assert_eq!(refusal, Refusal::Unsuccessful(status));
        assert!(refusal.to_string().starts_with("the responder answered "));
    }
    let answer = tlv(SEQUENCE, &tlv(ENUMERATED, &[4]));
    assert!(matches!(
        check(&answer, &leaf, Some(issuer.cert.der()), NOW),
        Err(Refusal::Malformed { .. })
    ));
}

/// Every prefix of a good answer is refused as malformed, and says so.
#[test]
fn a_truncated_answer_is_malformed() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let answer = Answer::good().build(&issuer, &issuer.key);
    for end in 0..answer.len() {
        match check(&answer[..end], &leaf, Some(issuer.cert.der()), NOW) {
            Err(refusal @ Refusal::Malformed { .. }) => {
                assert!(refusal.to_string().starts_with("not a DER OCSP response ("))
            }
            other => panic!("cut at {end}: {other:?}"),
        }
    }
}

/// Wrong tags and bad lengths, each at its place, are malformed: the DER reader's error is
/// kept as the source.
#[test]
fn wrong_tags_and_bad_lengths_are_malformed() {
    let issuer = ca();
    let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
    let good = Answer::good().build(&issuer, &issuer.key);
    let body = AnyRef::from_der(&good).unwrap().value();
    let length = body.len().to_be_bytes();
    let length = &length[length.iter().take_while(|b| **b == 0).count()..];
    let padded = [&[SEQUENCE, 0x81 + length.len() as u8, 0], length, body].concat();
    let past_the_end = tlv(SEQUENCE, &[body, &[0]].concat());
    let basic = {
        let outer = OcspResponse::from_der(&good).unwrap();
        basic_bytes(&outer).unwrap().to_vec()
    };
    let bad_status = Answer {
        status: vec![0x83, 0],
        ..Answer::good()
    }
    .build(&issuer, &issuer.key);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a SET", [&[0x31], &good[1..]].concat()),
        (
            "an INTEGER status",
            replace_first(&good, &[ENUMERATED, 1, 0], &[INTEGER, 1, 0]),
        ),
        ("a bad certStatus", bad_status),
        ("a length past the end", past_the_end[..good.len()].to_vec()),
        ("indefinite", [&[SEQUENCE, 0x80], body, &[0, 0]].concat()),
        ("a padded length", padded),
        ("trailing bytes", [&good[..], &[0]].concat()),
        (
            "bad certs",
            successful(OCSP_BASIC, &with_certs(&basic, &[5, 0])),
        ),
        (
            "an element after certs",
            successful(OCSP_BASIC, &with_certs(&basic, &[])),
        ),
    ];
    for (what, answer) in cases {
        let refusal = check(&answer, &leaf, Some(issuer.cert.der()), NOW).unwrap_err();
        assert!(
            matches!(refusal, Refusal::Malformed { error: Some(_), .. }),
            "{what}: {refusal:?}"
        );
        assert!(std::error::Error::source(&refusal).is_some(), "{what}");
    }
    // Well-formed DER that is not what is stapled.
    let no_bytes = tlv(SEQUENCE, &tlv(ENUMERATED, &[0]));
    let not_basic = successful(OCSP_NONCE, &basic);
    for (answer, part) in [
        (no_bytes, "no responseBytes"),
        (not_basic, "not a basic OCSP response"),
    ] {
        assert_eq!(
            check(&answer, &leaf, Some(issuer.cert.der()), NOW),
            Err(Refusal::Malformed { part, error: None })
        );
    }
}

/// `bytes` with the first `from` replaced by `to`.
fn replace_first(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("present");
    [&bytes[..at], to, &bytes[at + from.len()..]].concat()
}

/// The BasicOCSPResponse `basic` with `[0] { certs }` where `certs` is `inner` (not a
/// SEQUENCE) when given, else a good empty list followed by a stray NULL.
fn with_certs(basic: &[u8], inner: &[u8]) -> Vec<u8> {
    let contents = AnyRef::from_der(basic).unwrap().value();
    let extra = if inner.is_empty() {
        [tlv(CONTEXT_0, &tlv(SEQUENCE, &[])), vec![5, 0]].concat()
    } else {
        tlv(CONTEXT_0, inner)
    };
    tlv(SEQUENCE, &[contents, &extra].concat())
}

proptest::proptest! {
    /// The checker never panics, whatever the bytes.
    #[test]
    fn the_checker_never_panics(
        flips in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 0..6),
    ) {
        let issuer = ca();
        let (leaf, _) = leaf(&issuer, "http://127.0.0.1/", false);
        let mut answer = Answer::good().build(&issuer, &issuer.key);
        for (at, byte) in flips {
            let len = answer.len();
            answer[at % len] = byte;
        }
        let _ = check(&answer, &leaf, Some(issuer.cert.der()), NOW);
        for end in (0..answer.len()).step_by(7) {
            let _ = check(&answer[..end], &leaf, Some(issuer.cert.der()), NOW);
        }
    }
}
