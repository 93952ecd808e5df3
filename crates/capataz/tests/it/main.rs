//! Most of capataz's end-to-end tests, as modules of one test binary (one link instead of
//! one per file), on the shared scaffolding in `tests/support/`. The fault matrix
//! (`tests/faults.rs`: it counts the process's open files and runs one scenario at a time)
//! and the Chromium dashboard test (`tests/dashboard.rs`) are binaries of their own. Metrics
//! are registered per balancer, so the metrics tests run here beside the others.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod alerts;
mod balancer;
mod cli;
mod config;
mod metrics;
mod module_graph;
mod proxy_edge;
mod replay_cli;
