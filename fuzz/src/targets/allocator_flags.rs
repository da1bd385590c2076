//! The allocator's flags: `--cluster-cidr`, `--node-cidr-mask-size(-ipv4|-ipv6)` and
//! `--service-cluster-ip-range`, as kube-controller-manager's rules read them. An accepted
//! configuration has masks within bounds for every cluster CIDR, disjoint normalised cluster CIDRs,
//! at most one service range per family; written back as flags it reads as itself; and the pools built
//! from it hand a Node one CIDR per family, of the family's mask, inside a cluster CIDR, clear of
//! every service range.

use crate::CidrText;
use arbitrary::Arbitrary;
use ipnet::IpNet;
use netcm_ipam::{max_node_bits, AllocatorConfig, AllocatorFlags, Family, Pools};

#[derive(Debug, Arbitrary)]
enum List {
    /// Entries joined by `,`, each with the padding given.
    Entries(Vec<(CidrText, bool)>),
    Raw(String),
}

impl List {
    fn text(&self) -> String {
        match self {
            List::Entries(e) => e
                .iter()
                .map(|(c, pad)| {
                    if *pad {
                        format!(" {c} ")
                    } else {
                        c.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(","),
            List::Raw(s) => s.clone(),
        }
    }
}

/// What libFuzzer's bytes decode to.
#[derive(Debug, Arbitrary)]
pub struct Input {
    cluster_cidr: List,
    node_cidr_mask_size: Option<u8>,
    node_cidr_mask_size_ipv4: Option<u8>,
    node_cidr_mask_size_ipv6: Option<u8>,
    service_cluster_ip_range: List,
}

fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The checks, on one decoded input.
pub fn run(input: Input) {
    let flags = AllocatorFlags {
        cluster_cidr: input.cluster_cidr.text(),
        node_cidr_mask_size: input.node_cidr_mask_size,
        node_cidr_mask_size_ipv4: input.node_cidr_mask_size_ipv4,
        node_cidr_mask_size_ipv6: input.node_cidr_mask_size_ipv6,
        service_cluster_ip_range: input.service_cluster_ip_range.text(),
    };
    let Ok(config) = AllocatorConfig::from_flags(&flags) else {
        return;
    };
    assert!(!config.families.is_empty() && config.families.len() <= 2);
    let first: IpNet = flags
        .cluster_cidr
        .split(',')
        .next()
        .unwrap_or("")
        .trim()
        .parse()
        .expect("first entry");
    assert_eq!(config.primary_family(), Some(Family::of(&first)));
    let all: Vec<IpNet> = config
        .families
        .iter()
        .flat_map(|f| f.cluster_cidrs.clone())
        .collect();
    for f in &config.families {
        assert!(!f.cluster_cidrs.is_empty());
        assert!(f.node_mask <= f.family.bits(), "{f:?}");
        for c in &f.cluster_cidrs {
            assert_eq!(Family::of(c), f.family);
            assert_eq!(*c, c.trunc());
            assert!(
                c.prefix_len() <= f.node_mask,
                "{c} longer than /{}",
                f.node_mask
            );
            assert!(f.node_mask - c.prefix_len() <= max_node_bits(f.family));
        }
    }
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert!(!overlap(a, b), "{a} and {b} overlap");
        }
    }
    assert!(config.service_ranges.len() <= 2);
    if let [a, b] = config.service_ranges[..] {
        assert_ne!(Family::of(&a), Family::of(&b));
    }

    // Written back as flags, the configuration reads as itself.
    let text = |nets: &[IpNet]| {
        nets.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let mask = |family: Family| {
        config
            .families
            .iter()
            .find(|f| f.family == family)
            .map(|f| f.node_mask)
    };
    let again = AllocatorFlags {
        cluster_cidr: text(&all),
        node_cidr_mask_size: None,
        node_cidr_mask_size_ipv4: mask(Family::V4),
        node_cidr_mask_size_ipv6: mask(Family::V6),
        service_cluster_ip_range: text(&config.service_ranges),
    };
    assert_eq!(
        AllocatorConfig::from_flags(&again),
        Ok(config.clone()),
        "{again:?}"
    );

    let mut pools = Pools::new(&config).expect("pools from a valid configuration");
    let Ok(cidrs) = pools.allocate("node") else {
        return;
    };
    assert_eq!(cidrs.len(), config.families.len());
    for (cidr, f) in cidrs.iter().zip(&config.families) {
        assert_eq!(Family::of(cidr), f.family);
        assert_eq!(cidr.prefix_len(), f.node_mask);
        assert!(
            f.cluster_cidrs.iter().any(|c| c.contains(cidr)),
            "{cidr} outside {f:?}"
        );
        for s in &config.service_ranges {
            assert!(!overlap(cidr, s), "{cidr} overlaps the service range {s}");
        }
    }
    assert_eq!(pools.holder_of(cidrs[0]), Some("node"));
}

/// The checks, on one input as libFuzzer hands it over: [`run`] on what it decodes to, decoded as
/// `fuzz_target!` decodes it ([`crate::arbitrary_input`]).
pub fn check(data: &[u8]) {
    if let Some(input) = crate::arbitrary_input(data) {
        run(input);
    }
}
