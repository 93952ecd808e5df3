//! capataz's reading of a backend's answer on arbitrary bytes: see `src/h1.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| capataz_fuzz::h1::check(data));
