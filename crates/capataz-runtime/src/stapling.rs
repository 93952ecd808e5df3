//! OCSP stapling by fetching (`[listeners.tls] ocsp_fetch = true`): one task per such
//! listener ([`run`]), started with it and replaced on every reload like the ACME task. For
//! each static certificate whose chain holds its issuer and which names an `http://` OCSP
//! responder, it POSTs the OCSP request, checks the answer (`tls::ocsp::check`: for this
//! certificate, signed by its issuer or a delegated responder, `good`, within its times) and
//! staples it (`tls::staple::StapleSlot`), then fetches again halfway to its `nextUpdate`.
//! The certificate ACME has in force is kept stapled the same way ([`follow_acme`]); when a
//! new one is put in force, its own response is fetched into its own slot and the old
//! certificate's loop stops.
//!
//! A failed fetch (the responder unreachable, slow, or answering garbage) is retried with a
//! jittered backoff while the response in force keeps being stapled until it goes stale (the
//! slot stops stapling it by itself then); a bad answer is never stapled; an answer saying
//! the certificate is revoked removes the staple. Each fetch is bounded: 10 s for connecting
//! and the whole answer, a body of at most 64 KiB.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::oneshot;
use crate::tls::acme::AcmeCerts;
use crate::tls::ocsp::{self, Refusal};
use crate::tls::staple::{unix_now, OcspFetch};
use crate::tls::ServerTls;

/// How long one fetch may take, from connecting to the last byte of the answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read.
const MAX_ANSWER: usize = 64 << 10;
/// The first retry after a failure; it doubles per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
/// The longest wait between two attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The least time between two fetches of a good response (a responder whose `nextUpdate` is
/// seconds away would otherwise be asked without pause).
const MIN_REFRESH: Duration = Duration::from_secs(60);
/// The longest time between two fetches of a good response.
const MAX_REFRESH: Duration = Duration::from_secs(24 * 3600);

/// Keeps the OCSP responses of `tls`'s certificates fetched until `shutdown` turns true (or
/// the task is aborted by a reload). Logs, with the field `listener`, what `tls`'s load noted.
pub(crate) async fn run(listener: String, tls: ServerTls, mut shutdown: watch::Receiver<bool>) {
    for note in tls.ocsp_notes() {
        tracing::warn!(listener, note = %note, "OCSP stapling");
    }
    let mut tasks = tokio::task::JoinSet::new();
    for fetch in tls.ocsp_fetches().iter().cloned() {
        tasks.spawn(keep_fetched(listener.clone(), fetch));
    }
    if let Some(certs) = tls.acme_stapled() {
        tasks.spawn(follow_acme(listener.clone(), certs.clone()));
    }
    tokio::select! {
        _ = async { while tasks.join_next().await.is_some() {} } => {}
        _ = shutdown.wait_for(|down| *down) => {}
    }
}

/// Keeps the OCSP response of the certificate ACME has in force fetched into that
/// certificate's own slot, starting over for each certificate put in force (the loop of the
/// one replaced stops, and its staple goes with it). A certificate without a responder or an
/// issuer in its chain is noted at warn, once per certificate.
async fn follow_acme(listener: String, certs: std::sync::Arc<AcmeCerts>) {
    let mut installs = certs.installs();
    loop {
        installs.borrow_and_update();
        let keep = async {
            if let Some(issued) = certs.issued() {
                let file = certs.settings().cert_path();
                match OcspFetch::new(file, issued.slot.clone()) {
                    Ok(fetch) => keep_fetched(listener.clone(), fetch).await,
                    Err(note) => tracing::warn!(listener, note = %note, "OCSP stapling"),
                }
            }
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = keep => {}
            changed = installs.changed() => if changed.is_err() { return },
        }
    }
}

/// The loop of one certificate.
async fn keep_fetched(listener: String, fetch: OcspFetch) {
    let Some((leaf, issuer)) = fetch.leaf_and_issuer() else {
        return;
    };
    let file = fetch.file.display().to_string();
    let mut failures: u32 = 0;
    loop {
        let wait = match ask(&fetch.url, &fetch.request).await {
            Err(error) => {
                failures = failures.saturating_add(1);
                let retry_in = backoff(failures);
                tracing::warn!(
                    listener,
                    certificate = file,
                    url = fetch.url,
                    error = %error,
                    retry_in = ?retry_in,
                    stapled_until = ?fetch.slot.stapled_until().map(crate::tls::server_date),
                    "OCSP fetch failed"
                );
                retry_in
            }
            Ok(answer) => match ocsp::check(&answer, leaf, Some(issuer), unix_now()) {
                Ok(checked) => {
                    failures = 0;
                    fetch.slot.staple(answer, checked.until);
                    let wait = refresh_in(checked.this_update, checked.until, unix_now());
                    tracing::info!(
                        listener,
                        certificate = file,
                        next_update = %crate::tls::server_date(checked.until),
                        refresh_in = ?wait,
                        "OCSP response stapled"
                    );
                    wait
                }
                Err(why) => {
                    failures = failures.saturating_add(1);
                    if why == Refusal::Revoked {
                        fetch.slot.unstaple();
                    }
                    let retry_in = backoff(failures);
                    tracing::warn!(
                        listener,
                        certificate = file,
                        url = fetch.url,
                        reason = %why,
                        retry_in = ?retry_in,
                        stapled_until = ?fetch.slot.stapled_until().map(crate::tls::server_date),
                        "OCSP response refused"
                    );
                    retry_in
                }
            },
        };
        tokio::time::sleep(wait).await;
    }
}

/// When to fetch again a response fresh from `this_update` to `until`, at `now` (Unix
/// seconds): halfway, within [`MIN_REFRESH`] and [`MAX_REFRESH`] from now.
fn refresh_in(this_update: i64, until: i64, now: i64) -> Duration {
    let halfway = this_update.saturating_add(until.saturating_sub(this_update) / 2);
    let wait = Duration::from_secs(u64::try_from(halfway.saturating_sub(now)).unwrap_or(0));
    wait.clamp(MIN_REFRESH, MAX_REFRESH)
}

/// The wait after `failures` failures in a row: 10 s doubling, at most 1 h, ±25 %.
fn backoff(failures: u32) -> Duration {
    let doubled = FIRST_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled
        .min(MAX_BACKOFF)
        .mul_f64(0.75 + fastrand::f64() * 0.5)
}

/// Why a fetch got no answer to check.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("no whole answer within {0:?}")]
    Timeout(Duration),
    #[error("a bad URL: {0}")]
    Url(#[source] http::uri::InvalidUri),
    #[error("the URL has no host")]
    NoHost,
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    #[error(transparent)]
    Handshake(oneshot::Error),
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error("sending the request: {0}")]
    Send(#[source] oneshot::Error),
    #[error("the responder answered HTTP {0}")]
    Status(http::StatusCode),
    #[error("reading the answer (at most {MAX_ANSWER} bytes): {0}")]
    Read(#[source] oneshot::Error),
}

/// POSTs `request` to `url` and returns the answer's body, within [`FETCH_TIMEOUT`] from
/// connecting to the answer's last byte.
async fn ask(url: &str, request: &[u8]) -> Result<Vec<u8>, FetchError> {
    let by = Instant::now() + FETCH_TIMEOUT;
    let failed = |error: oneshot::Error, step: fn(oneshot::Error) -> FetchError| match error {
        oneshot::Error::Connect(source) => FetchError::Connect(source),
        oneshot::Error::ConnectTimeout
        | oneshot::Error::HeadTimeout
        | oneshot::Error::BodyTimeout => FetchError::Timeout(FETCH_TIMEOUT),
        other => step(other),
    };
    let uri: http::Uri = url.parse().map_err(FetchError::Url)?;
    let host = uri.host().ok_or(FetchError::NoHost)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let authority = uri.authority().map_or(host, |a| a.as_str());
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut connection = oneshot::connect((host, port), None, by)
        .await
        .map_err(|e| failed(e, FetchError::Handshake))?;
    let req = http::Request::post(path)
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/ocsp-request")
        .header(http::header::ACCEPT, "application/ocsp-response")
        .body(Full::new(Bytes::copy_from_slice(request)))?;
    let response = connection
        .send(req, by)
        .await
        .map_err(|e| failed(e, FetchError::Send))?;
    if response.status() != http::StatusCode::OK {
        return Err(FetchError::Status(response.status()));
    }
    let body = oneshot::read_body(response.into_body(), MAX_ANSWER, by)
        .await
        .map_err(|e| failed(e, FetchError::Read))?;
    Ok(body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_fetched_again_halfway_within_a_minute_and_a_day() {
        // Fresh for 4 days from now - 1 day: halfway is a day from now.
        assert_eq!(
            refresh_in(-86_400, 3 * 86_400, 0),
            Duration::from_secs(86_400)
        );
        // Fresh for 10 days: at most a day.
        assert_eq!(refresh_in(0, 10 * 86_400, 0), MAX_REFRESH);
        // Fresh for 60 s: not before a minute.
        assert_eq!(refresh_in(0, 60, 0), MIN_REFRESH);
        // Past halfway already: a minute.
        assert_eq!(refresh_in(0, 1000, 900), MIN_REFRESH);
        let _ = refresh_in(i64::MIN, i64::MAX, i64::MIN);
    }

    #[test]
    fn failures_back_off_from_ten_seconds_to_an_hour() {
        for _ in 0..100 {
            let first = backoff(1);
            assert!(first >= Duration::from_millis(7500) && first <= Duration::from_millis(12500));
            let many = backoff(u32::MAX);
            assert!(many >= Duration::from_secs(2700) && many <= Duration::from_secs(4500));
        }
    }
}
