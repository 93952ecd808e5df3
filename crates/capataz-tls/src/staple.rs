//! OCSP stapling of a listener's certificates, static and ACME-issued: the slot the SNI
//! resolver reads each certificate from ([`StapleSlot`]: the certificate alone, or with the
//! OCSP response in force until it goes stale), and what the runtime needs to keep a response
//! fetched ([`OcspFetch`]). An ACME certificate has its own slot, made with it: a renewed
//! certificate starts without a staple, so the old certificate's response is never served
//! with the new one.
//!
//! A staple is never served past the time it was checked to be fresh until (its `nextUpdate`):
//! the resolver compares it with the clock at every handshake, so a response that the runtime
//! could not refresh in time, or one read from a file and never replaced, stops being stapled
//! by itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;

/// One certificate as the resolver serves it.
#[derive(Debug)]
pub struct StapleSlot {
    plain: Arc<CertifiedKey>,
    stapled: ArcSwapOption<Stapled>,
}

#[derive(Debug)]
struct Stapled {
    key: Arc<CertifiedKey>,
    /// Unix seconds after which it is not stapled.
    until: i64,
}

impl StapleSlot {
    /// A slot serving `key` without a staple.
    pub(super) fn new(key: CertifiedKey) -> StapleSlot {
        StapleSlot {
            plain: Arc::new(key),
            stapled: ArcSwapOption::empty(),
        }
    }

    /// The certificate to serve at `now` (Unix seconds): with its response while it is fresh.
    pub(super) fn current(&self, now: i64) -> Arc<CertifiedKey> {
        match &*self.stapled.load() {
            Some(stapled) if now < stapled.until => stapled.key.clone(),
            _ => self.plain.clone(),
        }
    }

    /// Staples `response` (a checked DER `OCSPResponse`) until `until` (Unix seconds).
    pub fn staple(&self, response: Vec<u8>, until: i64) {
        let mut key = (*self.plain).clone();
        key.ocsp = Some(response);
        self.stapled.store(Some(Arc::new(Stapled {
            key: Arc::new(key),
            until,
        })));
    }

    /// Stops stapling (the certificate was found revoked).
    pub fn unstaple(&self) {
        self.stapled.store(None);
    }

    /// Until when the response in force is stapled, if one is.
    pub fn stapled_until(&self) -> Option<i64> {
        self.stapled.load().as_ref().map(|s| s.until)
    }

    /// The certificate chain.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.plain.cert
    }
}

/// A certificate whose OCSP response the runtime fetches (`ocsp_fetch = true`).
#[derive(Clone, Debug)]
pub struct OcspFetch {
    /// Its chain's file, for the logs.
    pub file: PathBuf,
    /// The slot to staple into.
    pub slot: Arc<StapleSlot>,
    /// The responder's URL (`http://`), from the certificate's AIA.
    pub url: String,
    /// The DER `OCSPRequest`.
    pub request: Vec<u8>,
}

/// Why no OCSP response is fetched for a certificate (its chain's file), for a note.
#[derive(Debug, thiserror::Error)]
pub enum NoFetch {
    /// The chain holds only the server's certificate.
    #[error(
        "{}: no OCSP response is fetched: the chain holds no issuer certificate after the \
         server's (append the intermediate to the file)",
        .0.display()
    )]
    ChainWithoutIssuer(PathBuf),
    /// The certificate's Authority Information Access names no `http://` OCSP responder.
    #[error(
        "{}: no OCSP response is fetched: the certificate names no http:// OCSP responder (its \
         CA runs none)",
        .0.display()
    )]
    NoResponderUrl(PathBuf),
    /// The certificate ID could not be built.
    #[error("{}: no OCSP request can be made for it", .0.display())]
    RequestNotMade(PathBuf),
}

impl OcspFetch {
    /// What fetching the OCSP response of the certificate in `slot` (its chain read from
    /// `file`) needs, or why it cannot be.
    pub fn new(file: PathBuf, slot: Arc<StapleSlot>) -> Result<OcspFetch, NoFetch> {
        let chain = slot.chain();
        let (Some(leaf), Some(issuer)) = (chain.first(), chain.get(1)) else {
            return Err(NoFetch::ChainWithoutIssuer(file));
        };
        let Some(url) = super::ocsp::responder_url(leaf) else {
            return Err(NoFetch::NoResponderUrl(file));
        };
        let Some(request) = super::ocsp::request(leaf, issuer) else {
            return Err(NoFetch::RequestNotMade(file));
        };
        Ok(OcspFetch {
            file,
            slot,
            url,
            request,
        })
    }

    /// The certificate and its issuer (the chain's second certificate, which a fetch needs;
    /// always there: [`OcspFetch::new`] builds one only for such chains).
    pub fn leaf_and_issuer(&self) -> Option<(&CertificateDer<'static>, &CertificateDer<'static>)> {
        let chain = self.slot.chain();
        Some((chain.first()?, chain.get(1)?))
    }
}

/// The wall clock in Unix seconds.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staple_is_served_until_its_end_and_not_from_then_on() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let params = rcgen::CertificateParams::new(vec!["a.test".to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let signing = rustls::crypto::ring::default_provider()
            .key_provider
            .load_private_key(der)
            .expect("signing key");
        let slot = StapleSlot::new(CertifiedKey::new(vec![cert.der().clone()], signing));
        assert_eq!(slot.current(0).ocsp, None);
        slot.staple(vec![0x30, 0], 100);
        assert_eq!(slot.current(99).ocsp, Some(vec![0x30, 0]));
        assert_eq!(slot.current(100).ocsp, None, "stale at its end");
        assert_eq!(slot.stapled_until(), Some(100));
        slot.unstaple();
        assert_eq!(slot.current(0).ocsp, None);
    }
}
