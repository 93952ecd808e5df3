//! End-to-end tests of the answers capataz writes at the edge and of the latency-aware
//! choice: custom error pages (`error_pages`), local rate limits (`rate_limit`) and peak EWMA
//! (`algorithm = "peak_ewma"`), on loopback with scripted backends. Waits are on answers,
//! events and counts with generous deadlines, never on fixed sleeps.

mod error_pages;
mod peak_ewma;
mod rate_limit;

use crate::support::balancer::{backends, start, ConfigText, FAST_CHECKS};
use crate::support::client::Client;
use crate::support::events::wait_for;
use crate::support::prometheus::TempDir;
