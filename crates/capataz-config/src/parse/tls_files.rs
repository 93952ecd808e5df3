//! Stage three, for TLS: the CA bundles, client certificates and keys of the pools' `tls`
//! settings and of the etcd sources' `tls` read from disk, and the system's trust roots when a pool verifies without a
//! `ca_file` (read once per load, however many pools use them). This is file IO: it runs
//! where name resolution does, never on a runtime thread. An unreadable file, a file with no
//! certificate or no key, or a key that does not belong to its certificate is a
//! [`ConfigError`] naming the file, the line and the key.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use super::ConfigError;
use crate::{ClientIdentity, Config, EtcdAccess, EtcdEndpoint, PoolSource};
use capataz_tls::backend::{client_config, Alpn, ClientSettings};
use capataz_tls::PemRead;

/// Where a file was named in the config.
#[derive(Clone, Debug)]
pub(super) struct Place {
    /// The path, as written.
    pub(super) path: String,
    /// The config file, line and key that name it.
    pub(super) file: String,
    pub(super) line: Option<usize>,
    pub(super) key: String,
}

impl Place {
    fn error(&self, message: String) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.clone(),
            line: self.line,
            key: self.key.clone(),
            message,
        }
    }
}

/// What a [`TlsLoad`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TlsTarget {
    /// The pool's backends (`[pools.NAME.tls]`).
    Backends,
    /// The pool's etcd source (`[pools.NAME.source.tls]`).
    EtcdSource,
    /// `[fleet.tls]` (the load's pool is empty).
    Fleet,
}

/// The TLS files of one pool (or of its etcd source), to read.
#[derive(Clone, Debug)]
pub(super) struct TlsLoad {
    /// The pool's name.
    pub(super) pool: String,
    /// Whose files they are.
    pub(super) target: TlsTarget,
    /// The CA bundle (`None`: the system's roots, when verifying).
    pub(super) ca: Option<Place>,
    /// The client certificate chain and key.
    pub(super) identity: Option<(Place, Place)>,
    /// Whether the backends' certificates are verified.
    pub(super) verify: bool,
    /// The pool's `tls` key (its path empty), for errors about the system roots.
    pub(super) place: Place,
}

/// Reads every pool's TLS files into `config`.
pub(super) fn load_all(config: &mut Config, loads: &[TlsLoad]) -> Result<(), ConfigError> {
    let mut system: Option<Arc<RootCertStore>> = None;
    for load in loads {
        let roots = match (&load.ca, load.verify) {
            (Some(ca), _) => Arc::new(ca_bundle(ca)?),
            (None, true) => match &system {
                Some(roots) => roots.clone(),
                None => {
                    let roots = Arc::new(system_roots(&load.place)?);
                    system = Some(roots.clone());
                    roots
                }
            },
            (None, false) => Arc::new(RootCertStore::empty()),
        };
        let identity = match &load.identity {
            Some((cert, key)) => Some(Arc::new(identity(cert, key)?)),
            None => None,
        };
        if load.target == TlsTarget::Fleet {
            if let Some(fleet) = config.fleet.as_mut() {
                set_tls_client(&mut fleet.endpoints, &roots, identity.as_ref(), &load.place)?;
            }
            continue;
        }
        let Some(pool) = config.pools.iter_mut().find(|p| p.name == load.pool) else {
            continue;
        };
        match load.target {
            TlsTarget::Backends => {
                // Validation queued one load per pool with TLS, so its settings exist.
                if let Some(tls) = pool.tls.as_mut() {
                    tls.roots = roots;
                    tls.identity = identity;
                }
            }
            TlsTarget::EtcdSource => {
                let PoolSource::Etcd(etcd) = &mut pool.source else {
                    continue;
                };
                set_tls_client(&mut etcd.endpoints, &roots, identity.as_ref(), &load.place)?;
            }
            TlsTarget::Fleet => {}
        }
    }
    Ok(())
}

/// Builds the rustls client of etcd `endpoints` (which share one access) from the files read.
fn set_tls_client(
    endpoints: &mut [EtcdEndpoint],
    roots: &Arc<RootCertStore>,
    identity: Option<&Arc<ClientIdentity>>,
    place: &Place,
) -> Result<(), ConfigError> {
    let settings = ClientSettings {
        roots,
        verify: true,
        identity: identity.map(|id| (&id.chain[..], &id.key)),
        alpn: Alpn::Http11,
    };
    let client = client_config(settings).map_err(|error| {
        place.error(format!(
            "cannot build the TLS client configuration: {error}"
        ))
    })?;
    let mut access = endpoints
        .first()
        .map(|e| EtcdAccess::clone(&e.access))
        .unwrap_or_default();
    if let Some(tls) = access.tls.as_mut() {
        tls.client = Some(client);
    }
    let access = Arc::new(access);
    for endpoint in endpoints {
        endpoint.access = access.clone();
    }
    Ok(())
}

fn read(place: &Place) -> Result<Vec<u8>, ConfigError> {
    capataz_tls::read_pem_file(std::path::Path::new(&place.path)).map_err(|why| match why {
        PemRead::Io(error) => place.error(format!(
            "cannot read {:?}: {error} (check the path and its permissions)",
            place.path
        )),
        PemRead::TooLarge => place.error(format!(
            "{:?} is larger than 16 MiB (is it the right file?)",
            place.path
        )),
    })
}

fn certificates(place: &Place) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bytes = read(place)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| {
            place.error(format!(
                "{:?} is not a PEM file of certificates: {error}",
                place.path
            ))
        })?;
    if certs.is_empty() {
        return Err(place.error(format!(
            "{:?} holds no certificate (expected PEM blocks \"-----BEGIN CERTIFICATE-----\")",
            place.path
        )));
    }
    Ok(certs)
}

fn ca_bundle(place: &Place) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certificates(place)?);
    if added == 0 {
        return Err(place.error(format!(
            "{:?} holds no usable CA certificate (check that it is the CA's certificate, in PEM)",
            place.path
        )));
    }
    Ok(roots)
}

fn system_roots(place: &Place) -> Result<RootCertStore, ConfigError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found
            .errors
            .first()
            .map(|error| format!(": {error}"))
            .unwrap_or_default();
        return Err(place.error(format!(
            "no system CA certificate could be loaded{why} (install the ca-certificates \
             package, or set ca_file)"
        )));
    }
    Ok(roots)
}

fn identity(cert: &Place, key: &Place) -> Result<ClientIdentity, ConfigError> {
    let chain = certificates(cert)?;
    let bytes = read(key)?;
    let private = PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| {
        key.error(format!(
            "{:?} holds no usable private key (PKCS#8, PKCS#1 or SEC1, in PEM): {error}",
            key.path
        ))
    })?;
    // The key must be one the provider can sign with, and belong to the certificate.
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(private.clone_key())
        .map_err(|error| {
            key.error(format!(
                "{:?} is not a usable private key: {error}",
                key.path
            ))
        })?;
    let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
    if let Err(error) = certified.keys_match() {
        return Err(key.error(format!(
            "{:?} is not the private key of {:?}: {error}",
            key.path, cert.path
        )));
    }
    Ok(ClientIdentity {
        chain,
        key: private,
    })
}
