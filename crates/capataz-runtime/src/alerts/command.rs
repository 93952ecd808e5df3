//! The command worker: runs a program per alert, with the alert in `CAPATAZ_*` variables.

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Alert, AlertStats, DeliveryError};
use crate::config::CommandConfig;

pub(super) async fn run_command(
    hook: CommandConfig,
    mut queue: mpsc::Receiver<Arc<Alert>>,
    stats: Arc<AlertStats>,
) {
    let program = hook.argv.first().map_or("", String::as_str);
    while let Some(alert) = queue.recv().await {
        match execute(&hook, &alert).await {
            Ok(()) => {
                stats.command.delivered.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(command = program, "alert command succeeded");
            }
            Err(error) => {
                stats.command.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    command = program,
                    %error,
                    event = %alert.event.sentence(),
                    "alert command failed"
                );
            }
        }
    }
}

/// Runs the command once for `alert`. Its stdin and stdout are null. Its stderr is the
/// balancer's, so its complaints land beside the logs. On timeout it is killed, but processes
/// it started itself are not.
async fn execute(hook: &CommandConfig, alert: &Alert) -> Result<(), DeliveryError> {
    let (program, args) = hook.argv.split_first().ok_or(DeliveryError::NoProgram)?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .envs(command_env(alert))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    // On every CPU, not on the one of a pinned worker (`workers`).
    crate::workers::unpinned(&mut command);
    let mut child = command.spawn().map_err(DeliveryError::Spawn)?;
    match tokio::time::timeout(hook.timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(DeliveryError::Exit(status)),
        Ok(Err(error)) => Err(DeliveryError::Wait(error)),
        Err(_) => {
            // Kill and reap it now, rather than leaving that to `kill_on_drop`.
            let _ = child.kill().await;
            Err(DeliveryError::Killed(hook.timeout))
        }
    }
}

/// The `CAPATAZ_*` variables a command gets. A value the event does not have is empty.
pub(super) fn command_env(alert: &Alert) -> Vec<(&'static str, String)> {
    let json = alert.to_json();
    let event = &alert.event;
    let (from, to, reason) = event
        .change()
        .map(|(from, to, reason)| (from.to_owned(), to.to_owned(), reason))
        .unwrap_or_default();
    let time = json["time"].as_str().unwrap_or_default().to_owned();
    vec![
        ("CAPATAZ_EVENT", event.kind().to_owned()),
        ("CAPATAZ_POOL", event.pool().to_owned()),
        (
            "CAPATAZ_BACKEND",
            event.backend().unwrap_or_default().to_owned(),
        ),
        ("CAPATAZ_FROM", from),
        ("CAPATAZ_TO", to),
        ("CAPATAZ_REASON", reason),
        ("CAPATAZ_TIME", time),
        ("CAPATAZ_SENTENCE", event.sentence()),
        ("CAPATAZ_SUPPRESSED", alert.suppressed.to_string()),
        ("CAPATAZ_JSON", json.to_string()),
    ]
}
