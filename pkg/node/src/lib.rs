//! What a Node says about networking, read one way by every controller and by `netcm check`: the
//! address [`Family`] (one definition, `netcm-ipam`'s), the Node's pod CIDRs ([`PodCidrs`], with a
//! typed [`UnparsableCidr`]), flannel's kube-subnet-manager lease keys under a prefix ([`Keys`],
//! flannel's `--kube-annotation-prefix` rules, checked to be keys the API server accepts), the one
//! rule for what may be a Node's public IP ([`public_ip`], [`first_address`]), which the syncer
//! publishes by and the route controller routes by, and [`CachedNode`], the compact form the shared
//! informer caches and every controller reads. Pure: no API, no clock.

pub mod address;
pub mod cached;
pub mod keys;
pub mod pod_cidrs;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use address::{first_address, public_ip, Unusable};
pub use cached::{
    owned_annotation_keys, Address, CachedNode, CachedNodeBuilder, Condition, PodCidr, Taint,
};
pub use keys::{Keys, PrefixError};
pub use netcm_ipam::Family;
pub use pod_cidrs::{parse_pod_cidr, pick_pod_cidrs, raw_pod_cidrs, PodCidrs, UnparsableCidr};
