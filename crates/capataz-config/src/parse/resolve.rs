//! Stage three: the host names of a validated config, looked up.
//!
//! Validation only checks that a backend address or a webhook URL is well-formed; an IP literal
//! becomes its socket address there and then. A name is left as a [`Lookup`] that this stage
//! resolves with the system resolver, which blocks: it runs where blocking is fine (before the
//! runtime starts, in `capataz check`, or on tokio's blocking pool during a reload), never on a
//! runtime thread. A name that does not resolve is a [`ConfigError`] naming the file, line and
//! key, like any other invalid value.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{ConfigError, ConfigErrors};
use crate::Config;
use capataz_tls::Part;

/// A host name in a validated config that still has to be resolved.
#[derive(Clone, Debug)]
pub(super) struct Lookup {
    /// What gets the address.
    pub(super) target: Target,
    /// `host:port`, as the resolver takes it.
    pub(super) host_port: String,
    /// Where it was written, for the error.
    pub(super) file: String,
    pub(super) line: Option<usize>,
    pub(super) key: String,
    /// The start of the error sentence (the value, quoted) and its advice.
    pub(super) subject: String,
    pub(super) advice: &'static str,
}

/// Which address a [`Lookup`] fills in.
#[derive(Clone, Debug)]
pub(super) enum Target {
    /// `pools.<pool>.backends[<index>]`.
    Backend { pool: String, index: usize },
    /// `alerts.webhooks[<index>]`.
    Webhook { index: usize },
}

/// A validated configuration whose host names are not resolved yet: see [`Unresolved::resolve`].
#[derive(Clone, Debug)]
pub struct Unresolved {
    pub(super) config: Config,
    pub(super) lookups: Vec<Lookup>,
    /// The pools' TLS files, read with the names (see `tls_files`).
    pub(super) tls_loads: Vec<super::tls_files::TlsLoad>,
    /// Secret files (`admin.token_file`), read with the names (see `secrets`).
    pub(super) secrets: Vec<super::secrets::SecretLoad>,
    /// Listeners' error page files, read with the names (see `page_files`).
    pub(super) page_loads: Vec<super::page_files::PageLoad>,
}

impl Unresolved {
    /// The validated config, with `0.0.0.0:0` where a name is still to be resolved.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The `host:port` names still to be resolved, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.lookups.iter().map(|lookup| lookup.host_port.as_str())
    }

    /// The files still to be read: each TLS listener's certificates, keys and client CA, then
    /// the secret files (`admin.token_file`).
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.config
            .listeners
            .iter()
            .filter_map(|listener| listener.tls.as_ref())
            .flat_map(|tls| {
                let settings = &tls.settings;
                settings
                    .certificates
                    .iter()
                    .flat_map(|c| [c.cert.as_path(), c.key.as_path()])
                    .chain(settings.client_ca.iter().map(|(ca, _)| ca.as_path()))
            })
            .chain(self.secrets.iter().map(|secret| secret.path.as_path()))
            .chain(self.page_loads.iter().map(|page| page.path.as_path()))
    }

    /// Resolves every name with the system resolver (the first address wins), loads every TLS
    /// listener's certificates and keys (see [`Unresolved::files`]) and the pools' TLS files
    /// (CA bundles, client certificates, the system's roots when used), and returns the whole
    /// config. This blocks on DNS and file IO: call it off the runtime threads. Without names
    /// or files it returns at once.
    pub fn resolve(self) -> Result<Config, ConfigError> {
        self.resolve_all_errors().map_err(ConfigErrors::into_first)
    }

    /// [`Unresolved::resolve`], with every name that does not resolve and every secret file
    /// that cannot be read reported, not only the first failure.
    pub fn resolve_all_errors(mut self) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        // The secrets first: a listener's TLS keeps a copy of its ACME settings, which hold
        // the DNS-01 TSIG secret.
        errors.extend(super::secrets::load_all(&mut self.config, &self.secrets));
        if let Err(error) = load_tls(&mut self.config, unix_now()) {
            errors.push(error);
        }
        errors.extend(super::page_files::load_all(
            &mut self.config,
            &self.page_loads,
        ));
        for lookup in &self.lookups {
            let address = match resolve_one(lookup) {
                Ok(address) => address,
                Err(error) => {
                    errors.push(error);
                    continue;
                }
            };
            let slot = match &lookup.target {
                Target::Backend { pool, index } => self
                    .config
                    .pools
                    .iter_mut()
                    .find(|p| p.name == *pool)
                    .and_then(|p| p.backends.get_mut(*index))
                    .map(|b| &mut b.socket_addr),
                Target::Webhook { index } => self
                    .config
                    .alerts
                    .webhooks
                    .get_mut(*index)
                    .map(|w| &mut w.socket_addr),
            };
            // Validation made each lookup for an element it built, so the slot exists.
            if let Some(slot) = slot {
                *slot = address;
            }
        }
        if let Err(error) = super::tls_files::load_all(&mut self.config, &self.tls_loads) {
            errors.push(error);
        }
        match ConfigErrors::from_vec(errors) {
            Some(errors) => Err(errors),
            None => Ok(self.config),
        }
    }
}

/// The time now, in seconds since the Unix epoch.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Loads each TLS listener's files; the first failure names the file, the line and the key.
pub(super) fn load_tls(config: &mut Config, now: i64) -> Result<(), ConfigError> {
    for (index, listener) in config.listeners.iter_mut().enumerate() {
        let Some(tls) = &mut listener.tls else {
            continue;
        };
        let loaded = tls.settings.load(now).map_err(|error| {
            let at = format!("listeners[{index}].tls");
            let (line, key) = match error.part {
                Part::Certificate(i) => (
                    tls.certificate_lines.get(i).copied().flatten(),
                    format!("{at}.certificates[{i}].cert"),
                ),
                Part::Key(i) => (
                    tls.certificate_lines.get(i).copied().flatten(),
                    format!("{at}.certificates[{i}].key"),
                ),
                Part::OcspResponse(i) => (
                    tls.certificate_lines.get(i).copied().flatten(),
                    format!("{at}.certificates[{i}].ocsp_response"),
                ),
                Part::ClientCa => (tls.client_ca_line, format!("{at}.client_ca")),
                Part::AcmeCaFile => (tls.acme_ca_line, format!("{at}.acme.ca_file")),
                Part::SessionTickets => (None, format!("{at}.session_ticket_lifetime")),
            };
            ConfigError::Invalid {
                file: config.source.clone(),
                line,
                key,
                message: super::one_line(&error.to_string()).into_owned(),
            }
        })?;
        tls.loaded = Some(loaded);
    }
    Ok(())
}

fn resolve_one(lookup: &Lookup) -> Result<SocketAddr, ConfigError> {
    let fail = |why: String| ConfigError::Invalid {
        file: lookup.file.clone(),
        line: lookup.line,
        key: lookup.key.clone(),
        message: format!("{} {why} ({})", lookup.subject, lookup.advice),
    };
    match lookup.host_port.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| fail("resolves to no address".into())),
        Err(error) => Err(fail(format!("does not resolve: {error}"))),
    }
}
