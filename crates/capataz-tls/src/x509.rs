//! What capataz reads from a certificate: when it expires (`notAfter`) and the DNS names it is
//! for (subjectAltName), for choosing a certificate by SNI, the expiry warning of `capataz
//! check` and the expiry metric; and, for OCSP (`ocsp.rs`), a certificate's fields with the
//! bytes its issuer signed.
//!
//! The DER is read by RustCrypto's `x509-cert` (on `der`): strict DER, every length checked
//! against the bytes left, never a panic whatever the bytes (proptests below). rustls verifies
//! nothing here (a server's own certificate is the operator's), so a certificate this cannot
//! read is refused with a message rather than guessed at. A signature is checked over the bytes
//! that were signed as they were sent ([`Signed`]), never over a re-encoding of what was read.

use x509_cert::der::asn1::{AnyRef, BitStringRef};
use x509_cert::der::{self, Decode, Encode, Reader, SliceReader, Tag, Tagged};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::Time;
use x509_cert::TbsCertificate;

/// What capataz reads from a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// `notAfter`, in seconds since the Unix epoch (UTC).
    pub(crate) not_after: i64,
    /// The subjectAltName DNS names, lowercase, as written (`*.example.com` included).
    pub(crate) dns_names: Vec<String>,
}

/// Reads `notAfter` and the SAN DNS names of a DER certificate, or says why it cannot.
pub(crate) fn read(der: &[u8]) -> der::Result<Facts> {
    let cert = Cert::read(der)?;
    let dns_names = match cert.extension::<SubjectAltName>()? {
        None => Vec::new(),
        Some(names) => names
            .0
            .iter()
            .filter_map(|name| match name {
                GeneralName::DnsName(dns) => Some(dns.as_str().to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
    };
    Ok(Facts {
        not_after: unix(cert.tbs.validity.not_after),
        dns_names,
    })
}

/// A certificate read: its fields, and the parts its issuer signed as they were sent.
#[derive(Debug)]
pub(super) struct Cert<'a> {
    /// The `TBSCertificate`'s fields.
    pub(super) tbs: TbsCertificate,
    /// What the issuer signed, how, and the signature.
    pub(super) signed: Signed<'a>,
}

impl<'a> Cert<'a> {
    /// Reads the DER certificate `der`.
    pub(super) fn read(der: &'a [u8]) -> der::Result<Cert<'a>> {
        let signed = Signed::read(der)?;
        if signed.extra.is_some() {
            // A Certificate is three elements; the fourth is not one.
            return Err(Tag::Sequence.length_error());
        }
        let tbs = TbsCertificate::from_der(signed.tbs)?;
        Ok(Cert { tbs, signed })
    }

    /// The extension `T`, decoded, if the certificate has it (an error if twice).
    pub(super) fn extension<T>(&self) -> der::Result<Option<T>>
    where
        T: for<'b> Decode<'b> + der::oid::AssociatedOid,
    {
        Ok(self.tbs.get::<T>()?.map(|(_critical, value)| value))
    }

    /// Whether `now` (Unix seconds) is within the certificate's validity.
    pub(super) fn valid_at(&self, now: i64) -> bool {
        unix(self.tbs.validity.not_before) <= now && now < unix(self.tbs.validity.not_after)
    }

    /// The subject public key, as signature algorithms take it.
    pub(super) fn public_key(&self) -> der::Result<PublicKey> {
        PublicKey::read(&self.tbs.subject_public_key_info)
    }
}

/// A public key as rustls' verification algorithms take it.
#[derive(Debug)]
pub(super) struct PublicKey {
    /// The key's `AlgorithmIdentifier` contents (the algorithm and its parameters).
    pub(super) algorithm: Vec<u8>,
    /// The key's bits (the BIT STRING's contents after its unused-bits byte).
    pub(super) bits: Vec<u8>,
}

impl PublicKey {
    fn read(info: &SubjectPublicKeyInfoOwned) -> der::Result<PublicKey> {
        // `AlgorithmIdentifier { OID, ANY }` re-encodes to the bytes it was read from: the OID
        // and the parameters are kept as read, and DER has one encoding of their SEQUENCE.
        let algorithm = info.algorithm.to_der()?;
        let bits = info
            .subject_public_key
            .as_bytes()
            .ok_or_else(|| Tag::BitString.value_error())?;
        Ok(PublicKey {
            algorithm: AnyRef::from_der(&algorithm)?.value().to_vec(),
            bits: bits.to_vec(),
        })
    }
}

/// A signed DER object as sent, `SEQUENCE { tbs, signatureAlgorithm, signature, [extra] }`: a
/// certificate, or an OCSP basic response (whose `extra` is its `[0] certs`).
#[derive(Debug)]
pub(super) struct Signed<'a> {
    /// What was signed, whole (tag, length and contents).
    pub(super) tbs: &'a [u8],
    /// The signature algorithm's `AlgorithmIdentifier` contents.
    pub(super) algorithm: &'a [u8],
    /// The signature's bits (whole bytes: a signature has no unused bits).
    pub(super) signature: &'a [u8],
    /// The one element after the signature, whole, if there is one.
    pub(super) extra: Option<&'a [u8]>,
}

impl<'a> Signed<'a> {
    /// Reads the outline of `der` (a DER `SEQUENCE` of three or four elements, and nothing
    /// after it).
    pub(super) fn read(der: &'a [u8]) -> der::Result<Signed<'a>> {
        let mut reader = SliceReader::new(der)?;
        let signed = reader.sequence(|fields| {
            let tbs = fields.tlv_bytes()?;
            let algorithm = AnyRef::decode(fields)?;
            algorithm.tag().assert_eq(Tag::Sequence)?;
            let signature = BitStringRef::decode(fields)?
                .as_bytes()
                .ok_or_else(|| Tag::BitString.value_error())?;
            let extra = if fields.is_finished() {
                None
            } else {
                Some(fields.tlv_bytes()?)
            };
            Ok(Signed {
                tbs,
                algorithm: algorithm.value(),
                signature,
                extra,
            })
        })?;
        reader.finish(signed)
    }
}

/// A certificate time in Unix seconds (`der` reads the years 1970 to 9999: never negative, and
/// far within an `i64`).
fn unix(time: Time) -> i64 {
    i64::try_from(time.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
}

/// The (year, month, day) of a day since 1970-01-01, within what a certificate can say
/// (years 0 to 9999).
pub(crate) fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let (year, month, day) = capataz_timefmt::civil_from_days(days.clamp(-719_468, 2_932_896));
    (year as i32, month as u8, day as u8)
}

#[cfg(test)]
mod tests;
