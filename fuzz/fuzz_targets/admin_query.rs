//! An override's query string and a duration, on arbitrary text: see `src/admin_query.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| capataz_fuzz::admin_query::run(data));
