//! The TLS families: failed handshakes per listener and reason, resumed handshakes per
//! listener, and each loaded certificate's expiry time.

use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use capataz_config::Config;
use capataz_tls::acme::AcmeSettings;
use capataz_tls::FAILURE_REASONS;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    listener: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AcmeOrderLabels {
    listener: String,
    result: &'static str,
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
    resumed_handshakes: Family<ListenerLabels, Counter>,
    certificate_expiry: Family<CertificateLabels, Gauge>,
    acme_orders: Family<AcmeOrderLabels, Counter>,
}

/// A listener's handshake failure counters, one per reason, and its resumed handshakes
/// counter, resolved on the first count (or at once for a listener that starts with TLS), so
/// a plaintext listener has no series.
#[derive(Clone, Debug)]
pub struct HandshakeFailures {
    family: Family<HandshakeLabels, Counter>,
    listener: Arc<str>,
    counters: Arc<OnceLock<Vec<(&'static str, Counter)>>>,
    resumed_family: Family<ListenerLabels, Counter>,
    resumed: Arc<OnceLock<Counter>>,
}

impl HandshakeFailures {
    /// Counts one handshake that resumed a session (by ticket or from the server's cache).
    pub fn count_resumed(&self) {
        self.resumed().inc();
    }

    fn resumed(&self) -> &Counter {
        self.resumed.get_or_init(|| {
            let labels = ListenerLabels {
                listener: self.listener.to_string(),
            };
            self.resumed_family.get_or_create(&labels).clone()
        })
    }

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
        registry.register(
            "capataz_tls_resumed_handshakes",
            "TLS handshakes with clients that resumed a session (by ticket or from the cache)",
            families.resumed_handshakes.clone(),
        );
        registry.register_with_unit(
            "capataz_tls_certificate_expiry_timestamp",
            "When each certificate of a TLS listener expires (notAfter), in Unix time",
            Unit::Seconds,
            families.certificate_expiry.clone(),
        );
        registry.register(
            "capataz_acme_orders",
            "ACME orders of TLS listeners, by result (issued, renewed, failed)",
            families.acme_orders.clone(),
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
            resumed_family: self.resumed_handshakes.clone(),
            resumed: Arc::default(),
        };
        if tls {
            failures.counters();
            failures.resumed();
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
            if let Some(acme) = loaded.acme() {
                if let Some(issued) = acme.issued() {
                    self.set_acme_expiry(&listener.name, acme.settings(), issued.info.not_after);
                }
            }
        }
    }

    /// Sets the expiry gauge of listener `listener`'s ACME certificate (labelled with the
    /// stored chain's path).
    pub fn set_acme_expiry(&self, listener: &str, settings: &AcmeSettings, not_after: i64) {
        let labels = CertificateLabels {
            listener: listener.to_owned(),
            certificate: settings.cert_path().display().to_string(),
        };
        self.certificate_expiry
            .get_or_create(&labels)
            .set(not_after);
    }

    /// Counts one ACME order of listener `listener`: `issued`, `renewed` or `failed`.
    pub fn acme_order(&self, listener: &str, result: &'static str) {
        let labels = AcmeOrderLabels {
            listener: listener.to_owned(),
            result,
        };
        self.acme_orders.get_or_create(&labels).inc();
    }
}
