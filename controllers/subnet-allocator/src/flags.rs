//! The allocator's flags: kube-controller-manager's nodeipam flags with their names and rules.

use clap::{ArgAction, Args};
use netcm_ipam::{
    AllocatorConfig, AllocatorFlags, ConfigError, SizingFlags, FLAG_MAX_MASK_V4, FLAG_MIN_MASK_V4,
    FLAG_SIZE_FROM_PODS,
};
use netcm_manager::duration::{format_duration, parse_duration};
use netcm_manager::flags::GenericFlags;
use netcm_manager::{ControllerOptions, InitContext, InitResult};

/// subnet-allocator flags.
#[derive(Debug, Clone, Args)]
// clap names an argument group after the struct, and every controller's struct is called `Flags`.
#[group(id = "subnet-allocator-flags")]
pub struct Flags {
    /// Should CIDRs for Pods be allocated and set on the Nodes. Requires --cluster-cidr.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub allocate_node_cidrs: bool,

    /// CIDR range(s) for Pods in the cluster, comma-separated: IPv4, IPv6 or both; several per family are tried in order.
    #[arg(long, default_value = "")]
    pub cluster_cidr: String,

    /// Mask size for node CIDRs in a single-stack cluster (default 24 for IPv4, 64 for IPv6).
    #[arg(long)]
    pub node_cidr_mask_size: Option<u8>,

    /// Mask size for IPv4 node CIDRs in a dual-stack cluster (default 24).
    #[arg(long)]
    pub node_cidr_mask_size_ipv4: Option<u8>,

    /// Mask size for IPv6 node CIDRs in a dual-stack cluster (default 64).
    #[arg(long)]
    pub node_cidr_mask_size_ipv6: Option<u8>,

    /// Size each Node's IPv4 CIDR from its pod capacity (`status.capacity.pods`): the smallest block holding
    /// 2 addresses per pod, within --node-cidr-mask-size-ipv4-min/-max; a Node without capacity gets the
    /// IPv4 node mask. IPv6 keeps its fixed mask. Off: kube-controller-manager's one size.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub node_cidr_size_from_pods: bool,

    /// With --node-cidr-size-from-pods: the shortest IPv4 mask, so the largest block a Node gets (default:
    /// the IPv4 node mask).
    #[arg(long)]
    pub node_cidr_mask_size_ipv4_min: Option<u8>,

    /// With --node-cidr-size-from-pods: the longest IPv4 mask, so the smallest block a Node gets (default 28).
    #[arg(long)]
    pub node_cidr_mask_size_ipv4_max: Option<u8>,

    /// Service CIDR range(s), comma-separated (at most one per family); never handed out to Nodes.
    #[arg(long, default_value = "")]
    pub service_cluster_ip_range: String,

    /// Also record a Normal `CIDRAssigned` Event per allocation (a second API write per Node).
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub record_cidr_assigned_events: bool,

    /// Claim every CIDR with a PodCIDRClaim object (CRD podcidrclaims.ipam.netcm.io) before writing it to a
    /// Node, so no two leaders can hand out one CIDR even when a stale leader's write lands late.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub pod_cidr_claims: bool,

    /// Also allocate from ClusterCIDR objects (CRD clustercidrs.networking.x-k8s.io, node-ipam-controller's API)
    /// as pools beside --cluster-cidr; if the CRD is not installed, allocation goes on from the flags alone.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub cluster_cidr_objects: bool,

    /// How long the pod CIDRs of a deleted Node stay out of allocation, while routes, neighbour entries and
    /// flannel leases elsewhere still point at it; a Node re-created under the same name within it gets them
    /// back, and a pool with nothing else free hands them out early with a Warning. 0s: released at once.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub cidr_release_hold: std::time::Duration,

    /// With --cidr-release-hold: a Node under another name with a held Node's spec.providerID gets its
    /// CIDRs too (the same machine registered again under a new hostname). The providerID is the Node's
    /// own word, which the API server does not check: any kubelet can register another machine's, and
    /// images baked with one give it to every Node made from them. Off: a hold goes back by name only.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub cidr_release_hold_rejoin_by_provider_id: bool,

    /// Number of Nodes the subnet-allocator syncs concurrently.
    #[arg(long, default_value_t = 32)]
    pub concurrent_node_cidr_syncs: usize,
}

impl Flags {
    /// Whether a release hold goes back by `spec.providerID` too: only with a hold, and only when asked.
    pub fn rejoins_by_provider_id(&self) -> bool {
        !self.cidr_release_hold.is_zero() && self.cidr_release_hold_rejoin_by_provider_id
    }

    /// The validated allocator configuration, or `None` when `--allocate-node-cidrs=false`.
    pub fn config(&self) -> Result<Option<AllocatorConfig>, ConfigError> {
        if !self.allocate_node_cidrs {
            return Ok(None);
        }
        AllocatorConfig::from_flags(&AllocatorFlags {
            cluster_cidr: self.cluster_cidr.clone(),
            node_cidr_mask_size: self.node_cidr_mask_size,
            node_cidr_mask_size_ipv4: self.node_cidr_mask_size_ipv4,
            node_cidr_mask_size_ipv6: self.node_cidr_mask_size_ipv6,
            service_cluster_ip_range: self.service_cluster_ip_range.clone(),
        })?
        .with_sizing(&SizingFlags {
            size_from_pods: self.node_cidr_size_from_pods,
            min_mask_ipv4: self.node_cidr_mask_size_ipv4_min,
            max_mask_ipv4: self.node_cidr_mask_size_ipv4_max,
        })
        .map(Some)
    }
}

impl ControllerOptions for Flags {
    type FlagError = ConfigError;

    fn validate(&self, _generic: &GenericFlags) -> Result<(), ConfigError> {
        self.config().map(|_| ())
    }

    fn effective_config(&self) -> Vec<(String, String)> {
        let mask = |m: Option<u8>| m.map(|m| m.to_string()).unwrap_or_default();
        [
            (
                "--allocate-node-cidrs",
                self.allocate_node_cidrs.to_string(),
            ),
            ("--cluster-cidr", self.cluster_cidr.clone()),
            ("--node-cidr-mask-size", mask(self.node_cidr_mask_size)),
            (
                "--node-cidr-mask-size-ipv4",
                mask(self.node_cidr_mask_size_ipv4),
            ),
            (
                "--node-cidr-mask-size-ipv6",
                mask(self.node_cidr_mask_size_ipv6),
            ),
            (
                FLAG_SIZE_FROM_PODS,
                self.node_cidr_size_from_pods.to_string(),
            ),
            (FLAG_MIN_MASK_V4, mask(self.node_cidr_mask_size_ipv4_min)),
            (FLAG_MAX_MASK_V4, mask(self.node_cidr_mask_size_ipv4_max)),
            (
                "--service-cluster-ip-range",
                self.service_cluster_ip_range.clone(),
            ),
            ("--pod-cidr-claims", self.pod_cidr_claims.to_string()),
            (
                "--cluster-cidr-objects",
                self.cluster_cidr_objects.to_string(),
            ),
            (
                "--cidr-release-hold",
                format_duration(self.cidr_release_hold),
            ),
            (
                "--cidr-release-hold-rejoin-by-provider-id",
                self.cidr_release_hold_rejoin_by_provider_id.to_string(),
            ),
            (
                "--concurrent-node-cidr-syncs",
                self.concurrent_node_cidr_syncs.to_string(),
            ),
        ]
        .map(|(flag, value)| (flag.to_string(), value))
        .into()
    }

    fn workers(&self) -> usize {
        self.concurrent_node_cidr_syncs
    }

    fn init(&self, ctx: &InitContext) -> InitResult {
        crate::init(self, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
    }

    fn config(args: &[&str]) -> Result<Option<AllocatorConfig>, ConfigError> {
        let cli = Cli::parse_from(
            ["netcm", "--cluster-cidr=10.0.0.0/16,fd00::/56"]
                .into_iter()
                .chain(args.iter().copied()),
        );
        cli.flags.config()
    }

    #[test]
    fn without_the_sizing_flag_no_family_is_sized() {
        let c = config(&[]).expect("valid").expect("allocating");
        assert!(c.families.iter().all(|f| f.sizing.is_none()));
    }

    #[test]
    fn the_sizing_flags_size_the_ipv4_family_within_their_bounds() {
        let c = config(&[
            "--node-cidr-size-from-pods",
            "--node-cidr-mask-size-ipv4-min=22",
            "--node-cidr-mask-size-ipv4-max=27",
        ])
        .expect("valid")
        .expect("allocating");
        let sizing = c.families[0].sizing.expect("IPv4 is sized");
        assert_eq!(
            (sizing.largest, sizing.smallest, sizing.default),
            (22, 27, 24)
        );
        assert_eq!(c.families[1].sizing, None);
    }

    #[test]
    fn a_sizing_bound_without_the_flag_is_refused_at_validation() {
        let err = config(&["--node-cidr-mask-size-ipv4-max=27"]).expect_err("refused");
        assert!(
            err.to_string().contains("needs --node-cidr-size-from-pods"),
            "{err}"
        );
    }

    #[test]
    fn holds_go_back_by_provider_id_only_when_asked_and_only_with_a_hold() {
        let parse = |args: &[&str]| {
            Cli::parse_from(
                ["netcm", "--cluster-cidr=10.0.0.0/16"]
                    .into_iter()
                    .chain(args.iter().copied()),
            )
            .flags
        };
        assert!(!parse(&["--cidr-release-hold=3m"]).rejoins_by_provider_id());
        assert!(parse(&[
            "--cidr-release-hold=3m",
            "--cidr-release-hold-rejoin-by-provider-id"
        ])
        .rejoins_by_provider_id());
        assert!(!parse(&["--cidr-release-hold-rejoin-by-provider-id"]).rejoins_by_provider_id());
    }
}
