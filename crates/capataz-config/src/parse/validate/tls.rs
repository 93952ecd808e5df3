//! `[listeners.tls]`: the certificates, versions, ALPN and client verification of a listener.
//!
//! Only the settings are checked here (no IO): relative paths are joined to the directory of
//! the config file, and the files are read when the config is resolved (stage three), where a
//! missing, unreadable, mismatched or expired file is an error naming it.

use std::path::{Path, PathBuf};

use toml::{Spanned, Value};

use super::super::raw::{RawAcme, RawTls};
use super::{ConfigError, Validator};
use crate::ListenerTls;
use capataz_tls::acme::{AcmeSettings, Challenge, MAX_DOMAINS};
use capataz_tls::{Alpn, CertificateSource, ClientAuth, MinVersion, ServerSettings};

const CERTIFICATES_EXAMPLE: &str = r#"certificates = [{ cert = "chain.pem", key = "key.pem" }]"#;

impl Validator<'_> {
    pub(super) fn listener_tls(
        &self,
        index: usize,
        at: &str,
        listener_span: std::ops::Range<usize>,
        raw: RawTls,
    ) -> Result<ListenerTls, ConfigError> {
        let at = format!("{at}.tls");
        let acme_ca_line = raw
            .acme
            .as_ref()
            .and_then(|acme| acme.get_ref().ca_file.as_ref())
            .map(|ca| self.line_at(ca.span().start));
        let acme = match raw.acme {
            None => None,
            Some(acme) => Some(self.acme(index, &at, acme)?),
        };
        let written = raw.certificates.unwrap_or_default();
        if written.is_empty() && acme.is_none() {
            return Err(self.error(
                Some(listener_span),
                &format!("{at}.certificates"),
                format!("TLS needs at least one certificate (add {CERTIFICATES_EXAMPLE})"),
            ));
        }
        let mut certificates = Vec::with_capacity(written.len());
        let mut certificate_lines = Vec::with_capacity(written.len());
        let mut default = None;
        for (index, entry) in written.into_iter().enumerate() {
            let key = format!("{at}.certificates[{index}]");
            let span = entry.span();
            let entry = entry.into_inner();
            let cert = self.tls_path(entry.cert, &format!("{key}.cert"), &span)?;
            let private = self.tls_path(entry.key, &format!("{key}.key"), &span)?;
            if entry.default == Some(true) {
                if let Some(first) = default.replace(index) {
                    return Err(self.error(
                        Some(span),
                        &format!("{key}.default"),
                        format!(
                            "{at}.certificates[{first}] is already the default (mark one \
                             certificate default = true, or none for the first)"
                        ),
                    ));
                }
            }
            certificate_lines.push(Some(self.line_at(span.start)));
            let ocsp_response = match entry.ocsp_response {
                None => None,
                some => Some(self.tls_path(some, &format!("{key}.ocsp_response"), &span)?),
            };
            certificates.push(CertificateSource {
                cert,
                key: private,
                ocsp_response,
            });
        }
        let min_version = match &raw.min_version {
            None => MinVersion::Tls12,
            Some(value) => match value.get_ref() {
                Value::String(s) if s == "1.2" => MinVersion::Tls12,
                Value::String(s) if s == "1.3" => MinVersion::Tls13,
                other => {
                    return Err(self.error(
                        Some(value.span()),
                        &format!("{at}.min_version"),
                        format!(r#"{other} is not a TLS version (use "1.2" or "1.3")"#),
                    ))
                }
            },
        };
        let alpn = match raw.alpn {
            None => vec![Alpn::H2, Alpn::Http11],
            Some(list) => self.alpn(&at, list)?,
        };
        let (client_ca, client_ca_line) = match (raw.client_ca, raw.client_auth) {
            (None, None) => (None, None),
            (None, Some(auth)) => {
                return Err(self.error(
                    Some(auth.span()),
                    &format!("{at}.client_auth"),
                    r#"client_auth needs client_ca, the CA bundle client certificates are verified against (add client_ca = "ca.pem")"#.into(),
                ))
            }
            (Some(ca), auth) => {
                let line = self.line_at(ca.span().start);
                let span = ca.span();
                let file = self.tls_path(Some(ca), &format!("{at}.client_ca"), &span)?;
                let auth = match auth {
                    None => ClientAuth::Required,
                    Some(auth) => match auth.get_ref().as_str() {
                        "required" => ClientAuth::Required,
                        "optional" => ClientAuth::Optional,
                        other => {
                            return Err(self.error(
                                Some(auth.span()),
                                &format!("{at}.client_auth"),
                                format!(r#"{other:?} is not a client_auth (use "required" or "optional")"#),
                            ))
                        }
                    },
                };
                (Some((file, auth)), Some(line))
            }
        };
        let session_tickets =
            self.session_tickets(&at, raw.session_tickets, raw.session_ticket_lifetime)?;
        Ok(ListenerTls {
            settings: ServerSettings {
                certificates,
                default: default.unwrap_or(0),
                min_version,
                alpn,
                client_ca,
                acme,
                ocsp_fetch: raw.ocsp_fetch.unwrap_or(false),
                session_tickets,
            },
            certificate_lines,
            client_ca_line,
            acme_ca_line,
            hsts: raw.hsts.map(|hsts| self.hsts(&at, hsts)).transpose()?,
            http3: raw.http3.map(|http3| self.http3(&at, http3)).transpose()?,
            loaded: None,
        })
    }

    /// `[listeners.tls.acme]`: syntax only; the storage is read when the config is resolved.
    fn acme(
        &self,
        listener: usize,
        at: &str,
        raw: Spanned<RawAcme>,
    ) -> Result<AcmeSettings, ConfigError> {
        let at = format!("{at}.acme");
        let span = raw.span();
        let raw = raw.into_inner();
        let missing = |key: &str, example: &str| {
            self.error(
                Some(span.clone()),
                &format!("{at}.{key}"),
                format!("ACME needs {key} (add {example})"),
            )
        };
        let Some(directory) = raw.directory else {
            return Err(missing(
                "directory",
                r#"directory = "https://acme-v02.api.letsencrypt.org/directory""#,
            ));
        };
        let url = directory.get_ref();
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"));
        if rest.is_none_or(|r| r.is_empty()) || url.parse::<http::Uri>().is_err() {
            return Err(self.error(
                Some(directory.span()),
                &format!("{at}.directory"),
                format!("{url:?} is not an http(s) URL (write the ACME directory's URL)"),
            ));
        }
        let Some(domains) = raw.domains else {
            return Err(missing("domains", r#"domains = ["example.com"]"#));
        };
        let domains_line = domains.span();
        let names = self.acme_domains(&at, domains)?;
        let email = self.acme_email(&at, raw.email)?;
        let Some(storage) = raw.storage else {
            return Err(missing("storage", r#"storage = "/var/lib/capataz/acme""#));
        };
        let storage_span = storage.span();
        let storage = self.acme_path(storage, &format!("{at}.storage"), &storage_span)?;
        let challenge = self.acme_challenge(&at, raw.challenge.as_ref())?;
        let dns01 = match (challenge, raw.dns01) {
            (Challenge::Dns01, Some(table)) => Some(self.acme_dns01(listener, &at, &span, table)?),
            (Challenge::Dns01, None) => {
                return Err(self.error(
                    Some(span.clone()),
                    &format!("{at}.dns01"),
                    "dns-01 publishes its TXT records by RFC 2136 updates: add a \
                     [listeners.tls.acme.dns01] table with server, tsig_key and tsig_secret_file"
                        .into(),
                ))
            }
            (_, Some(_)) => {
                return Err(self.error(
                    raw.challenge
                        .as_ref()
                        .map(Spanned::span)
                        .or(Some(span.clone())),
                    &format!("{at}.dns01"),
                    format!(
                        "[listeners.tls.acme.dns01] is for challenge = \"dns-01\", and the \
                         challenge is {} (set challenge = \"dns-01\" or remove the table)",
                        challenge.name()
                    ),
                ))
            }
            (_, None) => None,
        };
        if challenge != Challenge::Dns01 {
            if let Some(wildcard) = names.iter().find(|n| n.starts_with("*.")) {
                return Err(self.error(
                    Some(domains_line),
                    &format!("{at}.domains"),
                    format!(
                        "{wildcard} is a wildcard, which only DNS-01 can prove (set challenge = \
                         \"dns-01\" with a [listeners.tls.acme.dns01] table)"
                    ),
                ));
            }
        }
        let renew_before = self.duration(
            &raw.renew_before,
            &format!("{at}.renew_before"),
            std::time::Duration::from_secs(30 * 24 * 3600),
        )?;
        let ca_file = match raw.ca_file {
            None => None,
            Some(ca) => {
                let span = ca.span();
                Some(self.acme_path(ca, &format!("{at}.ca_file"), &span)?)
            }
        };
        Ok(AcmeSettings {
            directory: url.clone(),
            domains: names,
            email,
            storage,
            challenge,
            renew_before,
            ca_file,
            dns01,
        })
    }

    /// `domains`: 1 to `MAX_DOMAINS` DNS names, each once, lowercased, without the final dot
    /// (no IP address; a wildcard `*.` as the first label only, checked against the challenge
    /// by the caller).
    fn acme_domains(
        &self,
        at: &str,
        domains: Spanned<Vec<Spanned<String>>>,
    ) -> Result<Vec<String>, ConfigError> {
        let domains_span = domains.span();
        let written = domains.into_inner();
        if written.is_empty() || written.len() > MAX_DOMAINS {
            return Err(self.error(
                Some(domains_span),
                &format!("{at}.domains"),
                format!("list between 1 and {MAX_DOMAINS} domain names"),
            ));
        }
        let mut names: Vec<String> = Vec::with_capacity(written.len());
        for name in &written {
            let lower = name.get_ref().trim_end_matches('.').to_ascii_lowercase();
            let base = lower.strip_prefix("*.").unwrap_or(&lower);
            let valid = !base.is_empty()
                && lower.len() <= 253
                && base.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
                && base.parse::<std::net::IpAddr>().is_err();
            if !valid {
                return Err(self.error(
                    Some(name.span()),
                    &format!("{at}.domains"),
                    format!(
                        "{:?} is not a DNS name capataz can order (a wildcard only as the \
                         first label, *.example.com; no IP address)",
                        name.get_ref()
                    ),
                ));
            }
            if names.contains(&lower) {
                return Err(self.error(
                    Some(name.span()),
                    &format!("{at}.domains"),
                    format!("{lower} is listed twice (name each domain once)"),
                ));
            }
            names.push(lower);
        }
        Ok(names)
    }

    /// `email`, without a `mailto:`, if given.
    fn acme_email(
        &self,
        at: &str,
        raw: Option<Spanned<String>>,
    ) -> Result<Option<String>, ConfigError> {
        Ok(match raw {
            None => None,
            Some(email) => {
                let text = email
                    .get_ref()
                    .strip_prefix("mailto:")
                    .unwrap_or(email.get_ref());
                let valid = text.split_once('@').is_some_and(|(user, host)| {
                    !user.is_empty() && !host.is_empty() && !text.contains(char::is_whitespace)
                });
                if !valid {
                    return Err(self.error(
                        Some(email.span()),
                        &format!("{at}.email"),
                        format!("{:?} is not an e-mail address", email.get_ref()),
                    ));
                }
                Some(text.to_owned())
            }
        })
    }

    /// `challenge`: `tls-alpn-01` by default; `http-01` only with a plaintext listener.
    fn acme_challenge(
        &self,
        at: &str,
        raw: Option<&Spanned<String>>,
    ) -> Result<Challenge, ConfigError> {
        Ok(match raw {
            None => Challenge::TlsAlpn01,
            Some(written) => match written.get_ref().as_str() {
                "tls-alpn-01" => Challenge::TlsAlpn01,
                "http-01" if !self.plaintext_listener.get() => {
                    return Err(self.error(
                        Some(written.span()),
                        &format!("{at}.challenge"),
                        "http-01 is answered on the plaintext listeners, and there is none (add \
                         a [[listeners]] without tls, on port 80 for a public CA)"
                            .into(),
                    ))
                }
                "http-01" => Challenge::Http01,
                "dns-01" => Challenge::Dns01,
                other => {
                    return Err(self.error(
                        Some(written.span()),
                        &format!("{at}.challenge"),
                        format!(
                            r#"{other:?} is not a challenge capataz answers (use "tls-alpn-01", "http-01" or "dns-01")"#
                        ),
                    ))
                }
            },
        })
    }

    fn acme_path(
        &self,
        value: Spanned<String>,
        key: &str,
        span: &std::ops::Range<usize>,
    ) -> Result<PathBuf, ConfigError> {
        if value.get_ref().is_empty() || value.get_ref().contains('\0') {
            return Err(self.error(
                Some(span.clone()),
                key,
                "a path must be non-empty (write a path)".into(),
            ));
        }
        let path = Path::new(value.get_ref());
        Ok(match Path::new(self.file).parent() {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_owned(),
        })
    }

    /// A file named in `[listeners.tls]`, joined to the config file's directory if relative.
    fn tls_path(
        &self,
        value: Option<Spanned<String>>,
        key: &str,
        table: &std::ops::Range<usize>,
    ) -> Result<PathBuf, ConfigError> {
        let Some(value) = value else {
            return Err(self.error(
                Some(table.clone()),
                key,
                format!("every certificate needs cert and key files ({CERTIFICATES_EXAMPLE})"),
            ));
        };
        if value.get_ref().is_empty() || value.get_ref().contains('\0') {
            return Err(self.error(
                Some(value.span()),
                key,
                "a file path must be non-empty (write the path of a PEM file)".into(),
            ));
        }
        let path = Path::new(value.get_ref());
        Ok(match Path::new(self.file).parent() {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_owned(),
        })
    }

    fn alpn(&self, at: &str, list: Vec<Spanned<String>>) -> Result<Vec<Alpn>, ConfigError> {
        let key = format!("{at}.alpn");
        let mut protocols = Vec::with_capacity(list.len());
        for entry in &list {
            let protocol = match entry.get_ref().as_str() {
                "h2" => Alpn::H2,
                "http/1.1" => Alpn::Http11,
                other => return Err(self.error(
                    Some(entry.span()),
                    &key,
                    format!(
                        r#"{other:?} is not a protocol capataz offers (use "h2" and/or "http/1.1")"#
                    ),
                )),
            };
            if protocols.contains(&protocol) {
                return Err(self.error(
                    Some(entry.span()),
                    &key,
                    format!("{protocol} is listed twice (name each protocol once)"),
                ));
            }
            protocols.push(protocol);
        }
        if !protocols.iter().any(|p| p.served()) {
            let served: Vec<String> = [Alpn::H2, Alpn::Http11]
                .into_iter()
                .filter(|p| p.served())
                .map(|p| format!("{p:?}", p = p.to_string()))
                .collect();
            return Err(self.error(
                list.first().map(|e| e.span()),
                &key,
                format!(
                    "no protocol listed is one this listener serves (add {})",
                    served.join(" or ")
                ),
            ));
        }
        Ok(protocols)
    }
}
