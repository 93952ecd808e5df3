//! Unix domain sockets end to end: backends on a socket file (`backends.rs`), listeners on
//! one (`listeners.rs`); the config's refusals are in `config/unix_addresses.rs`.

mod backends;
mod listeners;
