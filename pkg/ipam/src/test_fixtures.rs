//! Fixtures the pools' unit tests share: a CIDR from a string, the flag pool of two flags, and how many
//! CIDRs a pool has handed out.

#![allow(clippy::unwrap_used)] // test code, as in the `tests` modules that use it

use ipnet::IpNet;

use crate::config::{AllocatorConfig, AllocatorFlags};
use crate::pools::Pools;

pub(crate) fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

pub(crate) fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| net(s)).collect()
}

/// The pools of `--cluster-cidr=<cluster>` and `--service-cluster-ip-range=<services>`.
pub(crate) fn pools(cluster: &str, services: &str) -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: cluster.to_string(),
        service_cluster_ip_range: services.to_string(),
        ..AllocatorFlags::default()
    };
    Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap()
}

pub(crate) fn allocated(p: &Pools) -> u64 {
    p.stats().iter().map(|s| s.allocated).sum()
}
