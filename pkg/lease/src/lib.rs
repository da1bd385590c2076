//! flannel's kube-subnet-manager lease format, shared by the controllers that write it
//! (node-annotation-syncer) and read it (route-controller): the annotation keys under a prefix, derived
//! with flannel's `--kube-annotation-prefix` rules and checked to be keys the API server accepts, and the
//! one rule for what may be a Node's public IP. Pure.

pub mod address;
pub mod keys;

pub use address::{public_ip, Family, Unusable};
pub use keys::{Keys, PrefixError};
