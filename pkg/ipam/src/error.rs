//! Errors of CIDR sets and pools (configuration errors live in [`crate::config`]).

use ipnet::IpNet;

use crate::addr::{join_nets, Family};

/// An error from a [`crate::CidrSet`] or [`crate::Pools`] operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The node mask is shorter than the cluster CIDR's prefix.
    #[error(
        "Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or \
         equal to --node-cidr-mask-size configured for CIDR family (cluster CIDR {cluster}, \
         node mask /{node_mask})"
    )]
    NodeMaskSmallerThanCluster {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The requested node mask size.
        node_mask: u8,
    },

    /// The node mask is longer than an address of the family.
    #[error(
        "New CIDR set failed; node mask /{node_mask} is longer than an {family} address \
         ({} bits)", .family.bits()
    )]
    NodeMaskTooLong {
        /// Family of the cluster CIDR.
        family: Family,
        /// The requested node mask size.
        node_mask: u8,
    },

    /// Too many node CIDRs would fit in the cluster CIDR to track them.
    #[error(
        "New CIDR set failed; the node CIDR size is too big: node mask /{node_mask} is {} bits \
         longer than cluster CIDR {cluster}, at most {max_diff} allowed for {}",
        .node_mask.saturating_sub(.cluster.prefix_len()), Family::of(.cluster)
    )]
    NodeCidrTooBig {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The requested node mask size.
        node_mask: u8,
        /// Largest allowed difference between node mask and cluster prefix.
        max_diff: u8,
    },

    /// Every node CIDR of the family's cluster CIDRs is taken.
    #[error(
        "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted \
         range ({family} cluster CIDRs: {})", join_nets(.clusters)
    )]
    Full {
        /// The exhausted family.
        family: Family,
        /// The cluster CIDRs of that family, all full.
        clusters: Vec<IpNet>,
    },

    /// A cluster CIDR sized from capacity has no free block of the size the Node needs (smaller ones may
    /// be free: fragmentation). KCM's wording first, so what matches [`Error::Full`]'s text matches it.
    #[error(
        "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted \
         range ({family} cluster CIDRs: {}): no free /{prefix_len} block", join_nets(.clusters)
    )]
    NoBlockOfSize {
        /// The family.
        family: Family,
        /// The size the Node needs.
        prefix_len: u8,
        /// The cluster CIDRs of that family in the pool, none with such a block free.
        clusters: Vec<IpNet>,
    },

    /// Every pool selecting the Node is full.
    #[error(
        "CIDR allocation failed; every pool that selects the node is full (pools: {})",
        .pools.join(", ")
    )]
    PoolsFull {
        /// The pools tried, most preferred first.
        pools: Vec<String>,
    },

    /// No active pool selects the Node.
    #[error("CIDR allocation failed; no active pool selects node {node}")]
    NoPool {
        /// The Node.
        node: String,
    },

    /// The Node re-joins as a deleted Node whose release hold still runs, and its held CIDRs are still a
    /// valid allocation for it but for what other owners reserve over them (a new leader's quarantine of
    /// earlier leaders' blocks): the hold runs on, for the caller to end the reservation and ask again, or
    /// to hand the Node new CIDRs past its hold ([`crate::Pools::allocate_sized_past_hold`]).
    #[error(
        "the pod CIDRs {released_by} held ({}) are kept for node {node}, but {} reserve(s) them for now",
        join_nets(.cidrs), .by.join(", ")
    )]
    ReleaseHoldReserved {
        /// The Node re-joining.
        node: String,
        /// The held Node it re-joins as.
        released_by: String,
        /// The held CIDRs.
        cidrs: Vec<IpNet>,
        /// The owners reserving some of them.
        by: Vec<String>,
    },

    /// A block size a [`crate::CidrSet`] cannot hand out: larger than its cluster CIDR or smaller than
    /// its node mask (the smallest size of a pool sized from capacity).
    #[error(
        "a /{prefix_len} block cannot be handed out of cluster CIDR {cluster}: sizes run from \
         /{} to /{node_mask}", .cluster.prefix_len()
    )]
    SizeOutsideSet {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The set's node mask (its smallest block).
        node_mask: u8,
        /// The size asked for.
        prefix_len: u8,
    },

    /// A CIDR shares no address with the cluster CIDR.
    #[error("cidr {cidr} is out the range of cluster cidr {cluster}")]
    OutOfRange {
        /// The offending CIDR.
        cidr: IpNet,
        /// The cluster CIDR it was checked against.
        cluster: IpNet,
    },
}
