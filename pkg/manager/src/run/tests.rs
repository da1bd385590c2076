//! The main sequence's error messages, with their whole source chain.

use std::error::Error as _;

use super::*;
use crate::controller::InitError;

#[derive(Debug, thiserror::Error)]
#[error("reading the pool: {0}")]
struct PoolError(#[source] std::io::Error);

#[test]
fn a_failed_init_names_the_controller_and_keeps_the_whole_source_chain() {
    let err = RunError::Init {
        name: "subnet-allocator",
        source: InitError::new(PoolError(std::io::Error::other("disk gone"))),
    };
    assert_eq!(
        err.to_string(),
        "initializing controller subnet-allocator: reading the pool: disk gone"
    );
    let mut chain = Vec::new();
    let mut next = err.source();
    while let Some(e) = next {
        chain.push(e.to_string());
        next = e.source();
    }
    assert_eq!(chain, ["reading the pool: disk gone", "disk gone"]);
}
