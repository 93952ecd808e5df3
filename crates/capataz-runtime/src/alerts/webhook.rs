//! The webhook worker: POSTs each alert's JSON, retrying with exponential backoff.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, HOST, USER_AGENT};
use http_body_util::Full;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Alert, AlertStats, DeliveryError};
use crate::config::WebhookConfig;
use crate::oneshot;

/// The `User-Agent` of webhook requests.
const AGENT: &str = concat!("capataz/", env!("CARGO_PKG_VERSION"));

/// The longest wait between two webhook attempts, unless `backoff` itself is longer.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub(super) async fn run_webhook(
    hook: WebhookConfig,
    mut queue: mpsc::Receiver<Arc<Alert>>,
    stats: Arc<AlertStats>,
) {
    while let Some(alert) = queue.recv().await {
        let body = Bytes::from(alert.to_json().to_string());
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            let error = match post(&hook, body.clone()).await {
                Ok(()) => break Ok(()),
                Err(error) => error,
            };
            if attempts > hook.retries {
                break Err(error);
            }
            let delay = retry_delay(hook.backoff, attempts);
            tracing::debug!(webhook = %hook.url, attempts, %error, ?delay, "alert webhook retrying");
            tokio::time::sleep(delay).await;
        };
        match outcome {
            Ok(()) => {
                stats.webhook.delivered.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(webhook = %hook.url, attempts, "alert delivered");
            }
            Err(error) => {
                stats.webhook.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    webhook = %hook.url,
                    attempts,
                    %error,
                    event = %alert.event.sentence(),
                    "alert webhook failed; giving up on this alert"
                );
            }
        }
    }
}

/// The wait before retry `retry` (1 for the first): `backoff`, doubled for each retry after the
/// first, capped at [`MAX_BACKOFF`] (or `backoff` itself when that is longer).
pub(super) fn retry_delay(backoff: Duration, retry: u32) -> Duration {
    let factor = 1u32 << retry.saturating_sub(1).min(20);
    backoff.saturating_mul(factor).min(MAX_BACKOFF.max(backoff))
}

/// One POST over a fresh connection, answered within the hook's timeout. A 2xx answer is
/// success.
async fn post(hook: &WebhookConfig, body: Bytes) -> Result<(), DeliveryError> {
    let by = Instant::now() + hook.timeout;
    let failed = |error: oneshot::Error| match error {
        oneshot::Error::Connect(source) => DeliveryError::Connect {
            addr: hook.socket_addr,
            source,
        },
        oneshot::Error::ConnectTimeout | oneshot::Error::HeadTimeout => {
            DeliveryError::Timeout(hook.timeout)
        }
        other => DeliveryError::Http(other),
    };
    let mut connection = oneshot::connect(hook.socket_addr, None, by)
        .await
        .map_err(failed)?;
    let request = http::Request::post(&hook.path)
        .header(HOST, &hook.host)
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, AGENT)
        .header(CONNECTION, "close")
        .body(Full::new(body))?;
    let response = connection.send(request, by).await.map_err(failed)?;
    match response.status() {
        status if status.is_success() => Ok(()),
        status => Err(DeliveryError::Status(status)),
    }
}
