//! Most of capataz's end-to-end tests, as modules of one test binary (one link instead of
//! one per file), on the shared scaffolding in `tests/support/`. The fault matrix
//! (`tests/faults.rs`: it counts the process's open files and runs one scenario at a time),
//! the metrics tests (`tests/metrics.rs`: metrics are a process-wide registry today) and the
//! Chromium dashboard test (`tests/dashboard.rs`) are binaries of their own.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod alerts;
mod balancer;
mod cli;
mod config;
mod proxy_edge;
mod replay_cli;
