//! TLS with rustls on the ring provider: `client`, capataz as a TLS client of its backends.

pub mod client;
