//! The pure part: from a Node (pod CIDRs, addresses) and its current annotations, the lease annotations
//! that differ from what flannel's `nodeToLease` should read. No API, no clock, no state.

use std::collections::BTreeMap;

use netcm_node::{CachedNode, Family, PodCidrs};

use crate::flags::Config;

/// Why nothing can be published for a Node yet; a later change of the Node retriggers the sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// No `spec.podCIDR(s)` yet.
    NoPodCidr,
    /// Pod CIDRs flannel could not read (unparsable, or more than two).
    UnusablePodCidrs(String),
    /// No usable address of a pod CIDR's family in `status.addresses` (and no lease value to keep).
    NoAddress(Vec<Family>),
}

impl Waiting {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoPodCidr => "no_pod_cidr",
            Self::UnusablePodCidrs(_) => "unusable_pod_cidr",
            Self::NoAddress(_) => "no_address",
        }
    }

    /// Every label, for metrics that should show zeros.
    pub const LABELS: [&'static str; 3] = ["no_pod_cidr", "unusable_pod_cidr", "no_address"];
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoPodCidr => write!(f, "the node has no pod CIDR yet"),
            Self::UnusablePodCidrs(why) => write!(f, "the node's pod CIDRs are unusable: {why}"),
            Self::NoAddress(fams) => {
                let names: Vec<String> = fams.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "the node has no usable {} address of the configured types",
                    names.join(" or ")
                )
            }
        }
    }
}

/// A public-IP overwrite annotation whose value is not a usable address of its family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidOverwrite {
    /// The family it is for.
    pub family: Family,
    /// The overwrite annotation key.
    pub key: String,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
    /// What is published instead: the kept lease value, or one taken from the addresses.
    pub instead: Instead,
}

/// What replaces an invalid overwrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instead {
    /// The current lease value (the last good one) stays.
    Kept(String),
    /// No lease value yet: the one from `status.addresses`.
    FromAddresses(String),
    /// Nothing (no address either).
    Nothing,
}

/// What a sync should do for one Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The annotations to set: only keys whose value differs from the current one.
    pub changes: BTreeMap<String, String>,
    /// Overwrites that were ignored.
    pub invalid: Vec<InvalidOverwrite>,
    /// Set when nothing may be published yet (then `changes` is empty).
    pub waiting: Option<Waiting>,
}

/// The families of a Node's pod CIDRs, or why flannel could not read them.
fn families(cidrs: &PodCidrs) -> Result<Vec<Family>, Waiting> {
    if cidrs.is_empty() {
        return Err(Waiting::NoPodCidr);
    }
    // flannel's nodeToLease errors on a third entry and on any entry it cannot parse.
    if cidrs.len() > 2 {
        return Err(Waiting::UnusablePodCidrs(format!(
            "{} pod CIDRs; at most one per family",
            cidrs.len()
        )));
    }
    if let Some(bad) = cidrs.unparsable.first() {
        return Err(Waiting::UnusablePodCidrs(bad.to_string()));
    }
    Ok(cidrs.families())
}

/// Parses `raw` as a public IP of `family` by the rule the route controller shares
/// ([`netcm_node::public_ip`]): the exact text of one address, never one that cannot be a next hop to
/// another Node. Returns the canonical text.
pub fn usable_ip(raw: &str, family: Family) -> Result<String, &'static str> {
    netcm_node::public_ip(raw, family)
        .map(|ip| ip.to_string())
        .map_err(netcm_node::Unusable::as_str)
}

/// The first usable address of `family` in `status.addresses`, by type in `types` order, then by the
/// order the Node lists them.
pub fn address_ip(node: &CachedNode, types: &[String], family: Family) -> Option<String> {
    netcm_node::first_address(node, types, family).map(|ip| ip.to_string())
}

/// The public IP of one family: `Some(value)` to publish, `None` for "keep what is there" or "nothing".
fn public_ip(
    cfg: &Config,
    node: &CachedNode,
    current: &BTreeMap<String, String>,
    family: Family,
    invalid: &mut Vec<InvalidOverwrite>,
) -> Option<String> {
    let overwrite_key = cfg.keys.public_ip_overwrite_of(family);
    let lease_key = cfg.keys.public_ip_of(family);
    let from_addresses = || address_ip(node, &cfg.address_types, family);
    // flannel treats an empty overwrite as unset.
    let Some(raw) = current.get(overwrite_key).filter(|v| !v.is_empty()) else {
        return from_addresses();
    };
    let why = match usable_ip(raw, family) {
        Ok(ip) => return Some(ip),
        Err(why) => why,
    };
    // The last good value stays; only a lease that has none (or a broken one) gets the address.
    let kept = current
        .get(lease_key)
        .filter(|v| usable_ip(v, family).is_ok())
        .cloned();
    let chosen = if kept.is_some() {
        None
    } else {
        from_addresses()
    };
    let instead = match (&kept, &chosen) {
        (Some(k), _) => Instead::Kept(k.clone()),
        (None, Some(a)) => Instead::FromAddresses(a.clone()),
        (None, None) => Instead::Nothing,
    };
    invalid.push(InvalidOverwrite {
        family,
        key: overwrite_key.to_string(),
        value: raw.clone(),
        why,
        instead,
    });
    chosen.or(kept)
}

/// Computes what to write for `node`, whose annotations are `current` (the cache's, plus netcm's own
/// writes the cache has not seen yet).
pub fn plan(cfg: &Config, node: &CachedNode, current: &BTreeMap<String, String>) -> Plan {
    let mut plan = Plan::default();
    let fams = match families(&node.pod_cidrs()) {
        Ok(f) => f,
        Err(w) => {
            plan.waiting = Some(w);
            return plan;
        }
    };
    let keys = &cfg.keys;
    let mut desired: BTreeMap<String, String> = BTreeMap::new();
    desired.insert(keys.kube_subnet_manager.clone(), "true".into());
    desired.insert(keys.backend_type.clone(), cfg.backend_type.clone());
    if cfg.writes_backend_data() {
        // host-gw's BackendData is a nil json.RawMessage, which flannel marshals to `null`.
        desired.insert(keys.backend_data.clone(), "null".into());
        if fams.contains(&Family::V6) {
            desired.insert(keys.backend_v6_data.clone(), "null".into());
        }
    }
    let mut missing = Vec::new();
    for fam in fams {
        let lease_key = keys.public_ip_of(fam);
        match public_ip(cfg, node, current, fam, &mut plan.invalid) {
            Some(ip) => {
                desired.insert(lease_key.to_string(), ip);
            }
            None if current
                .get(lease_key)
                .is_some_and(|v| usable_ip(v, fam).is_ok()) => {}
            None => missing.push(fam),
        }
    }
    if !missing.is_empty() {
        // A lease flannel cannot parse (no public IP of a family it serves) is worse than none.
        plan.waiting = Some(Waiting::NoAddress(missing));
        return plan;
    }
    plan.changes = desired
        .into_iter()
        .filter(|(k, v)| current.get(k) != Some(v))
        .collect();
    plan
}

#[cfg(test)]
mod tests;
