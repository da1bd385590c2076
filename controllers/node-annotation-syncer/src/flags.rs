//! The syncer's flags (flannel's names where they overlap) and the validated configuration built from them.

use clap::Args;
use netcm_manager::flags::GenericFlags;
use netcm_manager::{ControllerOptions, InitContext, InitResult};

use netcm_lease::{Keys, PrefixError};

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

/// The backend whose lease data is always `null` and written by netcm.
pub const HOST_GW: &str = "host-gw";

/// node-annotation-syncer flags.
#[derive(Debug, Clone, Args)]
// clap names an argument group after the struct, and every controller's struct is called `Flags`.
#[group(id = "node-annotation-syncer-flags")]
pub struct Flags {
    /// Prefix of the subnet-lease annotations (flannel's --kube-annotation-prefix rules: fqdn/[0-9a-z-_]*).
    #[arg(long, default_value = "flannel.alpha.coreos.com")]
    pub annotation_prefix: String,

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
    /// The validated configuration.
    pub fn config(&self) -> Result<Config, FlagError> {
        let keys = Keys::new("--annotation-prefix", &self.annotation_prefix)?;
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
            ("--annotation-prefix".into(), self.annotation_prefix.clone()),
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
    fn zero_workers_are_refused() {
        assert_eq!(
            parse(&["--concurrent-node-annotation-syncs=0"]).config(),
            Err(FlagError::NoWorkers)
        );
    }
}
