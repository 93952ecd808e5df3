//! An etcd source's access: `[pools.NAME.source.tls]` (for `https://` endpoints) and its
//! credentials (`username` with `password` or `password_file`). Only syntax is checked here;
//! the TLS files and the password file are read in stage three, off the runtime threads.
//!
//! Verification of etcd's certificate cannot be turned off: the registry decides where the
//! traffic goes and, with authentication, receives the password, so an unverified etcd would
//! let whoever sits on the path steer the pool and learn the password.

use std::ops::Range;
use std::sync::Arc;

use super::super::raw::RawSource;
use super::super::secrets::{SecretLoad, SecretTarget};
use super::super::tls_files::{Place, TlsLoad, TlsTarget};
use super::{ConfigError, EtcdOwner, Validator};
use crate::{EtcdAccess, EtcdAuth, EtcdTls};

/// The longest user name, in bytes.
const MAX_USERNAME: usize = 256;

/// The longest password written in the file, in bytes (as a password file may hold).
const MAX_PASSWORD: usize = 4 << 10;

impl Validator<'_> {
    /// The TLS and the credentials of `owner`'s etcd access (`at`: `pools.NAME.source` or `fleet`),
    /// whose endpoints are `https://` when `https`; their files queued for loading.
    pub(super) fn etcd_access(
        &self,
        owner: EtcdOwner<'_>,
        at: &str,
        span: Range<usize>,
        https: bool,
        raw: &mut RawSource,
    ) -> Result<EtcdAccess, ConfigError> {
        let tls = match (raw.tls.take(), https) {
            (Some(table), false) => {
                return Err(self.error(
                    Some(table.span()),
                    &format!("{at}.tls"),
                    "TLS settings are for https:// endpoints, and these are http:// (write the \
                     endpoints as \"https://host:port\", or remove the tls settings)"
                        .into(),
                ));
            }
            (None, false) => None,
            (table, true) => {
                let (table_span, table) = match table {
                    Some(table) => (table.span(), table.into_inner()),
                    None => (span.clone(), Default::default()),
                };
                let at = format!("{at}.tls");
                if let Some(verify) = table.verify.as_ref().filter(|v| !*v.get_ref()) {
                    return Err(self.error(
                        Some(verify.span()),
                        &format!("{at}.verify"),
                        "etcd's certificate is always verified: etcd says where the pool's \
                         traffic goes (and receives the password), so an unverified etcd \
                         would let anyone on the path steer it (give the CA that signed etcd's \
                         certificate as ca_file, and server_name if it names another host)"
                            .into(),
                    ));
                }
                let (ca, identity, server_name) = self.tls_table(&at, &table)?;
                self.tls_loads.borrow_mut().push(TlsLoad {
                    pool: owner.pool().to_owned(),
                    target: match owner {
                        EtcdOwner::Pool(_) => TlsTarget::EtcdSource,
                        EtcdOwner::Fleet => TlsTarget::Fleet,
                    },
                    ca: ca.clone(),
                    identity: identity.clone(),
                    verify: true,
                    place: Place {
                        path: String::new(),
                        file: self.file.to_owned(),
                        line: Some(self.line_at(table_span.start)),
                        key: at,
                    },
                });
                Some(EtcdTls {
                    ca_file: ca.map(|place| place.path),
                    cert: identity.as_ref().map(|(cert, _)| cert.path.clone()),
                    key: identity.map(|(_, key)| key.path),
                    server_name,
                    client: None,
                })
            }
        };
        let auth = self.etcd_auth(owner, at, span, raw)?;
        Ok(EtcdAccess { tls, auth })
    }

    /// `username` with `password` or `password_file` (queued for loading), or none of them.
    fn etcd_auth(
        &self,
        owner: EtcdOwner<'_>,
        at: &str,
        span: Range<usize>,
        raw: &mut RawSource,
    ) -> Result<Option<EtcdAuth>, ConfigError> {
        let (username, password, password_file) = (
            raw.username.take(),
            raw.password.take(),
            raw.password_file.take(),
        );
        let Some(username) = username else {
            if let Some(secret) = password.as_ref().or(password_file.as_ref()) {
                let key = if password.is_some() {
                    "password"
                } else {
                    "password_file"
                };
                return Err(self.error(
                    Some(secret.span()),
                    &format!("{at}.{key}"),
                    format!("a password needs its user (add username = \"...\" beside {key})"),
                ));
            }
            return Ok(None);
        };
        let name = username.get_ref();
        if name.is_empty() || name.len() > MAX_USERNAME || name.chars().any(char::is_control) {
            return Err(self.error(
                Some(username.span()),
                &format!("{at}.username"),
                format!(
                    "the user name must be 1 to {MAX_USERNAME} bytes of text without control \
                     characters (the etcd user capataz authenticates as, e.g. \"capataz\")"
                ),
            ));
        }
        let password = match (password, password_file) {
            (Some(_), Some(file)) => {
                return Err(self.error(
                    Some(file.span()),
                    &format!("{at}.password_file"),
                    "password is set too (keep one of password and password_file)".into(),
                ));
            }
            (None, None) => {
                return Err(self.error(
                    Some(span),
                    &format!("{at}.password"),
                    "a user needs its password (add password_file = \"PATH\", or password = \
                     \"${ETCD_PASSWORD}\" to take it from the environment)"
                        .into(),
                ));
            }
            (Some(password), None) => {
                let text = password.get_ref();
                if text.is_empty() || text.len() > MAX_PASSWORD {
                    return Err(self.error(
                        Some(password.span()),
                        &format!("{at}.password"),
                        format!(
                            "the password must be 1 to {MAX_PASSWORD} bytes (is the variable it \
                             comes from set?)"
                        ),
                    ));
                }
                password.into_inner()
            }
            (None, Some(file)) => {
                let key = format!("{at}.password_file");
                let path = self.config_path(&file, &key)?;
                self.secrets.borrow_mut().push(SecretLoad {
                    target: match owner {
                        EtcdOwner::Pool(pool) => SecretTarget::EtcdPassword {
                            pool: pool.to_owned(),
                        },
                        EtcdOwner::Fleet => SecretTarget::FleetPassword,
                    },
                    path,
                    file: self.file.to_owned(),
                    line: Some(self.line_at(file.span().start)),
                    key,
                });
                // Read in stage three.
                String::new()
            }
        };
        Ok(Some(EtcdAuth {
            username: username.into_inner(),
            password,
            session: Arc::default(),
        }))
    }
}
