//! A test-side reader of flannel's kube-subnet-manager lease annotations, written from flannel's rules
//! (REFERENCE.md §3: `newAnnotations`, the handlers' `kube-subnet-manager == "true"` gate, `nodeToLease`,
//! `ip.ParseIP4` / `ip.ParseIP6`), independently of netcm's controller code. Tests compare what it reads
//! with what they expect, so a lease netcm writes is checked the way a flanneld peer would read it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

/// What flannel's `nodeToLease` produces for a peer Node: its subnet lease (flannel's `subnet.Lease`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubnetLease {
    /// `Attrs.PublicIP` (when IPv4 is enabled).
    pub public_ip: Option<Ipv4Addr>,
    /// `Attrs.BackendData`, raw JSON text.
    pub backend_data: Option<String>,
    /// `Subnet`.
    pub subnet: Option<IpNet>,
    /// `Attrs.PublicIPv6` (when IPv6 is enabled).
    pub public_ipv6: Option<Ipv6Addr>,
    /// `Attrs.BackendV6Data`, raw JSON text.
    pub backend_v6_data: Option<String>,
    /// `IPv6Subnet`.
    pub ipv6_subnet: Option<IpNet>,
    /// `Attrs.BackendType`.
    pub backend_type: String,
}

/// flannel's annotation prefix rule: no "/" → append one; a name part gets a trailing "-".
pub fn flannel_prefix(prefix: &str) -> String {
    let mut p = prefix.to_string();
    if !p.contains('/') {
        p.push('/');
    }
    if !p.ends_with('/') && !p.ends_with('-') {
        p.push('-');
    }
    p
}

/// Go's `net.ParseIP` then `To4()`: IPv4 text, or IPv4-mapped IPv6 text.
fn parse_ip4(s: &str) -> Result<Ipv4Addr, String> {
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => Ok(a),
        Ok(IpAddr::V6(a)) => a
            .to_ipv4_mapped()
            .ok_or_else(|| format!("{s:?} is not an IPv4 address")),
        Err(_) => Err(format!("Invalid IP address format: {s:?}")),
    }
}

/// Go's `net.ParseIP` then `To16()`: any IP; IPv4 becomes IPv4-mapped.
fn parse_ip6(s: &str) -> Result<Ipv6Addr, String> {
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => Ok(a.to_ipv6_mapped()),
        Ok(IpAddr::V6(a)) => Ok(a),
        Err(_) => Err(format!("Invalid IP address format: {s:?}")),
    }
}

/// nodeToLease's pod CIDR rule for one family: `spec.podCIDR` when `podCIDRs` is empty, else the first
/// entry of the family among at most two (any unparsable entry met first is an error).
fn subnet(node: &Node, v6: bool) -> Result<Option<IpNet>, String> {
    let spec = node.spec.clone().unwrap_or_default();
    let list = spec.pod_cidrs.unwrap_or_default();
    match list.len() {
        0 => {
            let raw = spec.pod_cidr.unwrap_or_default();
            let net: IpNet = raw
                .parse()
                .map_err(|_| format!("invalid CIDR address: {raw:?}"))?;
            Ok(Some(net))
        }
        1 | 2 => {
            for raw in &list {
                let net: IpNet = raw
                    .parse()
                    .map_err(|_| format!("invalid CIDR address: {raw:?}"))?;
                if matches!(net, IpNet::V6(_)) == v6 {
                    return Ok(Some(net.trunc()));
                }
            }
            Ok(None)
        }
        _ => Err("pod cidrs should be IPv4/IPv6 only or dualstack".into()),
    }
}

/// The lease a flanneld with the given `EnableIPv4`/`EnableIPv6` would build from `node`, or the reason
/// it would skip the Node ("Error turning node to lease", or not managed by a kube subnet manager).
pub fn node_to_lease(
    node: &Node,
    prefix: &str,
    enable_ipv4: bool,
    enable_ipv6: bool,
) -> Result<SubnetLease, String> {
    let p = flannel_prefix(prefix);
    let empty = Default::default();
    let ann = node.metadata.annotations.as_ref().unwrap_or(&empty);
    let get = |k: &str| ann.get(&format!("{p}{k}")).cloned().unwrap_or_default();
    if get("kube-subnet-manager") != "true" {
        return Err("not managed: kube-subnet-manager is not \"true\"".into());
    }
    let mut lease = SubnetLease::default();
    if enable_ipv4 {
        lease.public_ip = Some(parse_ip4(&get("public-ip"))?);
        lease.backend_data = Some(get("backend-data"));
        lease.subnet = Some(subnet(node, false)?.ok_or("no IPv4 pod CIDR")?);
    }
    if enable_ipv6 {
        lease.public_ipv6 = Some(parse_ip6(&get("public-ipv6"))?);
        lease.backend_v6_data = Some(get("backend-v6-data"));
        lease.ipv6_subnet = Some(subnet(node, true)?.ok_or("no IPv6 pod CIDR")?);
    }
    lease.backend_type = get("backend-type");
    Ok(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_ip_parsing_rules_are_followed() {
        assert_eq!(
            parse_ip4("::ffff:192.0.2.1"),
            Ok(Ipv4Addr::new(192, 0, 2, 1))
        );
        assert!(parse_ip4("2001:db8::1").is_err());
        assert!(parse_ip4("").is_err());
        assert!(parse_ip6("192.0.2.1").is_ok());
        assert_eq!(flannel_prefix("a.b"), "a.b/");
        assert_eq!(flannel_prefix("a.b/x"), "a.b/x-");
    }
}
