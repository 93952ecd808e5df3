//! capataz's request path below the proxy: keep-alive connections to backends and the
//! exchanges on them (`upstream`), a pool's side of the request path and the pick
//! (`balance`), the bodies streamed both ways (`body`), the retry budget (`budget`), routes' rate limits (`rate_limit`), the
//! access log (`access_log`), the metric handles they update (`instruments`), the request path's mutexes
//! (`lockstat`, counted for the contention test), typed enums in atomics (`atomic_enum`), the one internal HTTP/1.1 client (`oneshot`), and
//! writes put off to the end of the runtime's turn (`turn`) and sent there by the worker's
//! flusher (`outbox`).
//!
//! It imports the configuration, TLS and the engine's types, never the health runtime: Cargo
//! keeps it below `capataz`, which re-exports these modules under the same names.

pub mod access_log;
pub mod atomic_enum;
pub mod balance;
pub mod body;
pub mod budget;
pub mod client_body;
pub mod instruments;
pub mod lockstat;
pub mod oneshot;
pub mod outbox;
pub mod rate_limit;
pub mod turn;
pub mod upstream;
