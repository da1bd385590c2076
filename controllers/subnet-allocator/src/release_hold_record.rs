//! How a release hold is written down so the next leader finds it: one annotation per held CIDR on the
//! PodCIDRClaim of the CIDR's block. The key names the CIDR, so writers of different CIDRs never touch
//! the same key; the value names the Node, its `spec.providerID` if it had one, when the hold ends, and
//! all of the Node's CIDRs (a dual-stack Node's two CIDRs lie in two blocks, each annotated with both, in
//! the Node's order).
//!
//! Annotations are removed when a hold ends on time. One that outlives its hold otherwise (given back,
//! handed out early, ended by a Node the API shows with the CIDR) is harmless: a new leader restores a hold
//! only if it has not ended and its CIDRs are free and still a valid allocation.

use std::collections::BTreeMap;

use ipnet::IpNet;

/// The annotations' prefix on a PodCIDRClaim.
pub(crate) const KEY_PREFIX: &str = "release-hold.ipam.netcm.io/";

/// A release hold as written on a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReleaseHoldRecord {
    /// The deleted Node's name.
    pub node: String,
    /// The deleted Node's `spec.providerID`, if it had one.
    pub provider_id: Option<String>,
    /// When the hold ends.
    pub until: jiff::Timestamp,
    /// Every CIDR the Node held, in its order.
    pub cidrs: Vec<IpNet>,
}

/// The value's JSON shape.
#[derive(serde::Serialize, serde::Deserialize)]
struct Wire {
    node: String,
    // Absent in records of leaders before providerIDs were kept, and for Nodes without one.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    provider_id: Option<String>,
    until: String,
    cidrs: Vec<String>,
}

impl ReleaseHoldRecord {
    fn from_wire(w: Wire) -> Option<ReleaseHoldRecord> {
        Some(ReleaseHoldRecord {
            node: w.node,
            provider_id: w.provider_id.filter(|id| !id.is_empty()),
            until: w.until.parse().ok()?,
            cidrs: w
                .cidrs
                .iter()
                .map(|c| c.parse::<IpNet>().ok().map(|c| c.trunc()))
                .collect::<Option<_>>()?,
        })
    }
}

/// The annotation key of `cidr`: `v4-10.0.1.0-24`, `v6-fd00..-64` (`/` and `:` are not allowed in a
/// key's name part, which is at most 63 characters: an IPv6 CIDR needs 46 at most).
pub(crate) fn key(cidr: &IpNet) -> String {
    let family = match cidr {
        IpNet::V4(_) => "v4",
        IpNet::V6(_) => "v6",
    };
    let text = cidr.trunc().to_string().replace('/', "-").replace(':', ".");
    format!("{KEY_PREFIX}{family}-{text}")
}

/// The annotation value of `record`.
pub(crate) fn value(record: &ReleaseHoldRecord) -> String {
    serde_json::json!(Wire {
        node: record.node.clone(),
        provider_id: record.provider_id.clone(),
        until: record.until.to_string(),
        cidrs: record.cidrs.iter().map(ToString::to_string).collect(),
    })
    .to_string()
}

/// The release holds recorded in one claim's `annotations`, skipping (and naming) values that are not
/// netcm's: bad data others wrote never stops the rest.
pub(crate) fn parse(
    annotations: &BTreeMap<String, String>,
) -> (Vec<ReleaseHoldRecord>, Vec<String>) {
    let mut records = Vec::new();
    let mut unreadable = Vec::new();
    for (k, v) in annotations {
        if !k.starts_with(KEY_PREFIX) {
            continue;
        }
        let record = serde_json::from_str::<Wire>(v)
            .ok()
            .and_then(ReleaseHoldRecord::from_wire);
        match record {
            Some(r) if !r.cidrs.is_empty() && r.cidrs.iter().any(|c| key(c) == *k) => {
                records.push(r)
            }
            _ => unreadable.push(k.clone()),
        }
    }
    (records, unreadable)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn keys_are_valid_annotation_names_for_every_family() {
        let longest = net("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120");
        for (cidr, want) in [
            (net("10.0.1.0/24"), "v4-10.0.1.0-24"),
            (net("fd00::/64"), "v6-fd00..-64"),
            (longest, "v6-ffff.ffff.ffff.ffff.ffff.ffff.ffff.ff00-120"),
        ] {
            let k = key(&cidr);
            let name = k.strip_prefix(KEY_PREFIX).unwrap();
            assert_eq!(name, want);
            assert!(name.len() <= 63, "{name}");
            assert!(name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
            assert!(name.starts_with(|c: char| c.is_ascii_alphanumeric()));
            assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_others_values_are_named_not_fatal() {
        let record = ReleaseHoldRecord {
            node: "node-b".into(),
            provider_id: Some("aws:///us-east-1a/i-0b".into()),
            until: "2026-11-26T05:00:00Z".parse().unwrap(),
            cidrs: vec![net("10.0.1.0/24"), net("fd00:0:0:1::/64")],
        };
        let mut annotations = BTreeMap::new();
        annotations.insert(key(&record.cidrs[0]), value(&record));
        annotations.insert(format!("{KEY_PREFIX}v4-10.0.9.0-24"), "not json".into());
        // A record under a key that names none of its CIDRs was not written by netcm.
        annotations.insert(format!("{KEY_PREFIX}v4-10.0.8.0-24"), value(&record));
        annotations.insert("other.example.com/x".into(), "y".into());
        let (records, unreadable) = parse(&annotations);
        assert_eq!(records, vec![record]);
        assert_eq!(
            unreadable,
            vec![
                format!("{KEY_PREFIX}v4-10.0.8.0-24"),
                format!("{KEY_PREFIX}v4-10.0.9.0-24")
            ]
        );
    }
}
