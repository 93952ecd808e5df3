//! `[listeners.tls.acme.dns01]`: where DNS-01's TXT records are published (an RFC 2136 server)
//! and the TSIG key signing the updates. Syntax only; the secret file is read in stage three
//! (`secrets`), where a missing file or a secret that is not base64 is an error naming it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use toml::Spanned;

use super::super::raw::RawAcmeDns01;
use super::super::secrets::{SecretLoad, SecretTarget};
use super::{ConfigError, Validator};
use capataz_tls::acme::{Dns01Settings, TsigAlgorithm, TsigSecret};

/// The default TTL of the TXT records: short, as they live for one validation.
const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// The default time a new TXT record may take to show on the server.
const DEFAULT_PROPAGATION: Duration = Duration::from_secs(60);
/// The longest TTL and propagation timeout accepted: a day.
const MAX_WAIT: Duration = Duration::from_secs(86_400);

impl Validator<'_> {
    /// The `dns01` table of listener `listener`'s ACME (at `at`, `acme_span` the ACME table,
    /// for a missing key).
    pub(super) fn acme_dns01(
        &self,
        listener: usize,
        at: &str,
        acme_span: &std::ops::Range<usize>,
        raw: RawAcmeDns01,
    ) -> Result<Dns01Settings, ConfigError> {
        let at = format!("{at}.dns01");
        let missing = |key: &str, example: &str| {
            self.error(
                Some(acme_span.clone()),
                &format!("{at}.{key}"),
                format!("DNS-01 needs {key} (add {example} under [listeners.tls.acme.dns01])"),
            )
        };
        let Some(server) = raw.server else {
            return Err(missing("server", r#"server = "192.0.2.53:53""#));
        };
        let server = self.dns01_server(&at, &server)?;
        let zone = match raw.zone {
            None => None,
            Some(zone) => Some(self.dns01_name(&format!("{at}.zone"), &zone)?),
        };
        let Some(key) = raw.tsig_key else {
            return Err(missing("tsig_key", r#"tsig_key = "acme-update""#));
        };
        let tsig_key = self.dns01_name(&format!("{at}.tsig_key"), &key)?;
        let tsig_algorithm = match raw.tsig_algorithm.as_ref() {
            None => TsigAlgorithm::HmacSha256,
            Some(written) => match written.get_ref().to_ascii_lowercase().as_str() {
                "hmac-sha256" => TsigAlgorithm::HmacSha256,
                "hmac-sha384" => TsigAlgorithm::HmacSha384,
                "hmac-sha512" => TsigAlgorithm::HmacSha512,
                other => {
                    return Err(self.error(
                        Some(written.span()),
                        &format!("{at}.tsig_algorithm"),
                        format!(
                            "{other:?} is not a TSIG algorithm capataz signs with (use \
                             \"hmac-sha256\", \"hmac-sha384\" or \"hmac-sha512\")"
                        ),
                    ))
                }
            },
        };
        let Some(file) = raw.tsig_secret_file else {
            return Err(missing(
                "tsig_secret_file",
                r#"tsig_secret_file = "/etc/capataz/acme-update.secret""#,
            ));
        };
        let key = format!("{at}.tsig_secret_file");
        let path = self.config_path(&file, &key)?;
        self.secrets.borrow_mut().push(SecretLoad {
            target: SecretTarget::TsigSecret { listener },
            path,
            file: self.file.to_owned(),
            line: Some(self.line_at(file.span().start)),
            key,
        });
        let ttl = self.duration(&raw.ttl, &format!("{at}.ttl"), DEFAULT_TTL)?;
        let propagation_timeout = self.duration(
            &raw.propagation_timeout,
            &format!("{at}.propagation_timeout"),
            DEFAULT_PROPAGATION,
        )?;
        for (value, written, name) in [
            (ttl, &raw.ttl, "ttl"),
            (
                propagation_timeout,
                &raw.propagation_timeout,
                "propagation_timeout",
            ),
        ] {
            if value > MAX_WAIT || (name == "ttl" && value.subsec_nanos() != 0) {
                return Err(self.error(
                    written.as_ref().map(Spanned::span),
                    &format!("{at}.{name}"),
                    "must be whole seconds, at most 24h".into(),
                ));
            }
        }
        Ok(Dns01Settings {
            server,
            zone,
            tsig_key,
            tsig_algorithm,
            // Read in stage three.
            tsig_secret: TsigSecret::default(),
            ttl,
            propagation_timeout,
        })
    }

    /// `server`: an IP address, with a port (53 when absent).
    fn dns01_server(&self, at: &str, written: &Spanned<String>) -> Result<SocketAddr, ConfigError> {
        let text = written.get_ref();
        text.parse::<SocketAddr>()
            .or_else(|_| text.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
            .map_err(|_| {
                self.error(
                    Some(written.span()),
                    &format!("{at}.server"),
                    format!(
                        "{text:?} is not an IP address with an optional port (write the primary \
                         server's address, e.g. \"192.0.2.53:53\")"
                    ),
                )
            })
    }

    /// A DNS name (a zone or a key name): lowercased, without its final dot.
    fn dns01_name(&self, key: &str, written: &Spanned<String>) -> Result<String, ConfigError> {
        let lower = written.get_ref().trim_end_matches('.').to_ascii_lowercase();
        let valid = !lower.is_empty()
            && lower.len() <= 253
            && lower.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if valid {
            Ok(lower)
        } else {
            Err(self.error(
                Some(written.span()),
                key,
                format!("{:?} is not a DNS name", written.get_ref()),
            ))
        }
    }
}
