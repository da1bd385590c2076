//! [`State`]: everything of the allocator that changes, in one place behind one lock
//! ([`crate::allocator::Allocator`] states the locking rule).

use std::collections::{BTreeMap, HashMap};

use netcm_ipam::Pools;

use crate::bad_data::BadData;
use crate::blocks::Blocks;
use crate::tracking::Tracking;
use crate::waiting::Waiting;

/// The allocator's mutable data. Plain data with no lock of its own: the allocator keeps all of it
/// behind its one `state` mutex, so its parts have no lock order — code that needs two of them borrows
/// two fields of one guard.
pub(crate) struct State {
    /// The ledger: every CIDR handed out, held or reserved, by Node UID.
    pub(crate) pools: Pools,
    /// The blocks this leader may hand CIDRs out of, and the quarantine on earlier leaders' blocks.
    pub(crate) blocks: Blocks,
    /// Which Node name each ledger record belongs to.
    pub(crate) tracking: Tracking,
    /// Nodes waiting for a CIDR to be released; those a released CIDR could serve are requeued at once.
    pub(crate) waiting: Waiting,
    /// The labels of waiting Nodes, as read when they were allocated, while a pool selects by label
    /// (for the ClusterCIDR status's count of waiting Nodes per pool).
    pub(crate) waiting_labels: HashMap<String, BTreeMap<String, String>>,
    /// Nodes whose pod CIDRs are currently bad data (for `netcm_node_cidr_conflicts` and
    /// `netcm_node_cidr_oversized`), and when their Events were published.
    pub(crate) bad_data: BadData,
    /// Each Node's `spec.providerID`, by name, kept only with a release hold (`--cidr-release-hold`): a
    /// deleted Node is gone from the cache, and its hold answers a Node that comes back on its machine.
    pub(crate) provider_ids: HashMap<Box<str>, Box<str>>,
}

impl State {
    /// The state of a leader that has recorded nothing yet, allocating from `pools`.
    pub(crate) fn new(pools: Pools) -> Self {
        Self {
            pools,
            blocks: Blocks::default(),
            tracking: Tracking::default(),
            waiting: Waiting::default(),
            waiting_labels: HashMap::new(),
            bad_data: BadData::default(),
            provider_ids: HashMap::new(),
        }
    }
}
