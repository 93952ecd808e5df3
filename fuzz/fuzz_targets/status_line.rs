//! `parse_status_line` and `Outcome::parse` on arbitrary bytes: see `src/status.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| capataz_fuzz::status::check(data));
