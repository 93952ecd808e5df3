//! The TLS families: failed handshakes per listener and reason, and each loaded certificate's
//! expiry time.

use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::config::Config;
use crate::tls::FAILURE_REASONS;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    listener: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    listener: String,
    certificate: String,
}

/// `capataz_tls_handshake_failures_total` and
/// `capataz_tls_certificate_expiry_timestamp_seconds`. Clones share the families.
#[derive(Clone, Debug, Default)]
pub struct TlsFamilies {
    handshake_failures: Family<HandshakeLabels, Counter>,
    certificate_expiry: Family<CertificateLabels, Gauge>,
}

/// A listener's handshake failure counters, one per reason, resolved on the first failure
/// (or at once for a listener that starts with TLS), so a plaintext listener has no series.
#[derive(Clone, Debug)]
pub struct HandshakeFailures {
    family: Family<HandshakeLabels, Counter>,
    listener: Arc<str>,
    counters: Arc<OnceLock<Vec<(&'static str, Counter)>>>,
}

impl HandshakeFailures {
    /// Counts one failed handshake; `reason` is one of `tls::FAILURE_REASONS`.
    pub fn count(&self, reason: &str) {
        if let Some((_, counter)) = self.counters().iter().find(|(r, _)| *r == reason) {
            counter.inc();
        }
    }

    fn counters(&self) -> &[(&'static str, Counter)] {
        self.counters.get_or_init(|| {
            FAILURE_REASONS
                .iter()
                .map(|&reason| {
                    let labels = HandshakeLabels {
                        listener: self.listener.to_string(),
                        reason,
                    };
                    (reason, self.family.get_or_create(&labels).clone())
                })
                .collect()
        })
    }
}

impl TlsFamilies {
    pub(super) fn register(registry: &mut Registry) -> TlsFamilies {
        let families = TlsFamilies::default();
        registry.register(
            "capataz_tls_handshake_failures",
            "TLS handshakes with clients that failed or timed out, by reason",
            families.handshake_failures.clone(),
        );
        registry.register_with_unit(
            "capataz_tls_certificate_expiry_timestamp",
            "When each certificate of a TLS listener expires (notAfter), in Unix time",
            Unit::Seconds,
            families.certificate_expiry.clone(),
        );
        families
    }

    /// The failure counters of listener `listener`; with `tls`, every reason's series exists
    /// from now on at zero.
    pub fn handshake_failures(&self, listener: &str, tls: bool) -> HandshakeFailures {
        let failures = HandshakeFailures {
            family: self.handshake_failures.clone(),
            listener: listener.into(),
            counters: Arc::default(),
        };
        if tls {
            failures.counters();
        }
        failures
    }

    /// Sets the expiry gauges to the certificates `config` loaded, dropping those of
    /// certificates no longer in force (at start and after each reload).
    pub fn set_certificates(&self, config: &Config) {
        self.certificate_expiry.clear();
        for listener in &config.listeners {
            let Some(loaded) = listener.tls.as_ref().and_then(|tls| tls.loaded.as_ref()) else {
                continue;
            };
            for certificate in loaded.certificates() {
                let labels = CertificateLabels {
                    listener: listener.name.clone(),
                    certificate: certificate.file.display().to_string(),
                };
                self.certificate_expiry
                    .get_or_create(&labels)
                    .set(certificate.not_after);
            }
        }
    }
}
