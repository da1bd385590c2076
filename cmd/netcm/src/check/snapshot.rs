//! What `netcm check` diagnoses: the cluster's state as read from the API ([`Snapshot`], filled by
//! `gather.rs`, built by hand in tests) and the configuration to judge it by ([`Settings`]: the flags
//! given to `netcm check`, else what the leader published on its Lease, else netcm's defaults).

use std::collections::BTreeMap;

use ipnet::IpNet;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use netcm_ipam::{
    AllocatorConfig, AllocatorFlags, ObjectPool, SizingFlags, FLAG_MAX_MASK_V4, FLAG_MIN_MASK_V4,
    FLAG_SIZE_FROM_PODS,
};
use netcm_manager::published::EffectiveConfiguration;
use netcm_node::PodCidrs;

/// The Lease as read.
#[derive(Debug, Clone)]
pub enum LeaseState {
    /// Found.
    Found(Box<Lease>),
    /// Not there.
    NotFound,
    /// Could not be read (forbidden, …).
    Unreadable(String),
}

/// A PodCIDRClaim as read (only what the checks compare).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    /// The object name.
    pub name: String,
    /// `spec.cidr`: the claimed block (or one CIDR, in claims of earlier versions).
    pub cidr: String,
}

/// The PodCIDRClaims as read.
#[derive(Debug, Clone)]
pub enum ClaimsState {
    /// Listed.
    Listed(Vec<ClaimRecord>),
    /// The CRD is not installed.
    NotInstalled,
    /// Could not be listed.
    Unreadable(String),
}

/// The ClusterCIDR objects (node-ipam-controller's pools) as read.
#[derive(Debug, Clone)]
pub enum ObjectPoolsState {
    /// Listed, as pools, oldest first (the order the allocator ranks them in).
    Listed(Vec<ObjectPool>),
    /// The CRD is not installed.
    NotInstalled,
    /// Could not be listed.
    Unreadable(String),
}

/// Everything the checks look at.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The time the snapshot was taken (the checks' "now").
    pub now: Timestamp,
    /// The Lease's namespace and name.
    pub lease_namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// netcm's Lease.
    pub lease: LeaseState,
    /// Every Node, with managedFields.
    pub nodes: Vec<Node>,
    /// Every PodCIDRClaim.
    pub claims: ClaimsState,
    /// Every ClusterCIDR.
    pub object_pools: ObjectPoolsState,
    /// ClusterCIDRs with a status netcm wrote but no conditions ([`super::pools::lacks_conditions`]).
    pub pools_without_conditions: Vec<String>,
    /// Events netcm recorded about Nodes.
    pub events: Vec<Event>,
    /// Every PodCIDRMigration (none where the CRD is not installed), or why they cannot be listed.
    pub migrations: Result<Vec<netcm_api::pod_cidr_migration::Migration>, String>,
    /// The configuration to judge by.
    pub settings: Settings,
}

impl Snapshot {
    /// The Node named `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// The Lease, if found.
    pub fn lease(&self) -> Option<&Lease> {
        match &self.lease {
            LeaseState::Found(l) => Some(l),
            _ => None,
        }
    }

    /// The current holder, if the Lease names one.
    pub fn holder(&self) -> Option<&str> {
        self.lease()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.as_deref())
            .filter(|h| !h.is_empty())
    }

    /// Whether the Lease is held and renewed within its duration (as of `now`).
    pub fn has_leader(&self) -> bool {
        let Some(spec) = self.lease().and_then(|l| l.spec.as_ref()) else {
            return false;
        };
        let (Some(_), Some(renew)) = (self.holder(), spec.renew_time.as_ref()) else {
            return false;
        };
        let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
        self.now.duration_since(renew.0).as_secs() < duration
    }

    /// netcm's Events about the Node `name`, newest first.
    pub fn events_about(&self, name: &str) -> Vec<&Event> {
        let mut out: Vec<&Event> = self
            .events
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
        out
    }
}

/// When an Event last happened: its series' last observation (a repeat updates the series, not the
/// event), else eventTime, else creation.
pub fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// A Node's name.
pub fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// A Node's pod CIDRs as the checks compare them: the networks (host bits cleared) and the entries that
/// are not CIDRs.
pub fn pod_cidrs(node: &Node) -> (Vec<IpNet>, Vec<String>) {
    let parsed = PodCidrs::of(node);
    let bad = parsed.unparsable.iter().map(|u| u.raw.clone()).collect();
    (parsed.networks().collect(), bad)
}

/// How long ago, in words ("42s", "3m", "5h", "2d").
pub fn ago(now: Timestamp, then: Timestamp) -> String {
    let s = now.duration_since(then).as_secs().max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The flags `netcm check` was given to override the leader's configuration.
#[derive(Debug, Clone, Default)]
pub struct GivenFlags {
    /// `--cluster-cidr`.
    pub cluster_cidr: Option<String>,
    /// `--node-cidr-mask-size`.
    pub node_cidr_mask_size: Option<u8>,
    /// `--node-cidr-mask-size-ipv4`.
    pub node_cidr_mask_size_ipv4: Option<u8>,
    /// `--node-cidr-mask-size-ipv6`.
    pub node_cidr_mask_size_ipv6: Option<u8>,
    /// `--service-cluster-ip-range`.
    pub service_cluster_ip_range: Option<String>,
    /// `--annotation-prefix`.
    pub annotation_prefix: Option<String>,
    /// `--public-ip-address-types`.
    pub public_ip_address_types: Option<String>,
}

/// Where the configuration came from, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `netcm check`'s own flags.
    Flags,
    /// The leader's Lease annotation.
    Leader,
    /// Nothing known: netcm's defaults where it has them.
    Defaults,
}

/// The configuration the checks judge by.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the allocator settings came from.
    pub source: Source,
    /// The allocator's pools: `None` when no cluster CIDR is known; `Err` when what is known is invalid.
    pub allocator: Option<Result<AllocatorConfig, String>>,
    /// The cluster CIDR text, as given or published.
    pub cluster_cidr: String,
    /// Whether the leader runs the allocator (`None`: unknown).
    pub allocates: Option<bool>,
    /// Whether the leader claims CIDRs with PodCIDRClaims (`None`: unknown).
    pub pod_cidr_claims: Option<bool>,
    /// Whether the leader watches ClusterCIDR objects (`None`: unknown).
    pub cluster_cidr_objects: Option<bool>,
    /// The lease-annotation configuration.
    pub syncer: Result<netcm_node_annotation_syncer::Config, String>,
    /// Whether the leader runs the node-annotation-syncer (`None`: unknown).
    pub syncs_subnet_leases: Option<bool>,
    /// Whether the leader runs the route-controller (`None`: unknown).
    pub routes: Option<bool>,
    /// Whether the leader runs the pod-cidr-migration controller (`None`: unknown).
    pub migrates: Option<bool>,
}

impl Settings {
    /// Resolves the configuration: given flags win, then the leader's published configuration, then
    /// netcm's defaults (lease annotations) or nothing (cluster CIDRs have no default).
    pub fn resolve(given: &GivenFlags, published: Option<&EffectiveConfiguration>) -> Settings {
        let from = |flag: &str| published.and_then(|p| p.flag(flag)).map(str::to_string);
        let mask = |given: Option<u8>, flag: &str| {
            given.or_else(|| from(flag).and_then(|v| v.parse().ok()))
        };
        let cluster_cidr = given
            .cluster_cidr
            .clone()
            .or_else(|| from("--cluster-cidr"))
            .unwrap_or_default();
        let source = if given.cluster_cidr.is_some() {
            Source::Flags
        } else if published.is_some() {
            Source::Leader
        } else {
            Source::Defaults
        };
        let allocator = (!cluster_cidr.is_empty()).then(|| {
            AllocatorConfig::from_flags(&AllocatorFlags {
                cluster_cidr: cluster_cidr.clone(),
                node_cidr_mask_size: mask(given.node_cidr_mask_size, "--node-cidr-mask-size"),
                node_cidr_mask_size_ipv4: mask(
                    given.node_cidr_mask_size_ipv4,
                    "--node-cidr-mask-size-ipv4",
                ),
                node_cidr_mask_size_ipv6: mask(
                    given.node_cidr_mask_size_ipv6,
                    "--node-cidr-mask-size-ipv6",
                ),
                service_cluster_ip_range: given
                    .service_cluster_ip_range
                    .clone()
                    .or_else(|| from("--service-cluster-ip-range"))
                    .unwrap_or_default(),
            })
            // The leader's per-Node sizing decides which sizes its pools hand out; off when it
            // publishes none (it predates the flags, or runs without them).
            .and_then(|c| {
                c.with_sizing(&SizingFlags {
                    size_from_pods: from(FLAG_SIZE_FROM_PODS).as_deref() == Some("true"),
                    min_mask_ipv4: from(FLAG_MIN_MASK_V4).and_then(|v| v.parse().ok()),
                    max_mask_ipv4: from(FLAG_MAX_MASK_V4).and_then(|v| v.parse().ok()),
                })
            })
            .map_err(|e| e.to_string())
        });
        let runs =
            |controller: &str| published.map(|p| p.controllers.iter().any(|c| c == controller));
        let allocates = runs(netcm_subnet_allocator::NAME)
            .map(|on| on && from("--allocate-node-cidrs").as_deref() != Some("false"));
        let syncer_flags = netcm_node_annotation_syncer::Flags {
            annotation_prefix: given
                .annotation_prefix
                .clone()
                .or_else(|| from("--annotation-prefix")),
            route_lease_annotation_prefix: None,
            backend_type: from("--backend-type").unwrap_or_else(|| "host-gw".into()),
            public_ip_address_types: given
                .public_ip_address_types
                .clone()
                .or_else(|| from("--public-ip-address-types"))
                .unwrap_or_else(|| "InternalIP,ExternalIP".into())
                .split(',')
                .map(str::to_string)
                .collect(),
            concurrent_node_annotation_syncs: 1,
        };
        Settings {
            source,
            allocator,
            cluster_cidr,
            allocates,
            pod_cidr_claims: from("--pod-cidr-claims").map(|v| v != "false"),
            cluster_cidr_objects: from("--cluster-cidr-objects").map(|v| v != "false"),
            syncer: syncer_flags.config().map_err(|e| e.to_string()),
            syncs_subnet_leases: runs(netcm_node_annotation_syncer::NAME),
            routes: runs(netcm_route_controller::NAME),
            migrates: runs(netcm_pod_cidr_migration::NAME),
        }
    }
}

/// Annotations of a Node (empty when none).
pub fn annotations(node: &Node) -> BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

#[cfg(test)]
pub mod fixtures {
    //! Objects for the pure checks' tests.

    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};

    /// 2024-01-01T00:00:00Z, the fixtures' "now".
    pub fn now() -> Timestamp {
        "2024-01-01T00:00:00Z".parse().expect("timestamp")
    }

    /// `secs` seconds before [`now`].
    pub fn before(secs: i64) -> Timestamp {
        now() - jiff::SignedDuration::from_secs(secs)
    }

    /// A Node created an hour ago with an InternalIP and the given pod CIDRs.
    pub fn node(name: &str, ip: &str, cidrs: &[&str]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("{name}-uid")),
                creation_timestamp: Some(Time(before(3600))),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: cidrs.first().map(|s| s.to_string()),
                pod_cidrs: (!cidrs.is_empty())
                    .then(|| cidrs.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.into(),
                }]),
                ..Default::default()
            }),
        }
    }

    /// `n` carrying a complete host-gw subnet lease under flannel's prefix with `public_ip`.
    pub fn with_subnet_lease(mut n: Node, public_ip: &str) -> Node {
        let a = n.metadata.annotations.get_or_insert_with(Default::default);
        for (k, v) in [
            ("kube-subnet-manager", "true"),
            ("backend-type", "host-gw"),
            ("backend-data", "null"),
            ("public-ip", public_ip),
        ] {
            a.insert(format!("flannel.alpha.coreos.com/{k}"), v.into());
        }
        n
    }

    /// A Lease held by `holder`, renewed `renewed_ago` seconds ago.
    pub fn lease(holder: &str, renewed_ago: i64, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("netcm".into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                acquire_time: Some(MicroTime(before(600))),
                renew_time: Some(MicroTime(before(renewed_ago))),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        }
    }

    /// The leader's published configuration for `cluster_cidr` (allocator and syncer on).
    pub fn published(cluster_cidr: &str) -> EffectiveConfiguration {
        EffectiveConfiguration {
            identity: "leader_1".into(),
            version: "0.1.0".into(),
            controllers: vec!["subnet-allocator".into(), "node-annotation-syncer".into()],
            flags: [
                ("--cluster-cidr".to_string(), cluster_cidr.to_string()),
                ("--allocate-node-cidrs".to_string(), "true".to_string()),
                ("--pod-cidr-claims".to_string(), "true".to_string()),
            ]
            .into(),
        }
    }

    /// A snapshot of `nodes` under a healthy leader running with `cluster_cidr`.
    pub fn snapshot(cluster_cidr: &str, nodes: Vec<Node>) -> Snapshot {
        Snapshot {
            now: now(),
            lease_namespace: "kube-system".into(),
            lease_name: "netcm".into(),
            lease: LeaseState::Found(Box::new(lease("leader_1", 1, 0))),
            nodes,
            claims: ClaimsState::NotInstalled,
            object_pools: ObjectPoolsState::NotInstalled,
            pools_without_conditions: Vec::new(),
            events: Vec::new(),
            migrations: Ok(Vec::new()),
            settings: Settings::resolve(&GivenFlags::default(), Some(&published(cluster_cidr))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn a_repeated_event_happened_when_its_series_last_saw_it() {
        use k8s_openapi::api::events::v1::EventSeries;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let first: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let last: Timestamp = "2026-01-01T00:05:00Z".parse().expect("time");
        let mut e = Event {
            event_time: Some(MicroTime(first)),
            ..Default::default()
        };
        assert_eq!(event_time(&e), Some(first));
        e.series = Some(EventSeries {
            count: 2,
            last_observed_time: MicroTime(last),
        });
        assert_eq!(event_time(&e), Some(last));
    }

    #[test]
    fn given_flags_win_over_the_leaders_published_configuration() {
        let given = GivenFlags {
            cluster_cidr: Some("10.0.0.0/16".into()),
            ..Default::default()
        };
        let s = Settings::resolve(&given, Some(&published("10.244.0.0/16")));
        assert_eq!(s.source, Source::Flags);
        assert_eq!(s.cluster_cidr, "10.0.0.0/16");
        let s = Settings::resolve(&GivenFlags::default(), Some(&published("10.244.0.0/16")));
        assert_eq!(s.source, Source::Leader);
        assert_eq!(s.cluster_cidr, "10.244.0.0/16");
        assert_eq!(s.allocates, Some(true));
        assert_eq!(s.routes, Some(false));
    }

    #[test]
    fn the_leaders_per_node_sizing_is_the_pools_sizing() {
        let mut leader = published("10.244.0.0/16");
        let sized = |p: &EffectiveConfiguration| {
            let s = Settings::resolve(&GivenFlags::default(), Some(p));
            let config = s.allocator.expect("known").expect("valid");
            config.families[0].sizing
        };
        assert_eq!(sized(&leader), None);
        leader.flags.extend([
            (FLAG_SIZE_FROM_PODS.to_string(), "true".to_string()),
            (FLAG_MIN_MASK_V4.to_string(), String::new()),
            (FLAG_MAX_MASK_V4.to_string(), "27".to_string()),
        ]);
        let sizing = sized(&leader).expect("sized");
        assert_eq!(
            (sizing.largest, sizing.smallest, sizing.default),
            (24, 27, 24)
        );
    }

    #[test]
    fn without_flags_or_a_leader_the_pools_are_unknown_and_lease_keys_take_netcms_defaults() {
        let s = Settings::resolve(&GivenFlags::default(), None);
        assert_eq!(s.source, Source::Defaults);
        assert!(s.allocator.is_none());
        assert_eq!(s.allocates, None);
        assert_eq!(
            s.syncer.expect("default syncer config").keys.public_ip,
            "flannel.alpha.coreos.com/public-ip"
        );
    }

    #[test]
    fn a_lease_renewed_within_its_duration_has_a_leader_and_an_older_one_does_not() {
        let mut s = snapshot("10.244.0.0/16", vec![]);
        assert!(s.has_leader());
        s.lease = LeaseState::Found(Box::new(lease("leader_1", 16, 0)));
        assert!(!s.has_leader());
    }
}
