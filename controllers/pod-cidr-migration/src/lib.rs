//! Re-numbering a live cluster: every selected Node moves from the pools it holds CIDRs from (the
//! *origins*) to one pool (the *destination*) — a new cluster range, a new per-Node size or a second
//! family are each just a destination pool (a ClusterCIDR) — Node by Node, while the rest of the pod
//! network stays up.
//!
//! Start reading at [`plan::plan`]: given what the operator asked ([`plan::Spec`]), what the API shows
//! of each Node ([`plan::NodeFacts`]) and how far each moving Node has come ([`plan::Progress`], which
//! lives in the API so a new leader resumes where the last stopped), it says what to do next
//! ([`plan::Action`]) and where the migration stands ([`plan::Phase`]). It is pure: no I/O and no clock
//! of its own, so every rule below is a unit test.
//!
//! Why a Node moves by leaving and coming back: `spec.podCIDRs` cannot change once set, not even to add
//! a family, so a Node gets CIDRs from the destination only by being deleted and registering again —
//! its pods evicted first (the Eviction API, so PodDisruptionBudgets hold), the kubelet's restart being
//! the node's own step. While a migration runs the origins give out nothing new, so a Node that
//! registers again can only be served from the destination; a Node that comes back with CIDRs from
//! anywhere else stops the migration.
//!
//! The rules, each a test in `plan/tests.rs`:
//! - at most `max_unavailable` Nodes are out of service at once (draining or re-registering), started
//!   in name order;
//! - a drain that outlasts its timeout, or a Node that does not come back with CIDRs from the
//!   destination in time, fails that Node: it is put back in service if it still runs (uncordoned), and
//!   no further Node starts until an operator looks (the migration is *stalled*);
//! - a rollback turns the direction around: Nodes still draining are put back in service, Nodes
//!   already deleted finish coming back (now served by the origin), and every Node that reached the
//!   destination moves back the same way;
//! - a Node is done when every CIDR it holds comes from the destination and it has one of each family
//!   the destination gives, whether it moved or registered there to begin with.
//!
//! Not here yet: the controller that carries the actions out against the API (cordon, evictions,
//! delete, status), the pools' closing to new allocations while a migration runs, and the
//! PodCIDRMigration API that holds [`plan::Spec`] and [`plan::Progress`].

pub mod plan;
