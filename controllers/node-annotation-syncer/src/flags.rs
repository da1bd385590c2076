//! The syncer's flags (flannel's names where they overlap) and the validated configuration built from them.
//! `--annotation-prefix` is read by the route controller too (through [`Flags::annotation_prefix`]), so
//! both agree on the lease keys by construction.

use clap::Args;
use netcm_manager::flags::GenericFlags;
use netcm_manager::{ControllerOptions, InitContext, InitResult};

use netcm_node::{Keys, PrefixError};

/// Every node address type Kubernetes defines.
pub const NODE_ADDRESS_TYPES: [&str; 5] = [
    "Hostname",
    "InternalIP",
    "ExternalIP",
    "InternalDNS",
    "ExternalDNS",
];

/// The node address types whose values are IP addresses.
pub const IP_ADDRESS_TYPES: [&str; 2] = ["InternalIP", "ExternalIP"];

/// flannel's `--kube-annotation-prefix` default.
pub const DEFAULT_ANNOTATION_PREFIX: &str = "flannel.alpha.coreos.com";

/// The route controller's former name for `--annotation-prefix`, still accepted.
pub const DEPRECATED_PREFIX_FLAG: &str = "--route-lease-annotation-prefix";

/// The backend whose lease data is always `null` and written by netcm.
pub const HOST_GW: &str = "host-gw";

/// node-annotation-syncer flags.
#[derive(Debug, Clone, Args)]
// clap names an argument group after the struct, and every controller's struct is called `Flags`.
#[group(id = "node-annotation-syncer-flags")]
pub struct Flags {
    /// Prefix of the subnet-lease annotations (flannel's --kube-annotation-prefix rules: fqdn/[0-9a-z-_]*) that node-annotation-syncer writes and route-controller reads gateways from [default: flannel.alpha.coreos.com].
    #[arg(long, value_name = "PREFIX")]
    pub annotation_prefix: Option<String>,

    /// Deprecated: use --annotation-prefix (the route controller's former name for it; accepted with a warning).
    #[arg(long, value_name = "PREFIX", hide = true)]
    pub route_lease_annotation_prefix: Option<String>,

    /// The flannel backend published in <prefix>/backend-type; for host-gw netcm also writes backend-data null.
    #[arg(long, default_value = HOST_GW)]
    pub backend_type: String,

    /// Node address types to take the public IP from, in order (comma-separated; InternalIP, ExternalIP).
    #[arg(long, value_delimiter = ',', default_value = "InternalIP,ExternalIP")]
    pub public_ip_address_types: Vec<String>,

    /// Number of Nodes the node-annotation-syncer syncs concurrently.
    #[arg(long, default_value_t = 16)]
    pub concurrent_node_annotation_syncs: usize,
}

/// A flag value that breaks a rule; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// `--annotation-prefix`.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// `--annotation-prefix` and its deprecated alias disagree.
    #[error("--annotation-prefix {current:?} and {DEPRECATED_PREFIX_FLAG} {deprecated:?} differ: they name one prefix, which node-annotation-syncer writes and route-controller reads; pass only --annotation-prefix")]
    PrefixConflict {
        /// `--annotation-prefix`.
        current: String,
        /// `--route-lease-annotation-prefix`.
        deprecated: String,
    },
    /// `--backend-type` is not a backend name.
    #[error("--backend-type {0:?}: must be a flannel backend name of lowercase letters, digits and '-' (e.g. host-gw, vxlan, wireguard)")]
    BackendType(String),
    /// `--public-ip-address-types` is empty.
    #[error("--public-ip-address-types must name at least one node address type (InternalIP, ExternalIP)")]
    NoAddressTypes,
    /// A known type that does not carry an IP.
    #[error("--public-ip-address-types: {0} is a node address type whose value is a host name, not an IP address; use InternalIP and/or ExternalIP")]
    NotAnIpType(String),
    /// Not a node address type at all.
    #[error("--public-ip-address-types: unknown node address type {0:?}; node address types are Hostname, InternalIP, ExternalIP, InternalDNS and ExternalDNS, of which InternalIP and ExternalIP carry IP addresses")]
    UnknownType(String),
    /// Listed twice.
    #[error("--public-ip-address-types: {0} is listed twice")]
    Duplicate(String),
    /// No workers.
    #[error("--concurrent-node-annotation-syncs must be at least 1")]
    NoWorkers,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The lease keys under `--annotation-prefix`.
    pub keys: Keys,
    /// `--backend-type`.
    pub backend_type: String,
    /// `--public-ip-address-types`, in order.
    pub address_types: Vec<String>,
}

impl Config {
    /// Whether netcm owns backend-data (`null`); for other backends only the node agent knows it.
    pub fn writes_backend_data(&self) -> bool {
        self.backend_type == HOST_GW
    }
}

impl Flags {
    /// The lease annotation prefix and the flag that gave it: `--annotation-prefix`, else its deprecated
    /// alias, else the default. Both flags with different values is an error, whichever controllers run.
    pub fn annotation_prefix(&self) -> Result<(&'static str, &str), FlagError> {
        match (&self.annotation_prefix, &self.route_lease_annotation_prefix) {
            (Some(current), Some(deprecated)) if current != deprecated => {
                Err(FlagError::PrefixConflict {
                    current: current.clone(),
                    deprecated: deprecated.clone(),
                })
            }
            (Some(current), _) => Ok(("--annotation-prefix", current)),
            (None, Some(deprecated)) => Ok((DEPRECATED_PREFIX_FLAG, deprecated)),
            (None, None) => Ok(("--annotation-prefix", DEFAULT_ANNOTATION_PREFIX)),
        }
    }

    /// The lease keys under the annotation prefix; an error names the flag the prefix came from.
    pub fn lease_keys(&self) -> Result<Keys, FlagError> {
        let (flag, prefix) = self.annotation_prefix()?;
        Ok(Keys::new(flag, prefix)?)
    }

    /// What to log at startup when the deprecated alias is used.
    pub fn deprecation_warning(&self) -> Option<String> {
        self.route_lease_annotation_prefix.as_ref().map(|_| {
            format!("{DEPRECATED_PREFIX_FLAG} is deprecated and will be removed: use --annotation-prefix, which node-annotation-syncer and route-controller both read")
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> Result<Config, FlagError> {
        let keys = self.lease_keys()?;
        let bt = &self.backend_type;
        let bt_ok = !bt.is_empty()
            && bt
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !bt.starts_with('-')
            && !bt.ends_with('-');
        if !bt_ok {
            return Err(FlagError::BackendType(bt.clone()));
        }
        let mut address_types: Vec<String> = Vec::new();
        for t in &self.public_ip_address_types {
            let t = t.trim();
            if t.is_empty() {
                continue;
            }
            if !NODE_ADDRESS_TYPES.contains(&t) {
                return Err(FlagError::UnknownType(t.to_string()));
            }
            if !IP_ADDRESS_TYPES.contains(&t) {
                return Err(FlagError::NotAnIpType(t.to_string()));
            }
            if address_types.iter().any(|seen| seen == t) {
                return Err(FlagError::Duplicate(t.to_string()));
            }
            address_types.push(t.to_string());
        }
        if address_types.is_empty() {
            return Err(FlagError::NoAddressTypes);
        }
        if self.concurrent_node_annotation_syncs == 0 {
            return Err(FlagError::NoWorkers);
        }
        Ok(Config {
            keys,
            backend_type: bt.clone(),
            address_types,
        })
    }
}

impl ControllerOptions for Flags {
    type FlagError = FlagError;

    fn validate(&self, _generic: &GenericFlags) -> Result<(), FlagError> {
        self.config().map(|_| ())
    }

    fn effective_config(&self) -> Vec<(String, String)> {
        vec![
            (
                "--annotation-prefix".into(),
                // The value in effect; a conflict never gets this far (cmd exits first).
                self.annotation_prefix()
                    .map(|(_, p)| p.to_string())
                    .unwrap_or_default(),
            ),
            ("--backend-type".into(), self.backend_type.clone()),
            (
                "--public-ip-address-types".into(),
                self.public_ip_address_types.join(","),
            ),
            (
                "--concurrent-node-annotation-syncs".into(),
                self.concurrent_node_annotation_syncs.to_string(),
            ),
        ]
    }

    fn workers(&self) -> usize {
        self.concurrent_node_annotation_syncs
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

    fn parse(args: &[&str]) -> Flags {
        let mut argv = vec!["netcm"];
        argv.extend_from_slice(args);
        Cli::parse_from(argv).flags
    }

    #[test]
    fn the_defaults_are_flannels_prefix_host_gw_and_internal_then_external_ip() {
        let c = parse(&[]).config().expect("defaults are valid");
        assert_eq!(c.keys.prefix, "flannel.alpha.coreos.com/");
        assert_eq!(c.backend_type, "host-gw");
        assert!(c.writes_backend_data());
        assert_eq!(c.address_types, ["InternalIP", "ExternalIP"]);
    }

    #[test]
    fn address_types_keep_their_order() {
        let c = parse(&["--public-ip-address-types=ExternalIP, InternalIP"])
            .config()
            .expect("valid");
        assert_eq!(c.address_types, ["ExternalIP", "InternalIP"]);
    }

    #[test]
    fn host_name_valued_address_types_are_refused_with_a_clear_message() {
        for t in ["Hostname", "InternalDNS", "ExternalDNS"] {
            let err = parse(&[&format!("--public-ip-address-types=InternalIP,{t}")])
                .config()
                .map_err(|e| e.to_string())
                .expect_err("not an IP type");
            assert!(err.starts_with("--public-ip-address-types"), "{err}");
            assert!(
                err.contains(t) && err.contains("not an IP address"),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_empty_and_repeated_address_types_are_refused() {
        let err = parse(&["--public-ip-address-types=InternalIp"])
            .config()
            .map_err(|e| e.to_string())
            .expect_err("case matters");
        assert!(
            err.contains("unknown node address type \"InternalIp\""),
            "{err}"
        );
        assert_eq!(
            parse(&["--public-ip-address-types="]).config(),
            Err(FlagError::NoAddressTypes)
        );
        assert_eq!(
            parse(&["--public-ip-address-types=InternalIP,InternalIP"]).config(),
            Err(FlagError::Duplicate("InternalIP".into()))
        );
    }

    #[test]
    fn other_backends_keep_the_agents_backend_data() {
        let c = parse(&["--backend-type=vxlan"]).config().expect("valid");
        assert!(!c.writes_backend_data());
    }

    #[test]
    fn a_backend_type_that_is_not_a_name_is_refused() {
        for bad in ["", "Host-GW", "host gw", "-x"] {
            let err = parse(&[&format!("--backend-type={bad}")])
                .config()
                .map_err(|e| e.to_string())
                .expect_err("bad backend");
            assert!(err.starts_with("--backend-type"), "{err}");
        }
    }

    #[test]
    fn a_bad_prefix_is_reported_naming_the_flag() {
        let err = parse(&["--annotation-prefix=a/b/c"])
            .config()
            .map_err(|e| e.to_string())
            .expect_err("bad prefix");
        assert!(err.starts_with("--annotation-prefix"), "{err}");
    }

    #[test]
    fn without_either_prefix_flag_the_default_prefix_is_used_and_nothing_is_deprecated() {
        let f = parse(&[]);
        assert_eq!(
            f.annotation_prefix(),
            Ok(("--annotation-prefix", "flannel.alpha.coreos.com"))
        );
        assert_eq!(f.deprecation_warning(), None);
    }

    #[test]
    fn the_deprecated_route_lease_prefix_alone_sets_the_prefix_for_both_controllers_with_a_warning()
    {
        let f = parse(&["--route-lease-annotation-prefix=example.com/lease"]);
        assert_eq!(
            f.annotation_prefix(),
            Ok(("--route-lease-annotation-prefix", "example.com/lease"))
        );
        assert_eq!(
            f.config().expect("valid").keys.public_ip,
            "example.com/lease-public-ip"
        );
        let warning = f.deprecation_warning().expect("deprecated flag used");
        assert!(
            warning.contains("--route-lease-annotation-prefix")
                && warning.contains("--annotation-prefix"),
            "{warning}"
        );
        assert_eq!(
            f.effective_config()[0],
            ("--annotation-prefix".into(), "example.com/lease".into())
        );
    }

    #[test]
    fn both_prefix_flags_with_one_value_are_accepted_with_a_warning() {
        let f = parse(&[
            "--annotation-prefix=example.com",
            "--route-lease-annotation-prefix=example.com",
        ]);
        assert_eq!(
            f.annotation_prefix(),
            Ok(("--annotation-prefix", "example.com"))
        );
        assert!(f.deprecation_warning().is_some());
    }

    #[test]
    fn both_prefix_flags_with_different_values_are_refused_naming_both() {
        let f = parse(&[
            "--annotation-prefix=flannel.alpha.coreos.com",
            "--route-lease-annotation-prefix=example.com",
        ]);
        let err = f.config().expect_err("conflict").to_string();
        assert!(
            err.starts_with("--annotation-prefix \"flannel.alpha.coreos.com\" and --route-lease-annotation-prefix \"example.com\" differ"),
            "{err}"
        );
        assert!(matches!(
            f.lease_keys(),
            Err(FlagError::PrefixConflict { .. })
        ));
    }

    #[test]
    fn a_bad_prefix_given_through_the_deprecated_flag_is_reported_under_that_flag() {
        let err = parse(&["--route-lease-annotation-prefix=a/b/c"])
            .config()
            .expect_err("bad prefix")
            .to_string();
        assert!(err.starts_with("--route-lease-annotation-prefix"), "{err}");
    }

    #[test]
    fn the_deprecated_flag_is_hidden_from_help() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--annotation-prefix"), "{help}");
        assert!(!help.contains("--route-lease-annotation-prefix"), "{help}");
    }

    #[test]
    fn zero_workers_are_refused() {
        assert_eq!(
            parse(&["--concurrent-node-annotation-syncs=0"]).config(),
            Err(FlagError::NoWorkers)
        );
    }
}
