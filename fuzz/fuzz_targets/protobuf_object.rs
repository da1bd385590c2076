//! The checks: [`netcm_fuzz::targets::protobuf_object`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netcm_fuzz::targets::protobuf_object::check(data));
