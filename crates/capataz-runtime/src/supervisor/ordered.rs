//! The ordered lane: reloads and membership updates go to the supervisor through one task
//! ([`run`]) that keeps them in the order they were asked and reads the file of a reload from
//! the file on the way, one at a time, on the blocking pool (a slow disk, a FIFO, a slow
//! resolver, a costly value). So reloads apply in the order they were asked and a membership
//! update asked after a reload applies after it, while a read that takes long holds back only
//! what comes after it in this lane: overrides, opening and stopping go to the supervisor
//! directly.

use std::path::PathBuf;
use std::sync::Weak;

use tokio::sync::{mpsc, oneshot, watch};

use super::task::{Command, ReloadReply};
use super::{StartError, Supervisor};
use crate::config::{BackendConfig, Config, PoolSource};

/// What goes through the lane.
#[derive(Debug)]
pub(super) enum Ordered {
    /// Read the file, then reload it.
    ReloadFile(ReloadReply),
    /// Reload this configuration.
    Reload(Box<Config>, ReloadReply),
    /// Put a source's membership in force (see [`Command::SetMembers`]).
    SetMembers {
        pool: String,
        source: PoolSource,
        members: Vec<BackendConfig>,
        reply: oneshot::Sender<Option<(usize, usize, usize)>>,
    },
}

/// Forwards what is `asked` to the supervisor in order, reading the file at `path` for each
/// reload from the file. A read that has not ended when shutdown begins is given up (the
/// reload would be refused anyway), so shutdown does not wait for it. Ends with the supervisor.
pub(super) async fn run(
    me: Weak<Supervisor>,
    path: Option<PathBuf>,
    mut asked: mpsc::Receiver<Ordered>,
    mut shutdown: watch::Receiver<bool>,
) {
    while let Some(ordered) = asked.recv().await {
        let command = match ordered {
            Ordered::ReloadFile(reply) => {
                let config = match path.clone() {
                    Some(path) => read(path, &mut shutdown).await,
                    None => Err(StartError::NoFile),
                };
                Command::Reload { config, reply }
            }
            Ordered::Reload(config, reply) => Command::Reload {
                config: Ok(config),
                reply,
            },
            Ordered::SetMembers {
                pool,
                source,
                members,
                reply,
            } => Command::SetMembers {
                pool,
                source,
                members,
                reply,
            },
        };
        let Some(supervisor) = me.upgrade() else {
            return;
        };
        if supervisor.commands.send(command).await.is_err() {
            return;
        }
    }
}

/// Reads, validates and resolves the file at `path` on the blocking pool, unless shutdown
/// begins first.
async fn read(
    path: PathBuf,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Box<Config>, StartError> {
    let read = tokio::task::spawn_blocking(move || {
        crate::config::load_all_errors(&path)
            .map(Box::new)
            .map_err(StartError::Configs)
    });
    tokio::select! {
        biased;
        read = read => read.unwrap_or(Err(StartError::ReloadPanicked)),
        _ = shutdown.wait_for(|down| *down) => Err(StartError::ShuttingDown),
    }
}
