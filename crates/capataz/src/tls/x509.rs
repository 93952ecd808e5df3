//! The two facts capataz reads from a certificate itself: when it expires (`notAfter`) and the
//! DNS names it is for (subjectAltName), for choosing a certificate by SNI, the expiry warning
//! of `capataz check` and the expiry metric.
//!
//! A tiny DER reader, not an X.509 parser: it walks the fixed outline of RFC 5280's
//! `TBSCertificate` and reads nothing else. rustls verifies nothing here (a server's own
//! certificate is the operator's), so a certificate this cannot read is refused with a message
//! rather than guessed at. It is bounded: every length is checked against the bytes left, no
//! recursion, no allocation beyond the names it returns, and it never panics, whatever the
//! bytes (a proptest below).

/// What capataz reads from a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// `notAfter`, in seconds since the Unix epoch (UTC).
    pub(crate) not_after: i64,
    /// The subjectAltName DNS names, lowercase, as written (`*.example.com` included).
    pub(crate) dns_names: Vec<String>,
}

pub(super) const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
pub(super) const GENERALIZED_TIME: u8 = 0x18;
pub(super) const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
pub(super) const OCTET_STRING: u8 = 0x04;
pub(super) const INTEGER: u8 = 0x02;
pub(super) const BIT_STRING: u8 = 0x03;
pub(super) const ENUMERATED: u8 = 0x0a;
/// `[0]` EXPLICIT, constructed: the version.
const VERSION: u8 = 0xa0;
/// `[3]` EXPLICIT, constructed: the extensions.
const EXTENSIONS: u8 = 0xa3;
/// `dNSName [2] IA5String`, implicit, primitive.
const DNS_NAME: u8 = 0x82;
/// 2.5.29.17, subjectAltName.
const SAN_OID: &[u8] = &[0x55, 0x1d, 0x11];

/// A cursor over DER bytes.
pub(super) struct Der<'a>(pub(super) &'a [u8]);

impl<'a> Der<'a> {
    /// The next element whole (tag, length and contents), its tag and its contents.
    pub(super) fn next_whole(&mut self) -> Option<(u8, &'a [u8], &'a [u8])> {
        let start = self.0;
        let (tag, contents) = self.next()?;
        let used = start.len() - self.0.len();
        Some((tag, contents, &start[..used]))
    }

    /// The next element's tag and contents (short and long definite lengths, up to 4 length
    /// bytes; indefinite lengths are not DER).
    pub(super) fn next(&mut self) -> Option<(u8, &'a [u8])> {
        let (&tag, rest) = self.0.split_first()?;
        let (&first, mut rest) = rest.split_first()?;
        let length = if first < 0x80 {
            usize::from(first)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let (bytes, after) = rest.split_at(count);
            rest = after;
            bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
        };
        if rest.len() < length {
            return None;
        }
        let (contents, after) = rest.split_at(length);
        self.0 = after;
        Some((tag, contents))
    }

    /// The next element, which must have `tag`.
    pub(super) fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        match self.next()? {
            (found, contents) if found == tag => Some(contents),
            _ => None,
        }
    }

    pub(super) fn peek_tag(&self) -> Option<u8> {
        self.0.first().copied()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Reads `notAfter` and the SAN DNS names of a DER certificate; `None` if the bytes are not
/// the outline of one.
pub(crate) fn read(der: &[u8]) -> Option<Facts> {
    let certificate = Der(der).expect(SEQUENCE)?;
    let mut tbs = Der(Der(certificate).expect(SEQUENCE)?);
    if tbs.peek_tag() == Some(VERSION) {
        tbs.next()?;
    }
    tbs.next()?; // serialNumber
    tbs.expect(SEQUENCE)?; // signature
    tbs.expect(SEQUENCE)?; // issuer
    let mut validity = Der(tbs.expect(SEQUENCE)?);
    validity.next()?; // notBefore
    let not_after = match validity.next()? {
        (UTC_TIME, text) => time(text, false)?,
        (GENERALIZED_TIME, text) => time(text, true)?,
        _ => return None,
    };
    tbs.expect(SEQUENCE)?; // subject
    tbs.expect(SEQUENCE)?; // subjectPublicKeyInfo
    let mut dns_names = Vec::new();
    while let Some((tag, contents)) = tbs.next() {
        if tag == EXTENSIONS {
            dns_names = san_names(contents)?;
        }
    }
    Some(Facts {
        not_after,
        dns_names,
    })
}

/// The fields of a certificate OCSP needs, as slices of its DER.
#[derive(Debug)]
pub(super) struct Parts<'a> {
    /// The whole `TBSCertificate` (what the issuer signed).
    pub(super) tbs: &'a [u8],
    /// The serial number's contents.
    pub(super) serial: &'a [u8],
    /// The issuer `Name`, whole.
    pub(super) issuer: &'a [u8],
    /// The subject `Name`, whole.
    pub(super) subject: &'a [u8],
    /// The subject public key's algorithm identifier (contents) and key bits.
    pub(super) key_algorithm: &'a [u8],
    /// The subject public key's bits (the BIT STRING's contents after its unused-bits byte).
    pub(super) key: &'a [u8],
    /// The extensions (`SEQUENCE OF Extension` contents), if any.
    pub(super) extensions: Option<&'a [u8]>,
    /// The signature algorithm (contents) and the signature's bits.
    pub(super) signature_algorithm: &'a [u8],
    /// The signature's bits.
    pub(super) signature: &'a [u8],
}

/// A certificate's [`Parts`]; `None` if the bytes are not the outline of one.
pub(super) fn parts(der: &[u8]) -> Option<Parts<'_>> {
    let mut certificate = Der(Der(der).expect(SEQUENCE)?);
    let (tag, tbs_contents, tbs) = certificate.next_whole()?;
    if tag != SEQUENCE {
        return None;
    }
    let signature_algorithm = certificate.expect(SEQUENCE)?;
    let signature = bits(certificate.expect(BIT_STRING)?)?;
    let mut fields = Der(tbs_contents);
    if fields.peek_tag() == Some(VERSION) {
        fields.next()?;
    }
    let serial = fields.expect(INTEGER)?;
    fields.expect(SEQUENCE)?; // signature
    let (tag, _, issuer) = fields.next_whole()?;
    if tag != SEQUENCE {
        return None;
    }
    fields.expect(SEQUENCE)?; // validity
    let (tag, _, subject) = fields.next_whole()?;
    if tag != SEQUENCE {
        return None;
    }
    let mut spki = Der(fields.expect(SEQUENCE)?);
    let key_algorithm = spki.expect(SEQUENCE)?;
    let key = bits(spki.expect(BIT_STRING)?)?;
    let mut extensions = None;
    while let Some((tag, contents)) = fields.next() {
        if tag == EXTENSIONS {
            extensions = Some(Der(contents).expect(SEQUENCE)?);
        }
    }
    Some(Parts {
        tbs,
        serial,
        issuer,
        subject,
        key_algorithm,
        key,
        extensions,
        signature_algorithm,
        signature,
    })
}

/// The value (`extnValue`'s contents) of the extension `oid` among `extensions`.
pub(super) fn extension<'a>(extensions: &'a [u8], oid: &[u8]) -> Option<&'a [u8]> {
    let mut extensions = Der(extensions);
    while !extensions.is_empty() {
        let mut extension = Der(extensions.expect(SEQUENCE)?);
        if extension.expect(OID)? != oid {
            continue;
        }
        if extension.peek_tag() == Some(BOOLEAN) {
            extension.next()?;
        }
        return extension.expect(OCTET_STRING);
    }
    None
}

/// A BIT STRING's bits, which must be whole bytes (no unused bits).
fn bits(contents: &[u8]) -> Option<&[u8]> {
    match contents.split_first()? {
        (0, rest) => Some(rest),
        _ => None,
    }
}

/// The DNS names of the subjectAltName extension in `[3] { SEQUENCE OF Extension }`.
fn san_names(explicit: &[u8]) -> Option<Vec<String>> {
    let mut extensions = Der(Der(explicit).expect(SEQUENCE)?);
    let mut names = Vec::new();
    while !extensions.is_empty() {
        let mut extension = Der(extensions.expect(SEQUENCE)?);
        if extension.expect(OID)? != SAN_OID {
            continue;
        }
        if extension.peek_tag() == Some(BOOLEAN) {
            extension.next()?;
        }
        let value = extension.expect(OCTET_STRING)?;
        let mut general_names = Der(Der(value).expect(SEQUENCE)?);
        while let Some((tag, name)) = general_names.next() {
            if tag == DNS_NAME {
                names.push(String::from_utf8_lossy(name).to_ascii_lowercase());
            }
        }
    }
    Some(names)
}

/// `YYMMDDHHMMSSZ` (UTCTime, years 1950-2049) or `YYYYMMDDHHMMSSZ` (GeneralizedTime) as Unix
/// seconds. RFC 5280 requires seconds and `Z`; anything else is refused.
pub(super) fn time(text: &[u8], generalized: bool) -> Option<i64> {
    let digits = text.strip_suffix(b"Z")?;
    if digits.len() != if generalized { 14 } else { 12 } || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| {
        digits[range]
            .iter()
            .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'))
    };
    let (year, rest) = if generalized {
        (number(0..4), 4)
    } else {
        let yy = number(0..2);
        (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
    };
    let (month, day) = (number(rest..rest + 2), number(rest + 2..rest + 4));
    let (hour, minute, second) = (
        number(rest + 4..rest + 6),
        number(rest + 6..rest + 8),
        number(rest + 8..rest + 10),
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    Some(
        crate::timefmt::days_from_civil(year, month, day) * 86_400
            + hour * 3600
            + minute * 60
            + second,
    )
}

/// The (year, month, day) of a day since 1970-01-01, within what a certificate can say
/// (years 0 to 9999).
pub(crate) fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let (year, month, day) = crate::timefmt::civil_from_days(days.clamp(-719_468, 2_932_896));
    (year as i32, month as u8, day as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_expiry_and_the_names_of_an_rcgen_certificate() {
        let mut params =
            rcgen::CertificateParams::new(vec!["Example.com".into(), "*.example.com".into()])
                .unwrap();
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
        let params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            read(cert.der()).expect("a certificate").dns_names,
            Vec::<String>::new()
        );
    }

    #[test]
    fn days_and_dates_round_trip() {
        for days in [-719_468, -1, 0, 11_016, 19_782, 20_788, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(
                crate::timefmt::days_from_civil(y.into(), m.into(), d.into()),
                days,
                "{y}-{m}-{d}"
            );
        }
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn times_of_both_kinds() {
        assert_eq!(time(b"700101000000Z", false), Some(0));
        assert_eq!(time(b"491231235959Z", false), Some(2_524_607_999));
        assert_eq!(time(b"20000301000000Z", true), Some(951_868_800));
        assert_eq!(time(b"20000301000000", true), None);
        assert_eq!(time(b"2000030100000Z", true), None);
        assert_eq!(time(b"20001301000000Z", true), None);
    }

    #[test]
    fn truncated_or_garbled_certificates_are_refused() {
        let params = rcgen::CertificateParams::new(vec!["a.test".into()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let der = params.self_signed(&key).unwrap().der().to_vec();
        for end in 0..der.len() {
            let _ = read(&der[..end]);
        }
        assert_eq!(read(&[]), None);
        assert_eq!(read(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
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
            let params = rcgen::CertificateParams::new(vec!["a.test".into()]).unwrap();
            let key = rcgen::KeyPair::generate().unwrap();
            let mut der = params.self_signed(&key).unwrap().der().to_vec();
            for (at, byte) in flips {
                let len = der.len();
                der[at % len] = byte;
            }
            let _ = read(&der);
        }
    }
}
