//! `[pools.NAME.tls]`: TLS to a pool's backends. Only syntax is checked here (a server name's
//! form, a certificate with its key); the files are read in stage three (`tls_files`), with
//! the name resolution, off the runtime threads.

use std::ops::Range;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use toml::Spanned;

use super::super::raw::RawTlsTable;
use super::super::tls_files::{Place, TlsLoad, TlsTarget};
use super::{ConfigError, Validator};
use crate::BackendTls;

/// What a TLS table names: the CA bundle, the client certificate with its key, the server
/// name.
pub(super) type TlsTable = (Option<Place>, Option<(Place, Place)>, Option<String>);

impl Validator<'_> {
    /// The TLS settings of pool `pool` (`at`: `pools.NAME`), its files queued for loading.
    pub(super) fn backend_tls(
        &self,
        pool: &str,
        at: &str,
        pool_span: Range<usize>,
        raw: RawTlsTable,
    ) -> Result<BackendTls, ConfigError> {
        let at = format!("{at}.tls");
        let (ca, identity, server_name) = self.tls_table(&at, &raw)?;
        let verify = raw.verify.as_ref().is_none_or(|v| *v.get_ref());
        self.tls_loads.borrow_mut().push(TlsLoad {
            pool: pool.to_owned(),
            target: TlsTarget::Backends,
            ca: ca.clone(),
            identity: identity.clone(),
            verify,
            place: Place {
                path: String::new(),
                file: self.file.to_owned(),
                line: Some(self.line_at(pool_span.start)),
                key: at.clone(),
            },
        });
        Ok(BackendTls {
            ca_file: ca.map(|place| place.path),
            server_name,
            verify,
            cert: identity.as_ref().map(|(cert, _)| cert.path.clone()),
            key: identity.map(|(_, key)| key.path),
            roots: Arc::new(rustls::RootCertStore::empty()),
            identity: None,
        })
    }

    /// The files and the server name of a TLS table at `at` (a pool's `tls`, an etcd
    /// source's `tls`): the CA bundle, the client certificate with its key, the name. Paths
    /// are joined to the config file's directory when relative.
    pub(super) fn tls_table(&self, at: &str, raw: &RawTlsTable) -> Result<TlsTable, ConfigError> {
        let file =
            |value: &Option<Spanned<String>>, name: &str| -> Result<Option<Place>, ConfigError> {
                let Some(value) = value else {
                    return Ok(None);
                };
                let key = format!("{at}.{name}");
                if value.get_ref().is_empty() || value.get_ref().contains('\0') {
                    return Err(self.error(
                        Some(value.span()),
                        &key,
                        "a file path must be non-empty text (e.g. \"/etc/capataz/backend-ca.pem\")"
                            .into(),
                    ));
                }
                // Relative to the config file's directory, as the listeners' TLS files are.
                let path = std::path::Path::new(value.get_ref());
                let path = match std::path::Path::new(self.file).parent() {
                    Some(dir) if path.is_relative() => dir.join(path),
                    _ => path.to_owned(),
                };
                Ok(Some(Place {
                    path: path.display().to_string(),
                    file: self.file.to_owned(),
                    line: Some(self.line_at(value.span().start)),
                    key,
                }))
            };
        let ca = file(&raw.ca_file, "ca_file")?;
        let cert = file(&raw.cert, "cert")?;
        let key = file(&raw.key, "key")?;
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            (Some(_), None) => {
                return Err(self.error(
                    raw.cert.as_ref().map(Spanned::span),
                    &format!("{at}.key"),
                    "a client certificate needs its private key (add key = \"PATH\" beside cert)"
                        .into(),
                ));
            }
            (None, Some(_)) => {
                return Err(self.error(
                    raw.key.as_ref().map(Spanned::span),
                    &format!("{at}.cert"),
                    "a private key needs its client certificate (add cert = \"PATH\" beside key)"
                        .into(),
                ));
            }
        };
        let server_name = match &raw.server_name {
            None => None,
            Some(name) => {
                if ServerName::try_from(name.get_ref().as_str()).is_err() {
                    return Err(self.error(
                        Some(name.span()),
                        &format!("{at}.server_name"),
                        format!(
                            "{:?} is not a DNS name or an IP address (use the name the \
                             certificates are issued for, e.g. \"api.internal\")",
                            name.get_ref()
                        ),
                    ));
                }
                Some(name.get_ref().clone())
            }
        };
        Ok((ca, identity, server_name))
    }
}
