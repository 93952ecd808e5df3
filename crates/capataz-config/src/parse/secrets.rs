//! Stage three, for secrets: files that hold a secret instead of the config (`admin.token_file`,
//! `tsig_secret_file`),
//! read where names are resolved (before the runtime, in `capataz check`, on the blocking pool
//! during a reload, which reads them again), never on a runtime thread.
//!
//! A secret file is small (at most [`MAX_SECRET_BYTES`]; more is an error, so a path to an
//! endless stream cannot fill memory), its trailing line break is not part of the secret, and
//! an unreadable file is a [`ConfigError`] that names it, the line and the key.

use std::io::Read as _;
use std::path::PathBuf;

use super::ConfigError;
use crate::{Config, EtcdAccess, PoolSource};

/// The largest secret file read: 4 KiB.
pub(super) const MAX_SECRET_BYTES: u64 = 4 << 10;

/// A secret to read, and where it goes.
#[derive(Clone, Debug)]
pub(super) struct SecretLoad {
    /// What gets the secret.
    pub(super) target: SecretTarget,
    /// The file, joined to the config file's directory when relative.
    pub(super) path: PathBuf,
    /// Where it was named, for errors.
    pub(super) file: String,
    pub(super) line: Option<usize>,
    pub(super) key: String,
}

/// Which setting a [`SecretLoad`] fills in.
#[derive(Clone, Debug)]
pub(super) enum SecretTarget {
    /// `admin.token`.
    AdminToken,
    /// The password of pool `pool`'s etcd source (`source.password_file`).
    EtcdPassword {
        /// The pool's name.
        pool: String,
    },
    /// The password of `[fleet]` (`fleet.password_file`).
    FleetPassword,
    /// The TSIG secret of listener `listener`'s DNS-01 updates
    /// (`tls.acme.dns01.tsig_secret_file`), base64 as in BIND's and Knot's key files.
    TsigSecret {
        /// The listener's index.
        listener: usize,
    },
}

impl SecretLoad {
    fn error(&self, message: String) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.clone(),
            line: self.line,
            key: self.key.clone(),
            message: format!("{}: {message}", self.path.display()),
        }
    }

    /// The secret: the file's text without its trailing line break.
    fn read(&self) -> Result<String, ConfigError> {
        let mut bytes = Vec::new();
        std::fs::File::open(&self.path)
            .and_then(|file| file.take(MAX_SECRET_BYTES + 1).read_to_end(&mut bytes))
            .map_err(|error| {
                self.error(format!(
                    "cannot read the secret: {error} (check the path and its permissions)"
                ))
            })?;
        if bytes.len() as u64 > MAX_SECRET_BYTES {
            return Err(self.error(format!(
                "the file is larger than {} KiB, the most a secret may be (is it the right \
                 file?)",
                MAX_SECRET_BYTES >> 10
            )));
        }
        let Ok(mut text) = String::from_utf8(bytes) else {
            return Err(self.error("the secret is not UTF-8 text (write it as text)".into()));
        };
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        Ok(text)
    }
}

/// Reads every secret into `config`; every failure is returned, in order.
pub(super) fn load_all(config: &mut Config, loads: &[SecretLoad]) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for load in loads {
        let secret = match load.read() {
            Ok(secret) => secret,
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        match &load.target {
            SecretTarget::EtcdPassword { pool } => {
                if secret.is_empty() {
                    errors.push(load.error(
                        "the password is empty (write the etcd user's password in the file)".into(),
                    ));
                    continue;
                }
                set_etcd_password(config, pool, secret);
            }
            SecretTarget::FleetPassword => {
                if secret.is_empty() {
                    errors.push(load.error(
                        "the password is empty (write the etcd user's password in the file)".into(),
                    ));
                    continue;
                }
                if let Some(fleet) = config.fleet.as_mut() {
                    set_password(&mut fleet.endpoints, secret);
                }
            }
            SecretTarget::TsigSecret { listener } => {
                let decoded = data_encoding::BASE64.decode(secret.trim().as_bytes());
                let secret =
                    match decoded {
                        Ok(secret) if !secret.is_empty() => secret,
                        _ => {
                            errors.push(load.error(
                            "the TSIG secret is not base64 (write the key's secret as the DNS \
                             server's key file has it, e.g. the output of `keymgr -t NAME \
                             hmac-sha256` or `tsig-keygen`)"
                                .into(),
                        ));
                            continue;
                        }
                    };
                let dns01 = config
                    .listeners
                    .get_mut(*listener)
                    .and_then(|l| l.tls.as_mut())
                    .and_then(|tls| tls.settings.acme.as_mut())
                    .and_then(|acme| acme.dns01.as_mut());
                if let Some(dns01) = dns01 {
                    dns01.tsig_secret = capataz_tls::acme::TsigSecret(secret);
                }
            }
            SecretTarget::AdminToken => {
                if let Err(why) = super::validate::check_admin_token(&secret) {
                    errors.push(load.error(why.into()));
                    continue;
                }
                if let Some(admin) = &mut config.admin {
                    admin.token = Some(secret);
                }
            }
        }
    }
    errors
}

/// Puts `password` in the credentials of pool `pool`'s etcd source (one access, shared by its
/// endpoints).
fn set_etcd_password(config: &mut Config, pool: &str, password: String) {
    let Some(PoolSource::Etcd(etcd)) = config
        .pools
        .iter_mut()
        .find(|p| p.name == pool)
        .map(|p| &mut p.source)
    else {
        return;
    };
    set_password(&mut etcd.endpoints, password);
}

/// Puts `password` in the credentials shared by etcd `endpoints`.
fn set_password(endpoints: &mut [crate::EtcdEndpoint], password: String) {
    let mut access = endpoints
        .first()
        .map(|e| EtcdAccess::clone(&e.access))
        .unwrap_or_default();
    if let Some(auth) = access.auth.as_mut() {
        auth.password = password;
    }
    let access = std::sync::Arc::new(access);
    for endpoint in endpoints {
        endpoint.access = access.clone();
    }
}
