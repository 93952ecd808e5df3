//! The config loader on arbitrary text: see `src/config.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| capataz_fuzz::config::run(data));
