//! One access log's writer: a task that takes the records waiting in the channel, formats
//! them, and writes them in one batch on tokio's blocking pool (never a runtime thread: a
//! slow disk, a full pipe or a FIFO nobody reads stalls only this log, whose full buffer then
//! drops and counts records). Each batch is written straight to the file (no user-space
//! buffer), so a line is in the file at most one batch after it was emitted. The file is
//! opened on the first batch (so a FIFO or a slow mount never blocks start or reload), kept
//! open, and reopened when asked (every reload, so SIGHUP after a rotation moves to the new
//! file). A file that cannot be opened or written is reported once (warn) and its batches are
//! counted as dropped until a reopen succeeds.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, Notify};

use super::{format, AccessRecord, Progress};
use capataz_config::{AccessLogConfig, AccessLogFormat, AccessLogTarget};

/// The most records formatted into one batch (one write).
const MAX_BATCH: usize = 1024;

/// Runs the writer until every sender is gone and the channel is drained, counting in
/// `progress` the records it has finished with (and marking it stopped when it returns, or is
/// dropped with the runtime).
pub(super) async fn run(
    rx: mpsc::Receiver<Box<AccessRecord>>,
    config: AccessLogConfig,
    listener: Arc<str>,
    dropped: Counter,
    reopen: Arc<Notify>,
    progress: Arc<Progress>,
) {
    let _stopped = Stopped(progress.clone());
    write_batches(rx, config, listener, dropped, reopen, &progress).await;
}

/// Marks the writer stopped when dropped.
struct Stopped(Arc<Progress>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0
            .stopped
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

async fn write_batches(
    mut rx: mpsc::Receiver<Box<AccessRecord>>,
    config: AccessLogConfig,
    listener: Arc<str>,
    dropped: Counter,
    reopen: Arc<Notify>,
    progress: &Progress,
) {
    let mut sink = Some(Sink {
        target: config.target,
        file: None,
        failing: false,
    });
    let mut text = String::new();
    let mut records = Vec::with_capacity(MAX_BATCH);
    loop {
        let mut reopening = false;
        tokio::select! {
            biased;
            () = reopen.notified() => reopening = true,
            received = rx.recv_many(&mut records, MAX_BATCH) => {
                if received == 0 {
                    return;
                }
            }
        }
        let lines = records.len();
        for record in records.drain(..) {
            match config.format {
                AccessLogFormat::Text => format::text(&mut text, &listener, &record),
                AccessLogFormat::Json => format::json(&mut text, &listener, &record),
            }
        }
        let Some(mut owned) = sink.take() else {
            return;
        };
        let batch = std::mem::take(&mut text);
        let written = tokio::task::spawn_blocking(move || {
            let ok = owned.write(batch.as_bytes(), reopening);
            (owned, batch, ok)
        })
        .await;
        // A join error: the runtime is shutting down.
        let Ok((owned, mut batch, ok)) = written else {
            return;
        };
        if !ok && lines > 0 {
            dropped.inc_by(lines as u64);
        }
        progress
            .done
            .fetch_add(lines as u64, std::sync::atomic::Ordering::AcqRel);
        batch.clear();
        text = batch;
        sink = Some(owned);
    }
}

/// Where the lines go, and the open file.
struct Sink {
    target: AccessLogTarget,
    file: Option<File>,
    /// Whether the last write failed (reported once, until one succeeds).
    failing: bool,
}

impl Sink {
    /// Writes `bytes` (whole lines), reopening the file first if `reopen`; whether they were
    /// written.
    fn write(&mut self, bytes: &[u8], reopen: bool) -> bool {
        let result = match &self.target {
            AccessLogTarget::Stdout => io::stdout().lock().write_all(bytes),
            AccessLogTarget::Stderr => io::stderr().lock().write_all(bytes),
            AccessLogTarget::File(path) => {
                if reopen {
                    self.file = None;
                }
                if bytes.is_empty() && !reopen {
                    return true;
                }
                let file = match self.file.take() {
                    Some(file) => Ok(file),
                    None => OpenOptions::new().create(true).append(true).open(path),
                };
                match file {
                    Ok(mut file) => {
                        let written = file.write_all(bytes);
                        if written.is_ok() {
                            self.file = Some(file);
                        }
                        written
                    }
                    Err(error) => Err(error),
                }
            }
        };
        match result {
            Ok(()) => {
                if self.failing {
                    tracing::info!(target = ?self.target, "access log written again");
                }
                self.failing = false;
                true
            }
            Err(error) => {
                if !self.failing {
                    tracing::warn!(
                        target = ?self.target,
                        %error,
                        "cannot write the access log; its lines are dropped and counted \
                         until it can be reopened"
                    );
                }
                self.failing = true;
                false
            }
        }
    }
}
