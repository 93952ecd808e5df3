//! OCSP answers built here, byte by byte, and signed with ring: each check that refuses one.

use super::*;

const NOW: i64 = 1_800_000_000;
/// The ecdsa-with-SHA256 algorithm identifier's contents.
const ECDSA_SHA256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];

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
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = params.signed_by(&key, &issuer.cert, &issuer.key).unwrap();
    (cert.der().clone(), key)
}

fn generalized(unix: i64) -> Vec<u8> {
    let (y, m, d) = crate::timefmt::civil_from_days(unix.div_euclid(86_400));
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
}

impl Answer {
    fn good() -> Answer {
        Answer {
            status: vec![GOOD, 0],
            serial: vec![0x12, 0x34],
            this_update: NOW - 3600,
            next_update: Some(NOW + 3600),
            responder: None,
        }
    }

    /// The DER OCSPResponse about a leaf of `issuer`, signed by `signer`.
    fn build(&self, issuer: &Issuer, signer: &rcgen::KeyPair) -> Vec<u8> {
        let issuer_parts = x509::parts(issuer.cert.der()).unwrap();
        let cert_id = tlv(
            SEQUENCE,
            &[
                tlv(SEQUENCE, &[tlv(OID, SHA1), vec![5, 0]].concat()),
                tlv(OCTET_STRING, &hash(SHA1, issuer_parts.subject).unwrap()),
                tlv(OCTET_STRING, &hash(SHA1, issuer_parts.key).unwrap()),
                tlv(INTEGER, &self.serial),
            ]
            .concat(),
        );
        let mut single = [cert_id, self.status.clone(), generalized(self.this_update)].concat();
        if let Some(next) = self.next_update {
            single.extend(tlv(CONTEXT_0, &generalized(next)));
        }
        let data = tlv(
            SEQUENCE,
            &[
                tlv(0xa2, &tlv(OCTET_STRING, &[0; 20])),
                generalized(self.this_update),
                tlv(SEQUENCE, &tlv(SEQUENCE, &single)),
            ]
            .concat(),
        );
        let signature = [vec![0], sign(signer, &data)].concat();
        let mut basic = [
            data,
            tlv(SEQUENCE, ECDSA_SHA256),
            tlv(BIT_STRING, &signature),
        ]
        .concat();
        if let Some(responder) = &self.responder {
            basic.extend(tlv(CONTEXT_0, &tlv(SEQUENCE, responder)));
        }
        let bytes = tlv(
            SEQUENCE,
            &[
                tlv(OID, OCSP_BASIC),
                tlv(OCTET_STRING, &tlv(SEQUENCE, &basic)),
            ]
            .concat(),
        );
        tlv(
            SEQUENCE,
            &[tlv(ENUMERATED, &[0]), tlv(CONTEXT_0, &bytes)].concat(),
        )
    }
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
        Err(Refusal::Malformed(_))
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
