//! netcm's own API kinds (the chart's CRDs under `charts/netcm/crds/`) as Rust types: the fields their
//! objects hold on the wire, and the rules that more than one controller reads them by, so that a
//! controller that writes a kind and one that only reads it agree without sharing code of either.
//!
//! Start at [`pod_cidr_migration`]: the PodCIDRMigration kind, written by the `pod-cidr-migration`
//! controller and read by the `subnet-allocator`, which gives out no new CIDR from the pools a running
//! migration leaves ([`pod_cidr_migration::open_pool`]).

pub mod pod_cidr_migration;
