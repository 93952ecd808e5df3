//! A pool driven by arbitrary calls, with its invariants checked after each: see `src/engine.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| capataz_fuzz::engine::run(data));
