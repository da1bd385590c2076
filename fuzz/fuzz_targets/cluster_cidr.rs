//! The checks: [`netcm_fuzz::targets::cluster_cidr`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netcm_fuzz::targets::cluster_cidr::check(data));
