//! A certificate's identifier for ACME Renewal Information (ARI, RFC 9773 section 4.1): the
//! `keyIdentifier` of its Authority Key Identifier extension and its serial number, as the CA
//! wrote them, read by `x509-cert` (strict DER, never a panic whatever the bytes).

use x509_cert::der::{self, EncodeValue};
use x509_cert::ext::pkix::AuthorityKeyIdentifier;

use crate::x509::Cert;

/// The two parts of a certificate's ARI identifier, raw (the ACME client base64url-encodes
/// them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateId {
    /// The Authority Key Identifier extension's `keyIdentifier` octets.
    pub key_identifier: Vec<u8>,
    /// The serial number's DER contents octets (no tag or length; a leading zero kept).
    pub serial: Vec<u8>,
}

/// The ARI identifier of DER certificate `der`; `None` when it has no Authority Key
/// Identifier with a `keyIdentifier` (such a certificate cannot be asked about).
pub fn certificate_id(der: &[u8]) -> der::Result<Option<CertificateId>> {
    let cert = Cert::read(der)?;
    let Some(aki) = cert.extension::<AuthorityKeyIdentifier>()? else {
        return Ok(None);
    };
    let Some(key_identifier) = aki.key_identifier else {
        return Ok(None);
    };
    let mut serial = Vec::new();
    cert.tbs.serial_number.encode_value(&mut serial)?;
    Ok(Some(CertificateId {
        key_identifier: key_identifier.as_bytes().to_vec(),
        serial,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyIdMethod, KeyPair, SerialNumber};

    /// A leaf signed by a CA whose key identifier is RFC 9773's example's, with its serial.
    fn leaf(serial: &[u8], aki: bool) -> Vec<u8> {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_identifier_method = KeyIdMethod::PreSpecified(vec![
            0x69, 0x88, 0x5B, 0x6B, 0x87, 0x46, 0x40, 0x41, 0xE1, 0xB3, 0x7B, 0x84, 0x7B, 0xA0,
            0xAE, 0x2C, 0xDE, 0x01, 0xC8, 0xD4,
        ]);
        let ca = ca.self_signed(&ca_key).unwrap();
        let mut params = CertificateParams::new(vec!["example.com".to_owned()]).unwrap();
        params.serial_number = Some(SerialNumber::from_slice(serial));
        params.use_authority_key_identifier_extension = aki;
        let key = KeyPair::generate().unwrap();
        params.signed_by(&key, &ca, &ca_key).unwrap().der().to_vec()
    }

    #[test]
    fn the_identifier_is_the_authority_key_identifier_and_the_serial_as_written() {
        // RFC 9773, section 4.1: serial 0x87654321 is written 00 87 65 43 21.
        let id = certificate_id(&leaf(&[0x87, 0x65, 0x43, 0x21], true))
            .unwrap()
            .unwrap();
        assert_eq!(
            id.key_identifier,
            [
                0x69, 0x88, 0x5B, 0x6B, 0x87, 0x46, 0x40, 0x41, 0xE1, 0xB3, 0x7B, 0x84, 0x7B, 0xA0,
                0xAE, 0x2C, 0xDE, 0x01, 0xC8, 0xD4
            ]
        );
        assert_eq!(id.serial, [0x00, 0x87, 0x65, 0x43, 0x21]);
    }

    #[test]
    fn a_certificate_without_authority_key_identifier_has_no_identifier() {
        assert_eq!(certificate_id(&leaf(&[0x01, 0x02], false)).unwrap(), None);
    }

    #[test]
    fn bytes_that_are_not_a_certificate_are_an_error() {
        assert!(certificate_id(b"\x30\x03\x02\x01").is_err());
        assert!(certificate_id(b"").is_err());
    }
}
