//! OCSP (RFC 6960) for stapling: the responder URL of a certificate (its Authority Information
//! Access extension), the request for its status, and the check of an answer before it is
//! stapled: a successful basic response, for this certificate (serial, issuer name and key
//! hashes), signed by the issuer or by a responder certificate the issuer signed for OCSP,
//! status `good`, and within its times (`thisUpdate` not in the future, `nextUpdate` not past).
//!
//! Pure: no IO, no clock (the caller passes `now`). The DER is read and written by RustCrypto's
//! `x509-ocsp` and `x509-cert` (through `x509.rs`): strict DER, every length checked, never a
//! panic whatever the bytes (a proptest below). The signature is checked over the
//! `tbsResponseData` bytes as sent. Hashes (SHA-1, which RFC 5019 responders expect in a
//! request, and SHA-256) are ring's; the signature algorithms are rustls' ring provider's.

use std::fmt;

use rustls::pki_types::CertificateDer;
use x509_cert::der::asn1::{AnyRef, Null, OctetString};
use x509_cert::der::oid::db::{rfc5280, rfc5912, rfc6960};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{self, Decode, Encode, Reader, SliceReader, Tag, TagNumber, Tagged};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{AuthorityInfoAccessSyntax, ExtendedKeyUsage};
use x509_cert::spki::AlgorithmIdentifierOwned;
use x509_ocsp::{
    CertId, CertStatus, OcspRequest, OcspResponse, OcspResponseStatus, Request, ResponseData,
    SingleResponse, TbsRequest, Version,
};

use super::x509::{Cert, PublicKey, Signed};

/// How far in the future a `thisUpdate` may be (the responder's clock against ours).
const CLOCK_SKEW: i64 = 300;
/// How long a response without `nextUpdate` counts as fresh after its `thisUpdate`.
pub const FRESH_WITHOUT_NEXT_UPDATE: i64 = 24 * 3600;
/// The longest responder URL kept.
const MAX_URL: usize = 2048;
/// The most certificates of a response looked at for a delegated responder.
const MAX_RESPONDERS: usize = 8;

/// Why an OCSP answer is not stapled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The bytes are not a DER OCSP response: the part that is not (or what is wrong with it),
    /// and what the DER reader said when it said something.
    Malformed {
        /// The part, in words.
        part: &'static str,
        /// The DER error, when the bytes broke DER or the part's structure.
        error: Option<der::Error>,
    },
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
    /// Neither the issuer nor a responder certificate it signed for OCSP (and valid now)
    /// signed it.
    Signature,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Malformed { part, error: None } => {
                write!(f, "not a DER OCSP response ({part})")
            }
            Refusal::Malformed {
                part,
                error: Some(error),
            } => write!(f, "not a DER OCSP response ({part}: {error})"),
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

impl std::error::Error for Refusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Refusal::Malformed {
                error: Some(error), ..
            } => Some(error),
            _ => None,
        }
    }
}

/// A [`Refusal::Malformed`] of `part` for a DER error.
fn malformed(part: &'static str) -> impl FnOnce(der::Error) -> Refusal {
    move |error| Refusal::Malformed {
        part,
        error: Some(error),
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
    let leaf = Cert::read(leaf).ok()?;
    let access = leaf.extension::<AuthorityInfoAccessSyntax>().ok()??;
    access
        .0
        .iter()
        .find_map(|description| match &description.access_location {
            GeneralName::UniformResourceIdentifier(url)
                if description.access_method == rfc5280::ID_AD_OCSP
                    && url.as_str().len() <= MAX_URL
                    && url.as_str().starts_with("http://") =>
            {
                Some(url.as_str().to_owned())
            }
            _ => None,
        })
}

/// The DER `OCSPRequest` for `leaf`, issued by `issuer` (a SHA-1 `CertID`, no nonce, as
/// RFC 5019 responders expect).
pub fn request(leaf: &CertificateDer<'_>, issuer: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let leaf = Cert::read(leaf).ok()?;
    let issuer = Cert::read(issuer).ok()?;
    let sha1 = rfc5912::ID_SHA_1;
    let issuer_name = leaf.tbs.issuer.to_der().ok()?;
    let issuer_key = issuer
        .tbs
        .subject_public_key_info
        .subject_public_key
        .raw_bytes();
    let cert_id = CertId {
        hash_algorithm: AlgorithmIdentifierOwned {
            oid: sha1,
            parameters: Some(Null.into()),
        },
        issuer_name_hash: OctetString::new(hash(&sha1, &issuer_name)?).ok()?,
        issuer_key_hash: OctetString::new(hash(&sha1, issuer_key)?).ok()?,
        serial_number: leaf.tbs.serial_number,
    };
    let request = OcspRequest {
        tbs_request: TbsRequest {
            version: Version::V1,
            requestor_name: None,
            request_list: vec![Request {
                req_cert: cert_id,
                single_request_extensions: None,
            }],
            request_extensions: None,
        },
        optional_signature: None,
    };
    request.to_der().ok()
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
    let leaf = Cert::read(leaf).map_err(malformed("the certificate is not readable"))?;
    let issuer = issuer
        .map(|der| Cert::read(der))
        .transpose()
        .map_err(malformed("the issuer is not readable"))?;
    let outer = OcspResponse::from_der(response).map_err(malformed("the OCSPResponse"))?;
    let basic = Signed::read(basic_bytes(&outer)?).map_err(malformed("the BasicOCSPResponse"))?;
    let data = ResponseData::from_der(basic.tbs).map_err(malformed("the tbsResponseData"))?;
    let certs = carried(basic.extra).map_err(malformed("its certs"))?;
    let single = single_response(&data, &leaf, issuer.as_ref())?;
    if let Some(issuer) = &issuer {
        signed_by(&basic, &certs, issuer, now)?;
    }
    match single.cert_status {
        CertStatus::Good(_) => {}
        CertStatus::Revoked(_) => return Err(Refusal::Revoked),
        CertStatus::Unknown(_) => return Err(Refusal::Unknown),
    }
    let this_update = unix(&single.this_update.0);
    let next_update = single.next_update.map(|next| unix(&next.0));
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

/// The DER `BasicOCSPResponse` of a successful `response`.
fn basic_bytes(response: &OcspResponse) -> Result<&[u8], Refusal> {
    let malformed = |part| Refusal::Malformed { part, error: None };
    if response.response_status != OcspResponseStatus::Successful {
        return Err(Refusal::Unsuccessful(response.response_status as u8));
    }
    let bytes = response
        .response_bytes
        .as_ref()
        .ok_or(malformed("no responseBytes"))?;
    if bytes.response_type != rfc6960::ID_PKIX_OCSP_BASIC {
        return Err(malformed("not a basic OCSP response"));
    }
    Ok(bytes.response.as_bytes())
}

/// The certificates a basic response carries (`[0] EXPLICIT SEQUENCE OF Certificate`), each
/// whole as sent, the first [`MAX_RESPONDERS`] of them.
fn carried(extra: Option<&[u8]>) -> der::Result<Vec<&[u8]>> {
    let Some(extra) = extra else {
        return Ok(Vec::new());
    };
    let explicit = AnyRef::from_der(extra)?;
    explicit.tag().assert_eq(Tag::ContextSpecific {
        constructed: true,
        number: TagNumber::N0,
    })?;
    let mut reader = SliceReader::new(explicit.value())?;
    let certs = reader.sequence(|list| {
        let mut certs = Vec::new();
        while !list.is_finished() {
            let cert = list.tlv_bytes()?;
            if certs.len() < MAX_RESPONDERS {
                certs.push(cert);
            }
        }
        Ok(certs)
    })?;
    reader.finish(certs)
}

/// The `SingleResponse` about `leaf`.
fn single_response<'d>(
    data: &'d ResponseData,
    leaf: &Cert<'_>,
    issuer: Option<&Cert<'_>>,
) -> Result<&'d SingleResponse, Refusal> {
    data.responses
        .iter()
        .find(|single| is_about(&single.cert_id, leaf, issuer))
        .ok_or(Refusal::OtherCertificate)
}

/// Whether `cert_id` names `leaf`: its serial, and the hashes of its issuer's name (and key,
/// when the issuer is known) under the CertID's own hash (SHA-1 or SHA-256).
fn is_about(cert_id: &CertId, leaf: &Cert<'_>, issuer: Option<&Cert<'_>>) -> bool {
    let algorithm = &cert_id.hash_algorithm.oid;
    let hashes_to = |bytes: &[u8], expected: &OctetString| {
        hash(algorithm, bytes).is_some_and(|h| h == expected.as_bytes())
    };
    // A `Name` re-encodes to the bytes it was read from (DER has one encoding of it).
    let Ok(issuer_name) = leaf.tbs.issuer.to_der() else {
        return false;
    };
    cert_id.serial_number == leaf.tbs.serial_number
        && hashes_to(&issuer_name, &cert_id.issuer_name_hash)
        && issuer.is_none_or(|issuer| {
            let key = issuer
                .tbs
                .subject_public_key_info
                .subject_public_key
                .raw_bytes();
            hashes_to(key, &cert_id.issuer_key_hash)
        })
}

/// Whether `basic` was signed by `issuer`, or by one of `certs` that `issuer` signed for OCSP
/// and that is valid at `now`.
fn signed_by(
    basic: &Signed<'_>,
    certs: &[&[u8]],
    issuer: &Cert<'_>,
    now: i64,
) -> Result<(), Refusal> {
    let issuer_key = issuer
        .public_key()
        .map_err(malformed("the issuer's key is not readable"))?;
    if verify(&issuer_key, basic) {
        return Ok(());
    }
    let by_delegate = certs
        .iter()
        .filter_map(|der| Cert::read(der).ok())
        .filter(|responder| delegated(responder, issuer, &issuer_key, now))
        .any(|responder| responder.public_key().is_ok_and(|key| verify(&key, basic)));
    if by_delegate {
        Ok(())
    } else {
        Err(Refusal::Signature)
    }
}

/// Whether `responder` is a responder certificate `issuer` signed for OCSP (extKeyUsage
/// id-kp-OCSPSigning), valid at `now`.
fn delegated(responder: &Cert<'_>, issuer: &Cert<'_>, issuer_key: &PublicKey, now: i64) -> bool {
    responder.tbs.issuer == issuer.tbs.subject
        && verify(issuer_key, &responder.signed)
        && responder.valid_at(now)
        && responder
            .extension::<ExtendedKeyUsage>()
            .is_ok_and(|usage| usage.is_some_and(|u| u.0.contains(&rfc5280::ID_KP_OCSP_SIGNING)))
}

/// Whether `signed`'s signature verifies with `key`, by one of rustls' ring algorithms.
fn verify(key: &PublicKey, signed: &Signed<'_>) -> bool {
    let provider = rustls::crypto::ring::default_provider();
    provider
        .signature_verification_algorithms
        .all
        .iter()
        .filter(|a| {
            a.public_key_alg_id().as_ref() == key.algorithm
                && a.signature_alg_id().as_ref() == signed.algorithm
        })
        .any(|a| {
            a.verify_signature(&key.bits, signed.tbs, signed.signature)
                .is_ok()
        })
}

/// `bytes` hashed with the algorithm `oid` (SHA-1 or SHA-256).
fn hash(oid: &ObjectIdentifier, bytes: &[u8]) -> Option<Vec<u8>> {
    let algorithm = match *oid {
        rfc5912::ID_SHA_1 => &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        rfc5912::ID_SHA_256 => &ring::digest::SHA256,
        _ => return None,
    };
    Some(ring::digest::digest(algorithm, bytes).as_ref().to_vec())
}

/// A `GeneralizedTime` in Unix seconds (`der` reads the years 1970 to 9999).
fn unix(time: &der::asn1::GeneralizedTime) -> i64 {
    i64::try_from(time.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
