//! `MODE=sizing`: what per-Node size from capacity (`--node-cidr-size-from-pods`) saves in
//! address space and what it costs in allocation time, on a realistic mix of max-pods.
//!
//! Two contenders, each on a fresh backlog of the same N Nodes (the same seeded mix of pod capacities,
//! each Node ~8 KB as in the default mode) under the same cluster CIDR: netcm at a fixed /24 and netcm
//! sizing each Node's CIDR from `status.capacity.pods` between /24 and /28 (default /24). ROUNDS times,
//! the order alternating (the first contender of a round meets a warmer API server). Per contender:
//! the allocation time as the default mode measures it, then, read back from the API, the addresses
//! its Node CIDRs hold, the histogram of their prefixes, whether each is the size the rule says, and
//! that no two overlap; and how many of these Nodes fit in a /16, estimated (65,536 ÷ mean addresses)
//! and exact (the same mix in order through netcm-ipam's `Pools`, alignment and all).

use std::collections::BTreeMap;

use kube::api::{Api, ListParams};
use netcm_ipam::{
    prefix_for_pods, AllocatorConfig, AllocatorFlags, Family, NodeView, Pools, SizingFlags,
};

use crate::contenders::{allocate_backlog, netcm, reset, set_name, Row};
use crate::fixtures::{create_shaped_nodes, Shape, SET_LABEL};
use crate::set_watch::SlimNode;
use crate::summary::median;
use crate::Config;

/// The sized contender's bounds: at most a /24 (what the fixed contender gives every Node, so no Node
/// gets more than before) and at least a /28 (netcm's default smallest block, 8 pods).
const LARGEST: u8 = 24;
const SMALLEST: u8 = 28;

/// One class of Nodes in the mix: its share in percent, the shapes it is drawn from (evenly) and where
/// the numbers come from.
struct Class {
    share: u64,
    shapes: &'static [Shape],
    source: &'static str,
}

const fn shape(pods: u32, instance_type: &'static str) -> Shape {
    Shape {
        pods,
        instance_type,
    }
}

/// The max-pods spread of a fleet mixing self-managed and managed-cloud Nodes. Where the numbers come
/// from:
/// - 110 is kubelet's default `--max-pods`, GKE Standard's default max pods per Node, AKS kubenet's
///   default, and EKS's cap for instances under 30 vCPUs (an m5.4xlarge allows 8 ENIs × (30 − 1) + 2 =
///   234 by the VPC CNI's formula; EKS recommends 110 below 30 vCPUs, and its max-pods calculator
///   says 110 for it with prefix delegation). The largest share: self-managed clusters and GKE
///   Standard keep the default.
/// - EKS by ENI, ENIs × (IPv4 per ENI − 1) + 2: m5.xlarge and m5.2xlarge 4 × 14 + 2 = 58; GKE node
///   pools set `--max-pods-per-node=64` to halve their per-Node range.
/// - m5.large 3 × 9 + 2 = 29 (EKS); AKS with Azure CNI (not overlay) defaults to 30; GKE Autopilot
///   runs at most 32 pods per Node.
/// - t3.medium 3 × 5 + 2 = 17 (EKS): the common small general-purpose instance.
/// - Small Nodes: EKS t3.small 3 × 3 + 2 = 11; GKE's smallest `--max-pods-per-node` settings, 8 and 16.
///
/// AKS overlay's 250 is left out: under /24../28 it gets a /24 like 110 (more than 128 pods are clamped
/// to the largest block), so it would only grow the first class. The shares are a judgement, not a
/// survey: a third at the default, the rest spread over the managed clouds' ENI- and range-bound limits.
const MIX: [Class; 5] = [
    Class {
        share: 30,
        shapes: &[shape(110, "m5.4xlarge")],
        source: "kubelet default; GKE Standard; AKS kubenet; EKS cap",
    },
    Class {
        share: 20,
        shapes: &[
            shape(58, "m5.xlarge"),
            shape(58, "m5.2xlarge"),
            shape(64, "n2-standard-8"),
        ],
        source: "EKS m5.xlarge / m5.2xlarge by ENI; GKE max-pods-per-node 64",
    },
    Class {
        share: 25,
        shapes: &[
            shape(29, "m5.large"),
            shape(30, "Standard_D4s_v5"),
            shape(32, "ek-standard-8"),
        ],
        source: "EKS m5.large by ENI; AKS Azure CNI default; GKE Autopilot",
    },
    Class {
        share: 15,
        shapes: &[shape(17, "t3.medium")],
        source: "EKS t3.medium by ENI",
    },
    Class {
        share: 10,
        shapes: &[
            shape(8, "e2-small"),
            shape(11, "t3.small"),
            shape(16, "e2-medium"),
        ],
        source: "EKS t3.small by ENI; GKE max-pods-per-node 8 / 16",
    },
];

/// splitmix64: a seeded, portable hash, so the mix is the same on every machine and every run.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The class and shape of Node `i` for `seed`: drawn by share, not dealt in blocks, so any prefix of
/// the Nodes (the in-process /16 fill takes one) has the mix's proportions.
fn draw(seed: u64, i: usize) -> (usize, Shape) {
    let h = splitmix64(seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut pick = h % 100;
    for (k, class) in MIX.iter().enumerate() {
        if pick < class.share {
            let shapes = class.shapes;
            return (k, shapes[((h >> 32) % shapes.len() as u64) as usize]);
        }
        pick -= class.share;
    }
    unreachable!("the shares add up to 100")
}

/// The prefix the sized contender must give a Node of `pods`.
fn sized_prefix(pods: u32) -> u8 {
    prefix_for_pods(u64::from(pods), Family::V4, LARGEST, SMALLEST)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sizing {
    Fixed,
    FromPods,
}

impl Sizing {
    fn label(self) -> &'static str {
        match self {
            Sizing::Fixed => "netcm fixed /24 (--node-cidr-mask-size=24)",
            Sizing::FromPods => "netcm sized from pods (/24../28, default /24)",
        }
    }

    fn args(self) -> Vec<String> {
        let mut args = vec!["--node-cidr-mask-size=24".to_string()];
        if self == Sizing::FromPods {
            args.extend([
                "--node-cidr-size-from-pods".to_string(),
                format!("--node-cidr-mask-size-ipv4-min={LARGEST}"),
                format!("--node-cidr-mask-size-ipv4-max={SMALLEST}"),
            ]);
        }
        args
    }

    /// The prefix this contender must hand a Node of `pods`.
    fn expected(self, pods: u32) -> u8 {
        match self {
            Sizing::Fixed => LARGEST,
            Sizing::FromPods => sized_prefix(pods),
        }
    }
}

/// What the Node CIDRs of one run hold, read back from the API.
struct Space {
    nodes: usize,
    addresses: u64,
    /// Prefix length → Nodes.
    histogram: BTreeMap<u8, usize>,
    /// Nodes whose CIDR is not the size [`Sizing::expected`] says.
    wrong_size: usize,
    /// From the lowest address of any Node CIDR to the highest: with blocks of several sizes, alignment
    /// and claim blocks of one size each leave holes that `addresses` does not count.
    spanned: u64,
}

impl Space {
    fn mean(&self) -> f64 {
        self.addresses as f64 / self.nodes.max(1) as f64
    }
}

/// Lists the Nodes of `set` (500 a page, the slim view), checks them and sums their address space.
/// Panics when a Node has no IPv4 CIDR or two Nodes' CIDRs overlap: "never a duplicate" holds at any
/// size, and a benchmark that measured a broken allocation would mislead.
async fn read_space(client: &kube::Client, set: &str, sizing: Sizing, seed: u64) -> Space {
    let api: Api<SlimNode> = Api::all(client.clone());
    let mut held: Vec<(ipnet::IpNet, String)> = Vec::new();
    let mut lp = ListParams::default()
        .labels(&format!("{SET_LABEL}={set}"))
        .limit(500);
    loop {
        let page = api.list(&lp).await.expect("list the set's Nodes");
        for node in &page.items {
            let cidr = node
                .pod_cidrs()
                .iter()
                .filter_map(|c| c.parse::<ipnet::IpNet>().ok())
                .find(|c| matches!(c, ipnet::IpNet::V4(_)))
                .unwrap_or_else(|| panic!("{} has no IPv4 pod CIDR", node.name()));
            held.push((cidr, node.name().to_string()));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    if let Some(((a, an), (b, bn))) =
        netcm_e2e::overlaps::overlapping_pairs(held.iter().map(|(c, n)| (*c, n.clone()))).first()
    {
        panic!("{an} holds {a} and {bn} holds {b}: they overlap");
    }
    let mut space = Space {
        nodes: held.len(),
        addresses: 0,
        histogram: BTreeMap::new(),
        wrong_size: 0,
        spanned: 0,
    };
    let ends = held.iter().filter_map(|(c, _)| match c {
        ipnet::IpNet::V4(v4) => Some((u32::from(v4.network()), u32::from(v4.broadcast()))),
        ipnet::IpNet::V6(_) => None,
    });
    if let (Some(lo), Some(hi)) = (
        ends.clone().map(|(lo, _)| lo).min(),
        ends.map(|(_, hi)| hi).max(),
    ) {
        space.spanned = u64::from(hi) - u64::from(lo) + 1;
    }
    for (cidr, name) in &held {
        let prefix = cidr.prefix_len();
        space.addresses += 1u64 << (32 - u32::from(prefix));
        *space.histogram.entry(prefix).or_default() += 1;
        // Node names end in their index (`fixtures::node_name`): the index gives back its pods.
        let i: usize = name
            .rsplit('-')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap();
        if prefix != sizing.expected(draw(seed, i).1.pods) {
            space.wrong_size += 1;
        }
    }
    space
}

/// How many Nodes of the mix fit in one /16, allocated in index order by netcm-ipam's `Pools`: exact,
/// with alignment and the round-robin scan the allocator uses. Two counts: the Nodes before the first
/// that does not fit (the mix as it comes), and all that fit when the ones refused are skipped and the
/// mix goes on (smaller blocks still fill the holes larger ones cannot use).
fn fit_in_slash16(sizing: Sizing, seed: u64) -> (usize, usize) {
    let flags = AllocatorFlags {
        cluster_cidr: "10.0.0.0/16".into(),
        node_cidr_mask_size: Some(LARGEST),
        ..AllocatorFlags::default()
    };
    let sized = sizing == Sizing::FromPods;
    let config = AllocatorConfig::from_flags(&flags)
        .and_then(|c| {
            c.with_sizing(&SizingFlags {
                size_from_pods: sized,
                min_mask_ipv4: sized.then_some(LARGEST),
                max_mask_ipv4: sized.then_some(SMALLEST),
            })
        })
        .expect("a /16 with /24../28 is a valid configuration");
    let mut pools = Pools::new(&config).expect("pools of a valid configuration");
    let labels = BTreeMap::<String, String>::new();
    let (mut before_refusal, mut with_skips) = (None, 0);
    // A /16 holds 4,096 /28s at most: 16 × as many Nodes of the mix is past the point where every size
    // it asks for is refused.
    for i in 0..65_536 {
        let name = format!("fit-{i}");
        let view = NodeView {
            name: &name,
            labels: &labels,
            provider_id: None,
        };
        let pods = u64::from(draw(seed, i).1.pods);
        if pools.allocate_sized_for(&name, &view, Some(pods)).is_ok() {
            with_skips += 1;
        } else if before_refusal.is_none() {
            before_refusal = Some(i);
        }
    }
    (before_refusal.unwrap_or(with_skips), with_skips)
}

/// One contender's run in one round.
struct Run {
    sizing: Sizing,
    row: Row,
    space: Space,
}

pub async fn sizing_mode(client: &kube::Client, cfg: &Config) {
    let seed: u64 = crate::env("SEED", 29);
    print_mix(cfg.nodes, seed);
    let mut runs: Vec<Run> = Vec::new();
    for round in 0..cfg.rounds {
        let order = if round % 2 == 0 {
            [Sizing::Fixed, Sizing::FromPods]
        } else {
            [Sizing::FromPods, Sizing::Fixed]
        };
        eprintln!("[bench] round {} of {}: {order:?}", round + 1, cfg.rounds);
        for sizing in order {
            let label = sizing.label();
            let set = set_name(label);
            create_shaped_nodes(client, &set, cfg.nodes, cfg.creators, |i| draw(seed, i).1).await;
            let args = sizing.args();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let row = allocate_backlog(client, cfg, netcm(cfg, label, &args), &set).await;
            let space = read_space(client, &set, sizing, seed).await;
            eprintln!(
                "[bench] {label}: {} Nodes, {} addresses, {} of another size than the rule's, no overlaps",
                space.nodes, space.addresses, space.wrong_size
            );
            reset(client, cfg.nodes).await;
            runs.push(Run { sizing, row, space });
        }
    }
    print_rounds(&runs);
    print_space(cfg, seed, &runs);
}

fn print_mix(n: usize, seed: u64) {
    let mut counts = [0usize; MIX.len()];
    for i in 0..n {
        counts[draw(seed, i).0] += 1;
    }
    println!("\nMax-pods mix of the {n} Nodes (SEED={seed}; sized prefix: 2 addresses per pod, /24../28)\n");
    println!("| class | max pods (instance type label) | sized prefix | share | Nodes |");
    println!("|---|---|---|---|---|");
    for (class, count) in MIX.iter().zip(counts) {
        let shapes: Vec<String> = class
            .shapes
            .iter()
            .map(|s| {
                format!(
                    "{} ({}) → /{}",
                    s.pods,
                    s.instance_type,
                    sized_prefix(s.pods)
                )
            })
            .collect();
        let prefixes: std::collections::BTreeSet<u8> =
            class.shapes.iter().map(|s| sized_prefix(s.pods)).collect();
        let prefixes: Vec<String> = prefixes.iter().map(|p| format!("/{p}")).collect();
        println!(
            "| {} | {} | {} | {} % | {count} |",
            class.source,
            shapes.join(", "),
            prefixes.join(", "),
            class.share
        );
    }
}

/// Each round's allocation times and their ratio, then the medians.
fn print_rounds(runs: &[Run]) {
    println!("\nAllocation time per round (process start → the bench's watch saw every Node with a CIDR)\n");
    println!("| round | order | fixed /24 | sized from pods | sized ÷ fixed |");
    println!("|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for (round, pair) in runs.chunks(2).enumerate() {
        let find = |s: Sizing| pair.iter().find(|r| r.sizing == s);
        let (Some(f), Some(z)) = (find(Sizing::Fixed), find(Sizing::FromPods)) else {
            continue;
        };
        let ratio = z.row.seconds / f.row.seconds;
        ratios.push(ratio);
        let order = if pair[0].sizing == Sizing::Fixed {
            "fixed, sized"
        } else {
            "sized, fixed"
        };
        println!(
            "| {} | {order} | {:.1} s | {:.1} s | {ratio:.3} |",
            round + 1,
            f.row.seconds,
            z.row.seconds
        );
    }
    let times = |s: Sizing| {
        median(
            runs.iter()
                .filter(|r| r.sizing == s)
                .map(|r| r.row.seconds)
                .collect(),
        )
    };
    if let (Some(f), Some(z), Some(r)) = (
        times(Sizing::Fixed),
        times(Sizing::FromPods),
        median(ratios),
    ) {
        println!("| median | | {f:.1} s | {z:.1} s | {r:.3} |");
        println!(
            "\nsized ÷ fixed allocation time, median of the rounds' ratios: {r:.3} (target: within 5 %, ≤ 1.05: {})",
            if r <= 1.05 { "met" } else { "not met" }
        );
    }
}

/// Per contender: medians of the costs, the address space of its last run (the same every round: the
/// mix and the rule are deterministic; the histogram shows it) and how many Nodes fit a /16.
fn print_space(cfg: &Config, seed: u64, runs: &[Run]) {
    let prefixes: std::collections::BTreeSet<u8> = runs
        .iter()
        .flat_map(|r| r.space.histogram.keys().copied())
        .collect();
    println!(
        "\nAddress space of {} Nodes per contender (medians over {} rounds; space read back from the API)\n",
        cfg.nodes, cfg.rounds
    );
    let hist_cols: Vec<String> = prefixes.iter().map(|p| format!("/{p}")).collect();
    println!(
        "| contender | time to allocate all | CPU s | peak RSS MiB | claim writes per Node | addresses used | \
         mean addresses per Node | addresses spanned | {} | wrong size | Nodes per /16 (65,536 ÷ mean) | Nodes per /16 \
         (Pools, until the first refused) | Nodes per /16 (Pools, refused ones skipped) |",
        hist_cols.join(" | ")
    );
    println!(
        "|---|---|---|---|---|---|---|---|{}---|---|---|---|",
        "---|".repeat(prefixes.len())
    );
    for sizing in [Sizing::Fixed, Sizing::FromPods] {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.sizing == sizing).collect();
        let Some(last) = mine.last() else { continue };
        let med = |f: fn(&Run) -> f64| median(mine.iter().map(|r| f(r)).collect()).unwrap_or(0.0);
        let space = &last.space;
        let hist: Vec<String> = prefixes
            .iter()
            .map(|p| space.histogram.get(p).copied().unwrap_or(0).to_string())
            .collect();
        let (fit, fit_passing_over_refused) = fit_in_slash16(sizing, seed);
        println!(
            "| {} | {:.1} s | {:.1} | {:.1} | {:.3} | {} | {:.1} | {} | {} | {} | {:.0} | {fit} | {fit_passing_over_refused} |",
            sizing.label(),
            med(|r| r.row.seconds),
            med(|r| r.row.stats.map_or(0.0, |s| s.cpu_seconds)),
            med(|r| r.row.stats.map_or(0.0, |s| s.peak_rss_mib)),
            med(|r| r.row.writes.claim as f64 / r.space.nodes.max(1) as f64),
            space.addresses,
            space.mean(),
            space.spanned,
            hist.join(" | "),
            mine.iter().map(|r| r.space.wrong_size).sum::<usize>(),
            65_536.0 / space.mean(),
        );
    }
    let by = |s: Sizing| {
        runs.iter()
            .rev()
            .find(|r| r.sizing == s)
            .map(|r| r.space.addresses)
    };
    if let (Some(f), Some(z)) = (by(Sizing::Fixed), by(Sizing::FromPods)) {
        println!(
            "\nsized ÷ fixed address space: {:.3} ({} of {} addresses saved)",
            z as f64 / f as f64,
            f - z,
            f
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_draws_each_class_near_its_share_and_the_same_for_one_seed() {
        assert_eq!(MIX.iter().map(|c| c.share).sum::<u64>(), 100);
        let mut counts = [0u64; MIX.len()];
        for i in 0..10_000 {
            counts[draw(29, i).0] += 1;
            assert_eq!(draw(29, i), draw(29, i));
        }
        for (class, n) in MIX.iter().zip(counts) {
            assert!(n.abs_diff(class.share * 100) < 200, "{}: {n}", class.source);
        }
    }
}
