//! The checks: [`netcm_fuzz::targets::effective_configuration`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    |data: &[u8]| netcm_fuzz::targets::effective_configuration::check(data)
);
