//! OCSP (RFC 6960) for stapling: the responder URL of a certificate (its Authority Information
//! Access extension), the request for its status, and the check of an answer before it is
//! stapled: a successful basic response, for this certificate (serial, issuer name and key
//! hashes), signed by the issuer or by a responder certificate the issuer signed for OCSP,
//! status `good`, and within its times (`thisUpdate` not in the future, `nextUpdate` not past).
//!
//! Pure and bounded like `x509.rs`, whose DER cursor it uses: no IO, no clock (the caller
//! passes `now`), every length checked, never a panic whatever the bytes (a proptest below).
//! Hashes (SHA-1, which RFC 5019 responders expect in a request, and SHA-256) are ring's; the
//! signature algorithms are rustls' ring provider's.

use std::fmt;

use rustls::pki_types::CertificateDer;

use super::x509::{
    self, Der, BIT_STRING, ENUMERATED, GENERALIZED_TIME, INTEGER, OCTET_STRING, OID, SEQUENCE,
};

/// 1.3.6.1.5.5.7.1.1, authorityInfoAccess.
const AIA_OID: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 1, 1];
/// 1.3.6.1.5.5.7.48.1, id-ad-ocsp.
const AD_OCSP: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 0x30, 1];
/// 1.3.6.1.5.5.7.48.1.1, id-pkix-ocsp-basic.
const OCSP_BASIC: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 0x30, 1, 1];
/// 1.3.14.3.2.26, SHA-1.
const SHA1: &[u8] = &[0x2b, 0x0e, 3, 2, 0x1a];
/// 2.16.840.1.101.3.4.2.1, SHA-256.
const SHA256: &[u8] = &[0x60, 0x86, 0x48, 1, 0x65, 3, 4, 2, 1];
/// 2.5.29.37, extKeyUsage.
const EKU_OID: &[u8] = &[0x55, 0x1d, 0x25];
/// 1.3.6.1.5.5.7.3.9, id-kp-OCSPSigning.
const OCSP_SIGNING: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 3, 9];
/// `uniformResourceIdentifier [6] IA5String`, implicit.
const URI: u8 = 0x86;
/// `[0]` EXPLICIT, constructed.
const CONTEXT_0: u8 = 0xa0;
/// `good [0] IMPLICIT NULL`.
const GOOD: u8 = 0x80;
/// `revoked [1] IMPLICIT RevokedInfo`.
const REVOKED: u8 = 0xa1;
/// `unknown [2] IMPLICIT UnknownInfo`.
const UNKNOWN: u8 = 0x82;
/// How far in the future a `thisUpdate` may be (the responder's clock against ours).
const CLOCK_SKEW: i64 = 300;
/// How long a response without `nextUpdate` counts as fresh after its `thisUpdate`.
pub const FRESH_WITHOUT_NEXT_UPDATE: i64 = 24 * 3600;
/// The longest responder URL kept.
const MAX_URL: usize = 2048;

/// Why an OCSP answer is not stapled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The bytes are not a DER OCSP response (what is wrong).
    Malformed(&'static str),
    /// The responder did not answer `successful` (its `OCSPResponseStatus`).
    Unsuccessful(u8),
    /// No answer in it is about this certificate.
    OtherCertificate,
    /// The certificate is revoked.
    Revoked,
    /// The responder does not know the certificate.
    Unknown,
    /// `thisUpdate` is in the future.
    NotYetValid,
    /// Past its `nextUpdate` (or a day after its `thisUpdate` without one), Unix seconds.
    Stale(i64),
    /// Neither the issuer nor a responder certificate it signed for OCSP signed it.
    Signature,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Malformed(what) => write!(f, "not a DER OCSP response ({what})"),
            Refusal::Unsuccessful(status) => write!(
                f,
                "the responder answered {} ({status})",
                match status {
                    1 => "malformedRequest",
                    2 => "internalError",
                    3 => "tryLater",
                    5 => "sigRequired",
                    6 => "unauthorized",
                    _ => "an unknown status",
                }
            ),
            Refusal::OtherCertificate => f.write_str("it is about another certificate"),
            Refusal::Revoked => f.write_str("the certificate is revoked"),
            Refusal::Unknown => f.write_str("the responder does not know the certificate"),
            Refusal::NotYetValid => f.write_str("its thisUpdate is in the future"),
            Refusal::Stale(at) => write!(f, "it went stale at {}", super::server::date(*at)),
            Refusal::Signature => f.write_str(
                "its signature is not the issuer's, nor a responder's the issuer signed for OCSP",
            ),
        }
    }
}

/// A response that passed [`check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    /// Its `thisUpdate`, Unix seconds.
    pub this_update: i64,
    /// Its `nextUpdate`, if it has one.
    pub next_update: Option<i64>,
    /// Until when it may be stapled: `nextUpdate`, or [`FRESH_WITHOUT_NEXT_UPDATE`] after
    /// `thisUpdate`.
    pub until: i64,
}

/// The first `http://` OCSP responder URL in `leaf`'s Authority Information Access.
pub fn responder_url(leaf: &CertificateDer<'_>) -> Option<String> {
    let parts = x509::parts(leaf)?;
    let value = x509::extension(parts.extensions?, AIA_OID)?;
    let mut descriptions = Der(Der(value).expect(SEQUENCE)?);
    while let Some((tag, description)) = descriptions.next() {
        if tag != SEQUENCE {
            return None;
        }
        let mut description = Der(description);
        if description.expect(OID)? != AD_OCSP {
            continue;
        }
        if let Some((URI, url)) = description.next() {
            let url = std::str::from_utf8(url).ok()?;
            if url.len() <= MAX_URL && url.starts_with("http://") {
                return Some(url.to_owned());
            }
        }
    }
    None
}

/// The DER `OCSPRequest` for `leaf`, issued by `issuer` (a SHA-1 `CertID`, no nonce, as
/// RFC 5019 responders expect).
pub fn request(leaf: &CertificateDer<'_>, issuer: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let leaf = x509::parts(leaf)?;
    let issuer = x509::parts(issuer)?;
    let algorithm = tlv(SEQUENCE, &[tlv(OID, SHA1), vec![0x05, 0x00]].concat());
    let cert_id = tlv(
        SEQUENCE,
        &[
            algorithm,
            tlv(OCTET_STRING, &hash(SHA1, leaf.issuer)?),
            tlv(OCTET_STRING, &hash(SHA1, issuer.key)?),
            tlv(INTEGER, leaf.serial),
        ]
        .concat(),
    );
    let request = tlv(SEQUENCE, &cert_id);
    let list = tlv(SEQUENCE, &request);
    let tbs = tlv(SEQUENCE, &list);
    Some(tlv(SEQUENCE, &tbs))
}

/// Checks the DER `OCSPResponse` `response` for `leaf` at `now` (Unix seconds). Without the
/// `issuer` (a chain of one certificate), the issuer key hash and the signature cannot be
/// checked: the rest is.
pub fn check(
    response: &[u8],
    leaf: &CertificateDer<'_>,
    issuer: Option<&CertificateDer<'_>>,
    now: i64,
) -> Result<Checked, Refusal> {
    use Refusal::Malformed;
    let leaf = x509::parts(leaf).ok_or(Malformed("the certificate is not readable"))?;
    let issuer = match issuer {
        None => None,
        Some(der) => Some(x509::parts(der).ok_or(Malformed("the issuer is not readable"))?),
    };
    let mut outer = Der(Der(response)
        .expect(SEQUENCE)
        .ok_or(Malformed("no OCSPResponse"))?);
    let status = outer
        .expect(ENUMERATED)
        .ok_or(Malformed("no responseStatus"))?;
    match status {
        [0] => {}
        [other] => return Err(Refusal::Unsuccessful(*other)),
        _ => return Err(Malformed("a bad responseStatus")),
    }
    let mut bytes = Der(Der(outer
        .expect(CONTEXT_0)
        .ok_or(Malformed("no responseBytes"))?)
    .expect(SEQUENCE)
    .ok_or(Malformed("no ResponseBytes"))?);
    if bytes.expect(OID) != Some(OCSP_BASIC) {
        return Err(Malformed("not a basic OCSP response"));
    }
    let basic = bytes.expect(OCTET_STRING).ok_or(Malformed("no response"))?;
    let mut basic = Der(Der(basic)
        .expect(SEQUENCE)
        .ok_or(Malformed("no BasicOCSPResponse"))?);
    let (tag, data, signed) = basic.next_whole().ok_or(Malformed("no tbsResponseData"))?;
    if tag != SEQUENCE {
        return Err(Malformed("no ResponseData"));
    }
    let signature_algorithm = basic
        .expect(SEQUENCE)
        .ok_or(Malformed("no signatureAlgorithm"))?;
    let signature = basic
        .expect(BIT_STRING)
        .and_then(|b| b.split_first())
        .and_then(|(unused, bits)| (*unused == 0).then_some(bits))
        .ok_or(Malformed("no signature"))?;
    let certs = match basic.next() {
        Some((CONTEXT_0, certs)) => {
            Some(Der(certs).expect(SEQUENCE).ok_or(Malformed("bad certs"))?)
        }
        _ => None,
    };
    let single = single_response(data, &leaf, issuer.as_ref())?;
    if let Some(issuer) = &issuer {
        let signed_by = |key_algorithm: &[u8], key: &[u8]| {
            verify(key_algorithm, key, signature_algorithm, signed, signature)
        };
        if !signed_by(issuer.key_algorithm, issuer.key)
            && !delegated(certs, issuer).any(|r| signed_by(r.key_algorithm, r.key))
        {
            return Err(Refusal::Signature);
        }
    }
    let (status, this_update, next_update) = single;
    match status {
        GOOD => {}
        REVOKED => return Err(Refusal::Revoked),
        _ => return Err(Refusal::Unknown),
    }
    if this_update > now.saturating_add(CLOCK_SKEW) {
        return Err(Refusal::NotYetValid);
    }
    let until = next_update.unwrap_or(this_update.saturating_add(FRESH_WITHOUT_NEXT_UPDATE));
    if until <= now {
        return Err(Refusal::Stale(until));
    }
    Ok(Checked {
        this_update,
        next_update,
        until,
    })
}

/// The status tag, `thisUpdate` and `nextUpdate` of the `SingleResponse` about `leaf`.
fn single_response(
    data: &[u8],
    leaf: &x509::Parts<'_>,
    issuer: Option<&x509::Parts<'_>>,
) -> Result<(u8, i64, Option<i64>), Refusal> {
    use Refusal::Malformed;
    let mut data = Der(data);
    if data.peek_tag() == Some(CONTEXT_0) {
        data.next();
    }
    data.next().ok_or(Malformed("no responderID"))?;
    data.expect(GENERALIZED_TIME)
        .ok_or(Malformed("no producedAt"))?;
    let mut responses = Der(data.expect(SEQUENCE).ok_or(Malformed("no responses"))?);
    while let Some((tag, single)) = responses.next() {
        if tag != SEQUENCE {
            return Err(Malformed("a bad SingleResponse"));
        }
        let mut single = Der(single);
        let cert_id = single.expect(SEQUENCE).ok_or(Malformed("no certID"))?;
        if !is_about(cert_id, leaf, issuer) {
            continue;
        }
        let (status, _) = single.next().ok_or(Malformed("no certStatus"))?;
        if ![GOOD, REVOKED, UNKNOWN].contains(&status) {
            return Err(Malformed("a bad certStatus"));
        }
        let time = |contents: Option<&[u8]>| {
            contents
                .and_then(|t| x509::time(t, true))
                .ok_or(Malformed("a bad time"))
        };
        let this_update = time(single.expect(GENERALIZED_TIME))?;
        let next_update = match single.peek_tag() {
            Some(CONTEXT_0) => {
                let explicit = single.next().map(|(_, c)| c);
                Some(time(
                    explicit.and_then(|c| Der(c).expect(GENERALIZED_TIME)),
                )?)
            }
            _ => None,
        };
        return Ok((status, this_update, next_update));
    }
    Err(Refusal::OtherCertificate)
}

/// Whether `cert_id` names `leaf`: its serial, and the hashes of its issuer's name (and key,
/// when the issuer is known) under the CertID's own hash (SHA-1 or SHA-256).
fn is_about(cert_id: &[u8], leaf: &x509::Parts<'_>, issuer: Option<&x509::Parts<'_>>) -> bool {
    let read = || {
        let mut id = Der(cert_id);
        let algorithm = Der(id.expect(SEQUENCE)?).expect(OID)?;
        let name_hash = id.expect(OCTET_STRING)?;
        let key_hash = id.expect(OCTET_STRING)?;
        let serial = id.expect(INTEGER)?;
        Some((algorithm, name_hash, key_hash, serial))
    };
    let Some((algorithm, name_hash, key_hash, serial)) = read() else {
        return false;
    };
    serial == leaf.serial
        && hash(algorithm, leaf.issuer).is_some_and(|h| h == name_hash)
        && issuer.is_none_or(|issuer| hash(algorithm, issuer.key).is_some_and(|h| h == key_hash))
}

/// The responder certificates in `certs` that `issuer` signed for OCSP (extKeyUsage
/// id-kp-OCSPSigning).
fn delegated<'a>(
    certs: Option<&'a [u8]>,
    issuer: &'a x509::Parts<'a>,
) -> impl Iterator<Item = x509::Parts<'a>> + 'a {
    let mut certs = Der(certs.unwrap_or_default());
    std::iter::from_fn(move || {
        let (_, _, whole) = certs.next_whole()?;
        Some(whole)
    })
    .take(8)
    .filter_map(x509::parts)
    .filter(move |responder| {
        responder.issuer == issuer.subject
            && verify(
                issuer.key_algorithm,
                issuer.key,
                responder.signature_algorithm,
                responder.tbs,
                responder.signature,
            )
            && responder.extensions.is_some_and(|extensions| {
                x509::extension(extensions, EKU_OID).is_some_and(|eku| {
                    let Some(purposes) = Der(eku).expect(SEQUENCE) else {
                        return false;
                    };
                    let mut purposes = Der(purposes);
                    std::iter::from_fn(|| purposes.expect(OID)).any(|p| p == OCSP_SIGNING)
                })
            })
    })
}

/// Whether `signature` over `message` verifies with the key (`key_algorithm` contents, `key`
/// bits) under `signature_algorithm` (contents), by one of rustls' ring algorithms.
fn verify(
    key_algorithm: &[u8],
    key: &[u8],
    signature_algorithm: &[u8],
    message: &[u8],
    signature: &[u8],
) -> bool {
    let provider = rustls::crypto::ring::default_provider();
    provider
        .signature_verification_algorithms
        .all
        .iter()
        .filter(|a| {
            a.public_key_alg_id().as_ref() == key_algorithm
                && a.signature_alg_id().as_ref() == signature_algorithm
        })
        .any(|a| a.verify_signature(key, message, signature).is_ok())
}

/// `bytes` hashed with the algorithm `oid` (SHA-1 or SHA-256).
fn hash(oid: &[u8], bytes: &[u8]) -> Option<Vec<u8>> {
    let algorithm = match oid {
        SHA1 => &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        SHA256 => &ring::digest::SHA256,
        _ => return None,
    };
    Some(ring::digest::digest(algorithm, bytes).as_ref().to_vec())
}

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

#[cfg(test)]
mod tests;
