//! The replay protocol on arbitrary scripts, against a model of it: see `src/replay.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| capataz_fuzz::replay::run(data));
