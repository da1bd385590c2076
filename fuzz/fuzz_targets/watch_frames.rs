//! The checks: [`netcm_fuzz::targets::watch_frames`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netcm_fuzz::targets::watch_frames::check(data));
