//! capataz: a load balancer that keeps its pool honest with active and passive health checks.
//!
//! The health decisions live in the pure `capataz-health` crate; this crate does the IO around
//! them: the command line, the `replay` driver, and (in later modules) the proxy, the prober and
//! the configuration.

pub mod replay;
