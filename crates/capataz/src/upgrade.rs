//! Zero-downtime binary upgrades: on SIGUSR2 the running process starts the binary at the path
//! it was started from, with the same arguments, handing it its listening sockets
//! (`crate::handover`); the new process re-establishes the backends' health by probing them
//! before it accepts; then the old one stops accepting, drains and exits.
//!
//! The health state is re-established, not handed over: the new process starts every probed
//! backend DOWN with its first probe deciding (`initial = "first-probe"`), and accepts once
//! every backend has had that probe (and every pool with a DNS source has had its first
//! answer). Until then the old process, whose verdicts stand, serves alone; from then on no
//! request of the new process goes to a backend it has not seen pass. The cost: what only
//! the old process knew (passive ejections, manual overrides, slow starts) is not carried
//! over, and the handover waits about one probe interval.
//!
//! Failure leaves the old process serving: a new process that exits before it is ready (a
//! bad configuration, a crash, a port it cannot bind) or is not ready in time (it is then
//! killed) is logged with its exit status, and a later SIGUSR2 may try again.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;

use crate::config::{CheckKind, Config, PoolSource};
use crate::handover::{self, READY_MESSAGE};
use crate::server::Balancer;

/// How often the new process looks whether its backends are decided.
const DECIDED_POLL: Duration = Duration::from_millis(20);

/// Time the new process gets to start (read its configuration, resolve names, load
/// certificates), on top of the time its probes need.
const START_ALLOWANCE: Duration = Duration::from_secs(30);

/// Why an upgrade did not hand over; the old process keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The listening sockets could not be offered or the new process not started.
    #[error("cannot start the new process {}: {error}", .exe.display())]
    Spawn {
        /// The binary.
        exe: PathBuf,
        /// What failed.
        error: io::Error,
    },
    /// The new process exited before it was ready.
    #[error("the new process (pid {pid}) exited before it was ready ({status}); its own error is logged above")]
    Exited {
        /// Its process id.
        pid: u32,
        /// How it ended.
        status: ExitStatus,
    },
    /// The new process was not ready in time and was killed.
    #[error("the new process (pid {pid}) was not ready within {}; it was killed", capataz_health::pool::human_duration(*.within))]
    TimedOut {
        /// Its process id.
        pid: u32,
        /// The time it had.
        within: Duration,
    },
    /// This process was asked to stop meanwhile; the new one was killed.
    #[error("the new process (pid {pid}) was killed: this process is stopping")]
    Cancelled {
        /// Its process id.
        pid: u32,
    },
    /// The readiness channel failed, or said something else than it is ready.
    #[error("the new process (pid {pid}) broke the handover protocol: {why}")]
    Protocol {
        /// Its process id.
        pid: u32,
        /// What happened.
        why: String,
    },
}

/// A new process started by an upgrade, not yet ready.
#[derive(Debug)]
pub struct Started {
    child: tokio::process::Child,
    ready: tokio::net::UnixStream,
    pid: u32,
}

/// Starts the new process: `exe` with `args` (how this one was started, without the program
/// name), inheriting the balancer's listening sockets. Call it within the tokio runtime.
pub fn start(balancer: &Balancer, exe: &Path, args: &[OsString]) -> Result<Started, UpgradeError> {
    let spawn_error = |error| UpgradeError::Spawn {
        exe: exe.to_path_buf(),
        error,
    };
    let sockets = balancer.offer_sockets().map_err(spawn_error)?;
    let (mut command, ours, theirs) =
        handover::command(exe, args, &sockets).map_err(spawn_error)?;
    let child = command.spawn().map_err(spawn_error)?;
    // The child has its copies now; ours close here, so an exit of the child is an end of
    // file on the readiness channel.
    drop(theirs);
    drop(sockets);
    let pid = child.id().unwrap_or(0);
    ours.set_nonblocking(true).map_err(spawn_error)?;
    let ready = tokio::net::UnixStream::from_std(ours).map_err(spawn_error)?;
    Ok(Started { child, ready, pid })
}

impl Started {
    /// The new process's id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits until the new process says it serves (its pid), it exits, or `within` passes or
    /// `cancel` fires (then it is killed).
    pub async fn ready(
        mut self,
        within: Duration,
        cancel: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<u32, UpgradeError> {
        let pid = self.pid;
        let mut said = Vec::with_capacity(READY_MESSAGE.len());
        let read = async {
            let mut buf = [0u8; 16];
            loop {
                let n = self.ready.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<bool, io::Error>(false);
                }
                said.extend_from_slice(&buf[..n]);
                if said.len() >= READY_MESSAGE.len() {
                    return Ok(said.starts_with(READY_MESSAGE));
                }
            }
        };
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(within, read) => outcome,
            Ok(()) = cancel => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                return Err(UpgradeError::Cancelled { pid });
            }
        };
        match outcome {
            Ok(Ok(true)) => {
                // Its sockets (and the Unix sockets' files) are the new process's now.
                handover::handed_over();
                Ok(pid)
            }
            Ok(Ok(false)) if said.is_empty() => {
                // The channel closed: the process ended (or closed it, which is as bad).
                let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
                match status {
                    Ok(Ok(status)) => Err(UpgradeError::Exited { pid, status }),
                    _ => {
                        let _ = self.child.start_kill();
                        Err(UpgradeError::Protocol {
                            pid,
                            why: "it closed the readiness channel without exiting; it was killed"
                                .into(),
                        })
                    }
                }
            }
            Ok(Ok(_)) => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                Err(UpgradeError::Protocol {
                    pid,
                    why: format!(
                        "it said {:?}; it was killed",
                        String::from_utf8_lossy(&said)
                    ),
                })
            }
            Ok(Err(error)) => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                Err(UpgradeError::Protocol {
                    pid,
                    why: format!("{error}; it was killed"),
                })
            }
            Err(_) => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                Err(UpgradeError::TimedOut { pid, within })
            }
        }
    }
}

/// The longest time from a backend joining to its first probe's answer, over `config`'s
/// pools with active checks: a first probe comes within one interval (each backend starts at a
/// random phase, jittered), and answers within the timeout.
fn first_probe_bound(config: &Config) -> Duration {
    config
        .pools
        .iter()
        .filter(|pool| pool.active.kind != CheckKind::None)
        .map(|pool| {
            let jitter = pool
                .active
                .interval
                .mul_f64(pool.active.jitter.clamp(0.0, 0.5));
            pool.active.interval + jitter + pool.active.timeout
        })
        .max()
        .unwrap_or_default()
}

/// How long a new process waits for its backends to be decided: twice the longest first
/// probe bound of its pools, plus 5 s.
pub fn decide_within(config: &Config) -> Duration {
    first_probe_bound(config).saturating_mul(2) + Duration::from_secs(5)
}

/// How long the old process waits for the new one to be ready: what the new one may take to
/// decide (by the old configuration's pools) plus 30 s to start.
pub fn ready_within(config: &Config) -> Duration {
    decide_within(config) + START_ALLOWANCE
}

/// The backends (as `pool/backend`, or `pool (its source)`) not decided yet.
fn undecided(balancer: &Balancer) -> Vec<String> {
    let mut waiting = Vec::new();
    for pool in balancer.pools().iter() {
        let pool_config = &pool.handle().config;
        if !matches!(pool_config.source, PoolSource::Static)
            && pool.source_record.state().confirmed.is_none()
            && pool.source_record.state().failing.is_none()
        {
            waiting.push(format!("{} (its backend source)", pool.name));
        }
        if pool_config.active.kind == CheckKind::None {
            continue;
        }
        let backends = &pool.handle().backends;
        for (health, backend) in pool.health().iter().zip(backends.iter()) {
            if !health.active.probed {
                waiting.push(format!("{}/{}", pool.name, backend.name));
            }
        }
    }
    waiting
}

/// Waits until every backend of a balancer started held has had its first probe (and every
/// pool with a source its first answer); `Err` with those still waiting after `within`.
pub async fn wait_decided(balancer: &Balancer, within: Duration) -> Result<(), Vec<String>> {
    let end = tokio::time::Instant::now() + within;
    let mut tick = tokio::time::interval(DECIDED_POLL);
    loop {
        tick.tick().await;
        let waiting = undecided(balancer);
        if waiting.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= end {
            return Err(waiting);
        }
    }
}
