//! The checks: [`netcm_fuzz::targets::cached_node`]. Typed here so that libFuzzer still keeps bytes that do
//! not decode out of the corpus, and `cargo fuzz fmt` prints the decoded input.
#![no_main]

use netcm_fuzz::targets::cached_node::{run, Input};

libfuzzer_sys::fuzz_target!(|input: Input| run(input));
