//! `[listeners.tls]`: the certificates, versions, ALPN and client verification of a listener.
//!
//! Only the settings are checked here (no IO): relative paths are joined to the directory of
//! the config file, and the files are read when the config is resolved (stage three), where a
//! missing, unreadable, mismatched or expired file is an error naming it.

use std::path::{Path, PathBuf};

use toml::{Spanned, Value};

use super::super::locate::line_of;
use super::super::raw::RawTls;
use super::{ConfigError, Validator};
use crate::config::ListenerTls;
use crate::tls::{Alpn, CertificateSource, ClientAuth, MinVersion, ServerSettings};

const CERTIFICATES_EXAMPLE: &str = r#"certificates = [{ cert = "chain.pem", key = "key.pem" }]"#;

impl Validator<'_> {
    pub(super) fn listener_tls(
        &self,
        at: &str,
        listener_span: std::ops::Range<usize>,
        raw: RawTls,
    ) -> Result<ListenerTls, ConfigError> {
        let at = format!("{at}.tls");
        let written = raw.certificates.unwrap_or_default();
        if written.is_empty() {
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
            certificate_lines.push(Some(line_of(self.text, span.start)));
            certificates.push(CertificateSource { cert, key: private });
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
                let line = line_of(self.text, ca.span().start);
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
        Ok(ListenerTls {
            settings: ServerSettings {
                certificates,
                default: default.unwrap_or(0),
                min_version,
                alpn,
                client_ca,
            },
            certificate_lines,
            client_ca_line,
            loaded: None,
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
