//! The checks: [`netcm_fuzz::targets::annotation_prefix`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netcm_fuzz::targets::annotation_prefix::check(data));
