//! The checks behind capataz's fuzz targets, one module per target; the targets in
//! `fuzz_targets/` only hand their bytes over. How to run them: `README.md`.
//!
//! `engine`, `replay` and `status` use nothing but `capataz_health` and `std`, so that the
//! bounded proptest smoke test in `crates/capataz-health/tests/fuzz_smoke.rs` includes the very
//! same files by path and `cargo test --workspace` runs these checks without cargo-fuzz.

pub mod admin_query;
pub mod config;
pub mod engine;
pub mod h1;
pub mod replay;
pub mod status;
