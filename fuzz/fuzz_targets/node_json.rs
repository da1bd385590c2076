//! The checks: [`netcm_fuzz::targets::node_json`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netcm_fuzz::targets::node_json::check(data));
