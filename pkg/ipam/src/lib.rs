//! Pure CIDR logic for netcm's node IPAM range allocator: no I/O, no
//! Kubernetes types.
//!
//! It re-implements the behaviour of kube-controller-manager's
//! `nodeipam` range allocator:
//!
//! - [`CidrSet`] — the node-sized blocks of one cluster CIDR in a bitmap,
//!   handed out round-robin (like KCM's `cidrset.CidrSet`), with
//!   [`CidrSet::occupy`] / [`CidrSet::release`] for CIDRs of any size, and
//!   [`CidrSet::allocate_next_sized`] for aligned blocks of several sizes over the same bitmap.
//! - [`AllocatorConfig`] — KCM's `--cluster-cidr`, `--node-cidr-mask-size*`
//!   and `--service-cluster-ip-range` rules and messages, extended so a
//!   family may have several cluster CIDRs, tried in the order given.
//! - [`NodeSelector`], [`PoolSpec`] — pools as ClusterCIDR objects
//!   (`networking.x-k8s.io/v1`) describe them: which Nodes, which ranges, which mask.
//! - [`Pools`] — the flag pool ([`DEFAULT_POOL`]) and the ClusterCIDR pools, each a
//!   set of cluster CIDRs, plus a ledger of which node holds which
//!   CIDRs: it allocates one CIDR per family (primary first), records CIDRs
//!   read from the API, reports conflicts, and never hands out a CIDR that
//!   overlaps one a node holds or a service range.
//! - [`prefix_for_pods`], [`NodeSizing`] — per-Node size from capacity (opt-in): the smallest block
//!   holding 2 addresses per pod, within the operator's bounds.
//!
//! ```
//! use netcm_ipam::{AllocatorConfig, AllocatorFlags, Pools};
//!
//! let flags = AllocatorFlags {
//!     cluster_cidr: "10.244.0.0/16,fd00:10::/56".into(),
//!     service_cluster_ip_range: "10.244.255.0/24".into(),
//!     ..AllocatorFlags::default()
//! };
//! let config = AllocatorConfig::from_flags(&flags)?;
//! let mut pools = Pools::new(&config)?;
//! let cidrs = pools.allocate("node-a")?;
//! assert_eq!(cidrs[0].to_string(), "10.244.0.0/24");
//! assert_eq!(cidrs[1].to_string(), "fd00:10::/64");
//! assert_eq!(pools.holder_of(cidrs[0]), Some("node-a"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod addr;
mod cidr_set;
mod config;
mod error;
mod ledger;
mod outcome;
mod pool;
mod pools;
mod problems;
mod selector;
mod sizing;
mod space;
#[cfg(test)]
mod test_fixtures;

pub use addr::Family;
pub use cidr_set::{max_node_bits, Allocation, CidrSet, MAX_NODE_BITS_V4, MAX_NODE_BITS_V6};
pub use config::{
    AllocatorConfig, AllocatorFlags, ConfigError, FamilyPool, SizingFlagError, SizingFlags,
    DEFAULT_MAX_MASK_V4, DEFAULT_NODE_MASK_V4, DEFAULT_NODE_MASK_V6, FLAG_MAX_MASK_V4,
    FLAG_MIN_MASK_V4, FLAG_SIZE_FROM_PODS,
};
pub use error::Error;
pub use outcome::{CidrFinding, NodeAllocation, PoolStats, PoolTries, RecordChange, RecordOutcome};
pub use pool::{
    HostBitsRange, ObjectPool, PoolReport, PoolSpec, PoolState, Refusal, SyncReport, DEFAULT_POOL,
    MIN_PER_NODE_HOST_BITS, SIZE_FROM_PODS_ANNOTATION,
};
pub use pools::{EndedReleaseHold, Pools, ReleaseHoldEnd, ReleaseHoldUse};
pub use problems::{Limits, Overlap, Overlaps, Oversized, Problems};
pub use selector::{Labels, NodeSelector, NodeView, Operator, Requirement, SelectorTerm};
pub use sizing::{prefix_for_pods, NodeSizing, SizingError, ADDRESSES_PER_POD};
pub use space::PoolSpace;
