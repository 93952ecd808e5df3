//! Why an ACME order failed: the `error` of the `ACME order failed` log line, each cause with
//! its source (instant-acme's error, the IO error, the server's problem document).

use std::path::PathBuf;
use std::time::Duration;

use instant_acme::{AuthorizationStatus, Problem};
use rustls::pki_types::pem;

use super::http::AcmeHttpError;
use crate::tls::acme::{ChallengeError, IssuedError};

/// Why an order failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum OrderError {
    #[error("the order took longer than {0:?}")]
    Timeout(Duration),
    #[error("a blocking step failed: {0}")]
    Blocking(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Http(#[from] AcmeHttpError),
    /// Reading, writing or removing a stored file.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the stored account: {0}")]
    StoredAccount(#[source] instant_acme::Error),
    #[error("creating the account: {0}")]
    CreateAccount(#[source] instant_acme::Error),
    #[error(transparent)]
    Credentials(#[from] serde_json::Error),
    #[error("the server does not know the stored account: {0}")]
    UnknownAccount(#[source] Problem),
    #[error("creating the order: {0}")]
    CreateOrder(#[source] instant_acme::Error),
    #[error("reading the authorizations: {0}")]
    Authorizations(#[source] instant_acme::Error),
    #[error("the server asks to validate {0:?}, which was not ordered")]
    NotOrdered(String),
    #[error("the authorization of {domain} is {status:?}")]
    Authorization {
        domain: String,
        status: AuthorizationStatus,
    },
    #[error("the server offers no {kind} challenge for {domain}")]
    NoChallenge { kind: &'static str, domain: String },
    #[error(transparent)]
    Challenge(#[from] ChallengeError),
    #[error("DNS-01: {0}")]
    Dns01(#[from] super::dns01::Dns01Error),
    #[error("answering a challenge: {0}")]
    ChallengeReady(#[source] instant_acme::Error),
    #[error("polling the order: {0}")]
    Poll(#[source] instant_acme::Error),
    /// The order turned invalid: the failed challenges' problems, as the server worded them.
    #[error("the order became invalid{}", reasons(.0))]
    Invalid(Vec<String>),
    #[error(transparent)]
    Request(#[from] rcgen::Error),
    #[error("finalizing the order: {0}")]
    Finalize(#[source] instant_acme::Error),
    #[error("fetching the certificate: {0}")]
    Fetch(#[source] instant_acme::Error),
    #[error("the certificate is not valid PEM: {0}")]
    ChainPem(#[source] pem::Error),
    #[error(transparent)]
    KeyPem(pem::Error),
    #[error("the server's certificate: {0}")]
    Certificate(#[source] IssuedError),
    #[error("the server's certificate does not name {0}")]
    Unnamed(String),
}

impl OrderError {
    /// A [`OrderError::File`] for `path`.
    pub(super) fn file(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> OrderError + '_ {
        move |source| OrderError::File {
            path: path.to_owned(),
            source,
        }
    }
}

fn reasons(reasons: &[String]) -> String {
    if reasons.is_empty() {
        String::new()
    } else {
        format!(": {}", reasons.join("; "))
    }
}
