//! Automatic certificates by ACME (RFC 8555) for a TLS listener with `[listeners.tls.acme]`:
//! one task per such listener ([`run`]), started with the listener and stopped with it (on
//! shutdown, on its removal, and replaced on every reload, whose new `ServerTls` has read the
//! stored certificate again).
//!
//! The task orders a certificate naming every domain when none is in force or when the one in
//! force is within `renew_before` of its expiry, answers the TLS-ALPN-01 challenges through
//! the listener's resolver (`tls::acme::AcmeCerts`) or the HTTP-01 ones through the balancer's
//! plaintext listeners ([`Http01Tokens`], `http01.rs`), stores the chain and its new key in
//! `storage` and puts them in force for the next handshakes, without a reload and without
//! touching open connections. A failed order is retried with a jittered exponential backoff
//! (10 s doubling to 1 h); the certificate in force keeps serving meanwhile. File IO runs on
//! the blocking pool; the ACME protocol is instant-acme's over our own HTTP client (`http.rs`).

mod ari;
mod dns01;
mod error;
mod http;
mod http01;
mod store;

pub(crate) use http01::{Http01Answer, Http01Owner, Http01Tokens};

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use self::ari::Ari;
use self::dns01::Dns01Records;
use self::error::OrderError;
use crate::instruments::TlsFamilies;
use crate::tls::acme::{
    certificate_request, challenge_certificate, issued_from_der, AcmeCerts, AcmeSettings,
    Challenge, Issued,
};

/// The first retry after a failed order; it doubles per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
/// The longest wait between two attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The least time between two successful orders, whatever `renew_before` says (a
/// `renew_before` longer than the certificates' lifetime would otherwise order without end).
const MIN_REORDER: Duration = Duration::from_secs(3600);
/// The longest sleep before the renewal time is computed again (the wall clock may jump).
const MAX_SLEEP: Duration = Duration::from_secs(12 * 3600);
/// How long an order may take from its creation to its certificate.
const ORDER_TIMEOUT: Duration = Duration::from_secs(300);
/// How long removing an order's DNS-01 TXT records may take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the ACME loop of listener `listener` until `shutdown` turns true (or the task is
/// aborted by a reload). HTTP-01 tokens go to `http01`, which the plaintext listeners answer
/// from; they are removed when the task ends, however it ends.
pub(crate) async fn run(
    listener: String,
    certs: Arc<AcmeCerts>,
    http01: Arc<Http01Tokens>,
    metrics: TlsFamilies,
    mut shutdown: watch::Receiver<bool>,
) {
    let http01 = http01.owner();
    let dns01 = Dns01Records::new(certs.settings().dns01.clone());
    let work = run_loop(&listener, &certs, &http01, &dns01, &metrics);
    tokio::select! {
        () = work => {}
        _ = shutdown.wait_for(|down| *down) => {}
    }
    certs.clear_challenges();
    http01.clear();
    let _ = tokio::time::timeout(CLEANUP_TIMEOUT, dns01.remove_all(&listener)).await;
}

async fn run_loop(
    listener: &str,
    certs: &Arc<AcmeCerts>,
    http01: &Http01Owner,
    dns01: &Dns01Records,
    metrics: &TlsFamilies,
) {
    let settings = certs.settings().clone();
    let domains = settings.domains.join(",");
    let mut failures: u32 = 0;
    let mut last_success: Option<tokio::time::Instant> = None;
    if let Some(issued) = certs.issued() {
        metrics.set_acme_expiry(listener, &settings, issued.info.not_after);
    }
    // What ARI says about the certificate in force (none until it is asked).
    let mut ari: Option<Ari> = None;
    loop {
        let issued = certs.issued();
        if let Some(issued) = &issued {
            let plan = ari.get_or_insert_with(|| Ari::new(issued));
            if plan.ask_at().is_some_and(|at| at <= unix_now()) {
                ari::refresh(listener, &settings, plan).await;
            }
        }
        // The one renewal time the task both waits for and logs.
        let mut wait = match &issued {
            None => Duration::ZERO,
            Some(issued) => {
                let at = ari
                    .as_ref()
                    .and_then(Ari::renew_at)
                    .unwrap_or_else(|| renew_at(issued, &settings));
                until(at)
            }
        };
        if let Some(last) = last_success {
            wait = wait.max(MIN_REORDER.saturating_sub(last.elapsed()));
        }
        if failures > 0 {
            wait = wait.max(backoff(failures));
        }
        if !wait.is_zero() {
            if let Some(issued) = certs.issued() {
                tracing::info!(
                    listener,
                    domains,
                    expires = %crate::timefmt::rfc3339(unix_to_system(issued.info.not_after)),
                    next_renewal = %crate::timefmt::rfc3339(SystemTime::now() + wait),
                    "ACME certificate in force"
                );
            }
            let ask_in = ari.as_ref().and_then(Ari::ask_at).map_or(MAX_SLEEP, until);
            let sleep = wait.min(MAX_SLEEP).min(ask_in);
            tokio::time::sleep(sleep).await;
            if wait > sleep {
                continue;
            }
        }
        let renewing = issued.is_some();
        // A renewal names the certificate it replaces when the CA offers ARI for it.
        let replaces = ari.as_ref().filter(|_| renewing).and_then(Ari::replaces);
        let named = replaces.is_some();
        let ordered = order(&settings, certs, http01, dns01, replaces);
        let outcome = match tokio::time::timeout(ORDER_TIMEOUT, ordered).await {
            Ok(outcome) => outcome,
            Err(_) => Err(OrderError::Timeout(ORDER_TIMEOUT)),
        };
        certs.clear_challenges();
        http01.clear();
        let _ = tokio::time::timeout(CLEANUP_TIMEOUT, dns01.remove_all(listener)).await;
        match outcome {
            Ok(issued) => {
                failures = 0;
                last_success = Some(tokio::time::Instant::now());
                let result = if renewing { "renewed" } else { "issued" };
                metrics.acme_order(listener, result);
                metrics.set_acme_expiry(listener, &settings, issued.info.not_after);
                tracing::info!(
                    listener,
                    domains,
                    result,
                    expires = %crate::timefmt::rfc3339(unix_to_system(issued.info.not_after)),
                    "ACME certificate {result}"
                );
                certs.install(issued);
                ari = None;
            }
            Err(error) => {
                if let (true, OrderError::CreateOrder(_), Some(ari)) = (named, &error, &mut ari) {
                    ari.replaces_refused = true;
                }
                failures = failures.saturating_add(1);
                metrics.acme_order(listener, "failed");
                tracing::warn!(
                    listener,
                    domains,
                    error = %error,
                    retry_in = ?backoff(failures),
                    "ACME order failed"
                );
            }
        }
    }
}

/// When `issued` is due for renewal (Unix seconds).
fn renew_at(issued: &Issued, settings: &AcmeSettings) -> i64 {
    let before = i64::try_from(settings.renew_before.as_secs()).unwrap_or(i64::MAX);
    issued.info.not_after.saturating_sub(before)
}

/// The wait after `failures` failed orders in a row: 10 s doubling, at most 1 h, ±25 %.
fn backoff(failures: u32) -> Duration {
    let doubled = FIRST_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let base = doubled.min(MAX_BACKOFF);
    base.mul_f64(0.75 + fastrand::f64() * 0.5)
}

/// The wait until `unix` (Unix seconds), zero if it has passed.
fn until(unix: i64) -> Duration {
    Duration::from_secs(u64::try_from(unix.saturating_sub(unix_now())).unwrap_or(0))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn unix_to_system(unix: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(unix).unwrap_or(0))
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, OrderError> + Send + 'static,
) -> Result<T, OrderError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(OrderError::Blocking)?
}

/// The account: the stored one if it was made with this directory, else a new one (stored).
async fn account(settings: &AcmeSettings) -> Result<Account, OrderError> {
    let ca_file = settings.ca_file.clone();
    let http = || {
        let ca_file = ca_file.clone();
        blocking(move || Ok(http::AcmeHttp::new(ca_file.as_deref())?))
    };
    let path = settings.account_path();
    let stored = {
        let path = path.clone();
        blocking(move || store::read_account(&path).map_err(OrderError::file(&path))).await?
    };
    if let Some(bytes) = stored {
        let directory = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| {
                v.get("directory")
                    .and_then(|d| d.as_str())
                    .map(str::to_owned)
            });
        if directory.as_deref() == Some(settings.directory.as_str()) {
            if let Ok(credentials) = serde_json::from_slice::<AccountCredentials>(&bytes) {
                return Account::builder_with_http(Box::new(http().await?))
                    .from_credentials(credentials)
                    .await
                    .map_err(OrderError::StoredAccount);
            }
        }
        tracing::info!(
            file = %path.display(),
            "the stored ACME account is for another directory or unreadable; creating one"
        );
    }
    let contact = settings.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, credentials) = Account::builder_with_http(Box::new(http().await?))
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            settings.directory.clone(),
            None,
        )
        .await
        .map_err(OrderError::CreateAccount)?;
    let bytes = serde_json::to_vec(&credentials)?;
    blocking(move || store::write_atomic(&path, &bytes, true).map_err(OrderError::file(&path)))
        .await?;
    Ok(account)
}

/// One order, from the account to the certificate stored on disk.
async fn order(
    settings: &AcmeSettings,
    certs: &AcmeCerts,
    http01: &Http01Owner,
    dns01: &Dns01Records,
    replaces: Option<instant_acme::CertificateIdentifier<'static>>,
) -> Result<Issued, OrderError> {
    let account = account(settings).await?;
    let identifiers: Vec<Identifier> = settings
        .domains
        .iter()
        .map(|d| Identifier::Dns(d.clone()))
        .collect();
    let mut new_order = NewOrder::new(&identifiers);
    if let Some(replaces) = replaces {
        new_order = new_order.replaces(replaces);
    }
    let mut order = match account.new_order(&new_order).await {
        Ok(order) => order,
        Err(instant_acme::Error::Api(problem))
            if problem.r#type.as_deref()
                == Some("urn:ietf:params:acme:error:accountDoesNotExist") =>
        {
            // The server forgot the account: make a new one at the next attempt.
            let path = settings.account_path();
            let _ = blocking(move || std::fs::remove_file(&path).map_err(OrderError::file(&path)))
                .await;
            return Err(OrderError::UnknownAccount(problem));
        }
        Err(error) => return Err(OrderError::CreateOrder(error)),
    };
    authorize(&mut order, settings, certs, http01, dns01).await?;
    set_ready(&mut order, settings.challenge).await?;
    wait_ready(&mut order).await?;
    certs.clear_challenges();
    http01.clear();
    let (csr, key_pem) = certificate_request(&settings.domains)?;
    if order.state().status == OrderStatus::Ready {
        order
            .finalize_csr(&csr)
            .await
            .map_err(OrderError::Finalize)?;
    }
    let chain_pem = certificate(&mut order).await?;
    check_and_store(settings, chain_pem, key_pem).await
}

/// Answers the pending authorizations' challenges (TLS-ALPN-01 through `certs`, HTTP-01
/// through `http01`, DNS-01 through `dns01`, and waits until its records are visible); the
/// server is told about them by [`set_ready`] afterwards.
async fn authorize(
    order: &mut instant_acme::Order,
    settings: &AcmeSettings,
    certs: &AcmeCerts,
    http01: &Http01Owner,
    dns01: &Dns01Records,
) -> Result<(), OrderError> {
    let mut authorizations = order.authorizations();
    let mut pending = false;
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization.map_err(OrderError::Authorizations)?;
        let domain = ordered_domain(&authorization, settings)?;
        if !is_pending(&authorization, &domain)? {
            continue;
        }
        let lower = domain.to_ascii_lowercase();
        let challenge = authorization
            .challenge(challenge_type(settings.challenge))
            .ok_or_else(|| OrderError::NoChallenge {
                kind: settings.challenge.name(),
                domain: domain.clone(),
            })?;
        let key_authorization = challenge.key_authorization();
        match settings.challenge {
            Challenge::TlsAlpn01 => {
                let digest = key_authorization.digest();
                let certificate = challenge_certificate(&domain, digest.as_ref())?;
                certs.set_challenge(&lower, certificate);
            }
            Challenge::Http01 => http01.set(&challenge.token, key_authorization.as_str()),
            Challenge::Dns01 => dns01.add(&lower, &key_authorization.dns_value()).await?,
        }
        pending = true;
    }
    if settings.challenge == Challenge::Dns01 && pending {
        dns01.wait_visible().await?;
    }
    Ok(())
}

/// Tells the server the pending authorizations' challenges are ready (the authorizations were
/// fetched by [`authorize`]: no request but the challenges' own).
async fn set_ready(
    order: &mut instant_acme::Order,
    challenge: Challenge,
) -> Result<(), OrderError> {
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization.map_err(OrderError::Authorizations)?;
        if authorization.status != AuthorizationStatus::Pending {
            continue;
        }
        let domain = authorization.identifier().to_string();
        let mut handle = authorization
            .challenge(challenge_type(challenge))
            .ok_or_else(|| OrderError::NoChallenge {
                kind: challenge.name(),
                domain,
            })?;
        handle
            .set_ready()
            .await
            .map_err(OrderError::ChallengeReady)?;
    }
    Ok(())
}

/// The DNS name `authorization` is for (a wildcard's without its `*.`, RFC 8555 7.1.4), which
/// must be one of the listener's.
fn ordered_domain(
    authorization: &instant_acme::AuthorizationHandle<'_>,
    settings: &AcmeSettings,
) -> Result<String, OrderError> {
    let identifier = authorization.identifier();
    let Identifier::Dns(domain) = identifier.identifier else {
        return Err(OrderError::NotOrdered(identifier.to_string()));
    };
    let lower = domain.to_ascii_lowercase();
    if !settings.domains.contains(&lower) && !settings.domains.contains(&format!("*.{lower}")) {
        return Err(OrderError::NotOrdered(domain.clone()));
    }
    Ok(domain.clone())
}

/// Whether the authorization still needs its challenge answered (valid ones do not; any other
/// status fails the order).
fn is_pending(
    authorization: &instant_acme::AuthorizationHandle<'_>,
    domain: &str,
) -> Result<bool, OrderError> {
    match authorization.status {
        AuthorizationStatus::Valid => Ok(false),
        AuthorizationStatus::Pending => Ok(true),
        status => Err(OrderError::Authorization {
            domain: domain.to_owned(),
            status,
        }),
    }
}

fn challenge_type(challenge: Challenge) -> ChallengeType {
    match challenge {
        Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        Challenge::Http01 => ChallengeType::Http01,
        Challenge::Dns01 => ChallengeType::Dns01,
    }
}

/// Polls the order until the server has validated it (or found it invalid).
async fn wait_ready(order: &mut instant_acme::Order) -> Result<(), OrderError> {
    let mut delay = Duration::from_millis(250);
    loop {
        let state = order.refresh().await.map_err(OrderError::Poll)?;
        match state.status {
            OrderStatus::Ready | OrderStatus::Valid | OrderStatus::Processing => return Ok(()),
            OrderStatus::Invalid => return Err(why_invalid(order).await),
            OrderStatus::Pending => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Polls the finalized order until the server hands out the certificate chain (PEM).
async fn certificate(order: &mut instant_acme::Order) -> Result<String, OrderError> {
    let mut delay = Duration::from_millis(250);
    loop {
        match order.certificate().await {
            Ok(Some(chain)) => return Ok(chain),
            Ok(None) => {}
            Err(error) => return Err(OrderError::Fetch(error)),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Checks the chain and key the order produced and stores them.
async fn check_and_store(
    settings: &AcmeSettings,
    chain_pem: String,
    key_pem: String,
) -> Result<Issued, OrderError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(OrderError::ChainPem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(OrderError::KeyPem)?;
    let cert_path = settings.cert_path();
    let issued =
        issued_from_der(chain, key, &cert_path, unix_now()).map_err(OrderError::Certificate)?;
    if let Some(missing) = settings
        .domains
        .iter()
        .find(|d| !issued.info.names.contains(d))
    {
        return Err(OrderError::Unnamed(missing.clone()));
    }
    let key_path = settings.key_path();
    blocking(move || {
        // The key first: a crash between the two renames leaves a pair that does not match,
        // which the next start reports and orders again.
        store::write_atomic(&key_path, key_pem.as_bytes(), true)
            .map_err(OrderError::file(&key_path))?;
        store::write_atomic(&cert_path, chain_pem.as_bytes(), false)
            .map_err(OrderError::file(&cert_path))
    })
    .await?;
    Ok(issued)
}

/// Why an order turned invalid: the failed challenges' problems, as the server worded them.
async fn why_invalid(order: &mut instant_acme::Order) -> OrderError {
    let mut reasons = Vec::new();
    if let Some(problem) = &order.state().error {
        reasons.push(problem.to_string());
    }
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authorization)) = authorizations.next().await {
        // The order's authorizations as they are now, not as `authorize` saw them.
        if authorization.refresh().await.is_err() {
            continue;
        }
        let domain = authorization.identifier().to_string();
        for challenge in &authorization.challenges {
            if let Some(problem) = &challenge.error {
                reasons.push(format!("{domain}: {problem}"));
            }
        }
    }
    OrderError::Invalid(reasons)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_ten_seconds_to_an_hour_with_jitter() {
        for _ in 0..100 {
            let first = backoff(1);
            assert!(first >= Duration::from_millis(7500) && first <= Duration::from_millis(12500));
            let third = backoff(3);
            assert!(third >= Duration::from_secs(30) && third <= Duration::from_secs(50));
            let many = backoff(u32::MAX);
            assert!(many >= Duration::from_secs(2700) && many <= Duration::from_secs(4500));
        }
    }
}
