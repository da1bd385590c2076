//! The checks: [`netcm_fuzz::targets::duration`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netcm_fuzz::targets::duration::check(data));
