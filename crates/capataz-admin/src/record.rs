//! `GET /record/<pool>`: the probe and traffic outcomes of a running pool, with their latencies
//! and times, streamed in the replay protocol (`capataz replay` reads the stream as it is).
//!
//! The stream starts with a comment, `AT <now>` and `POOL <backends>`, then writes each record
//! as it comes (`AT <ms>` whenever the engine clock moved, then `PROBE`, `TRAFFIC` or `SHED`).
//! Memory is bounded whatever the reader does: records wait in the pool's tap (at most
//! [`tap::CAPACITY`](crate::balance::tap::CAPACITY)), then in a few frames of the response
//! body; a reader that falls behind loses the oldest records, and the stream says how many in
//! a `# dropped` comment. At most [`tap::MAX_RECORDERS`](crate::balance::tap::MAX_RECORDERS)
//! record one pool at once (503 beyond). The stream ends when the pool is replaced by a reload
//! (saying so), when the balancer stops, or when the reader goes away.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use capataz_health::replay::answer;
use http::{header, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;

use super::{error, Body};
use crate::balance::tap::{self, Next, Recorded};
use crate::health::PoolRt;
use crate::supervisor::Supervisor;

/// How many records one body frame holds at most.
const BATCH: usize = 512;

/// How often an idle stream checks that its pool is still the one in force.
const CHECK: Duration = Duration::from_secs(1);

/// A backend name as one word of the protocol: spaces and control bytes become `_`.
fn word(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// A latency as the protocol writes it: milliseconds with three fraction digits.
fn millis(latency: Duration) -> String {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    format!("{}.{:03}", us / 1000, us % 1000)
}

pub(super) fn record(supervisor: &Arc<Supervisor>, name: &str) -> Response<Body> {
    let Some(pool) = supervisor.pool(name) else {
        return error(StatusCode::NOT_FOUND, format!("no pool named {name:?}"));
    };
    let mut recorder = match pool.handle().tap.subscribe() {
        Ok(recorder) => recorder,
        Err(tap::TooManyRecorders) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "pool {name:?} already has {} recorders, the most it serves at once",
                    tap::MAX_RECORDERS
                ),
            )
        }
    };
    let weak: Weak<Supervisor> = Arc::downgrade(supervisor);
    let mut shutdown = supervisor.shutdown_signal();
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tokio::spawn(async move {
        let clock = pool.clock();
        let names: Vec<String> = pool.backends.iter().map(|b| word(&b.name)).collect();
        let mut last = clock.now().as_millis();
        let mut text = format!(
            "# capataz record: pool {}, in the replay protocol (capataz replay reads it)\nAT {last}\nPOOL {}\n",
            word(&pool.name),
            names.join(" ")
        );
        loop {
            if !text.is_empty() {
                let frame = Frame::data(Bytes::from(std::mem::take(&mut text)));
                if tx.send(Ok(frame)).await.is_err() {
                    return;
                }
            }
            let next = tokio::select! {
                next = recorder.recv() => next,
                _ = tokio::time::sleep(CHECK) => {
                    // A reader that left frees its place even while nothing happens.
                    if tx.is_closed() {
                        return;
                    }
                    if !still_in_force(&weak, &pool) {
                        text.push_str("# the pool was replaced by a reload: recording ends\n");
                        let _ = tx.send(Ok(Frame::data(Bytes::from(text)))).await;
                        return;
                    }
                    continue;
                }
                _ = shutdown.changed() => return,
            };
            let mut next = Some(next);
            let mut written = 0;
            while let Some(item) = next.take() {
                match item {
                    Next::Record(record) => {
                        let ms = clock.at(record.at).as_millis();
                        // Records from several threads may arrive a little out of order:
                        // the clock never goes back in the log.
                        if ms > last {
                            last = ms;
                            let _ = writeln!(text, "AT {ms}");
                        }
                        let name = names.get(record.backend).map_or("?", String::as_str);
                        let _ = match record.what {
                            Recorded::Probe(outcome) => {
                                writeln!(text, "PROBE {name} {}", answer(outcome))
                            }
                            Recorded::Traffic { outcome, latency } => writeln!(
                                text,
                                "TRAFFIC {name} {} {}",
                                latency.map_or_else(|| "-".to_owned(), millis),
                                answer(outcome)
                            ),
                            Recorded::Shed {
                                status,
                                latency,
                                relief,
                            } => writeln!(
                                text,
                                "SHED {name} {} {status} {}",
                                millis(latency),
                                relief.as_millis()
                            ),
                        };
                    }
                    Next::Dropped(n) => {
                        let _ = writeln!(
                            text,
                            "# dropped {n} records: this reader fell behind by more than {}; \
                             a replay of this log misses them",
                            tap::CAPACITY
                        );
                    }
                    Next::Closed => {
                        text.push_str("# the pool was replaced by a reload: recording ends\n");
                        let _ = tx.send(Ok(Frame::data(Bytes::from(text)))).await;
                        return;
                    }
                }
                written += 1;
                if written < BATCH {
                    next = recorder.try_recv();
                }
            }
        }
    });
    let mut response = Response::new(BodyExt::boxed(super::pages::StreamBody(body_rx)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// Whether `pool` is still the pool of its name in the balancer.
fn still_in_force(supervisor: &Weak<Supervisor>, pool: &Arc<PoolRt>) -> bool {
    supervisor
        .upgrade()
        .and_then(|supervisor| supervisor.pool(&pool.name))
        .is_some_and(|current| Arc::ptr_eq(&current, pool))
}
