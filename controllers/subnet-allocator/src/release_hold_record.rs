//! How a release hold is written down so the next leader finds it: one annotation per held CIDR on the
//! PodCIDRClaim of the CIDR's block. The key names the CIDR, so writers of different CIDRs never touch
//! the same key; the value names the Node, its `spec.providerID` if it had one, when the hold ends, and
//! all of the Node's CIDRs (a dual-stack Node's two CIDRs lie in two blocks, each annotated with both, in
//! the Node's order).
//!
//! Annotations are removed when a hold ends on time. One that outlives its hold otherwise (given back,
//! handed out early, ended by a Node the API shows with the CIDR) is harmless: a new leader restores a hold
//! only if it has not ended and its CIDRs are free and still a valid allocation.
//!
//! Every field of a record, and the claim it sits on, is what any writer of PodCIDRClaims wrote: a new
//! leader takes a record only as far as [`restorable`] checks it — each of its CIDRs in the block of the
//! claim carrying it, the same record on every claim of its CIDRs, its `until` no later than a hold
//! this leader would start now — and restores it only if its CIDRs are free and still a valid
//! allocation ([`netcm_ipam::Pools::restore_release_hold`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

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

/// The release holds recorded in one claim's `annotations`, each with the CIDR its key names, skipping
/// (and naming) values that are not netcm's: bad data others wrote never stops the rest.
pub(crate) fn parse(
    annotations: &BTreeMap<String, String>,
) -> (Vec<(IpNet, ReleaseHoldRecord)>, Vec<String>) {
    let mut records = Vec::new();
    let mut unreadable = Vec::new();
    for (k, v) in annotations {
        if !k.starts_with(KEY_PREFIX) {
            continue;
        }
        let record = serde_json::from_str::<Wire>(v)
            .ok()
            .and_then(ReleaseHoldRecord::from_wire);
        let named = record
            .as_ref()
            .and_then(|r| r.cidrs.iter().find(|c| key(c) == *k).copied());
        match (record, named) {
            (Some(r), Some(cidr)) => records.push((cidr, r)),
            _ => unreadable.push(k.clone()),
        }
    }
    (records, unreadable)
}

/// Why a new leader did not take a record as written ([`restorable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Distrust {
    /// Not netcm's JSON, or under a key naming none of its CIDRs: ignored.
    Unreadable,
    /// The CIDR its key names lies outside the block of the claim carrying it: ignored.
    OutsideBlock,
    /// Another of its CIDRs' claims carries no such record (a dual-stack Node's two blocks): ignored.
    NotOnEveryBlock,
    /// Its `until` lies beyond now plus the configured hold: cut down to that.
    UntilBeyondHold,
}

impl Distrust {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Unreadable => "unreadable",
            Self::OutsideBlock => "outside_block",
            Self::NotOnEveryBlock => "not_on_every_block",
            Self::UntilBeyondHold => "until_beyond_hold",
        }
    }

    /// What the log says of it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Unreadable => "ignoring a release-hold annotation netcm cannot read",
            Self::OutsideBlock => {
                "ignoring a release-hold record for a CIDR outside the block of the PodCIDRClaim carrying it"
            }
            Self::NotOnEveryBlock => {
                "ignoring a release-hold record that the PodCIDRClaims of its other CIDRs do not carry"
            }
            Self::UntilBeyondHold => {
                "a release-hold record ends later than --cidr-release-hold from now; restored only that long"
            }
        }
    }
}

/// A record a new leader did not take as written: on the claim of `claim`, under `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub claim: IpNet,
    pub key: String,
    pub why: Distrust,
}

/// One claim as [`restorable`] reads it: its range and its annotations.
pub(crate) type ClaimAnnotations<'a> = (IpNet, &'a BTreeMap<String, String>);

/// The records a new leader may restore at `now`, with `hold` its `--cidr-release-hold`: per Node name,
/// the candidates best first, each with its `until` cut to `now + hold` at most; and every record it
/// did not take as written.
///
/// A name may have several records: one an earlier leader left behind (its hold given back, handed out
/// or ended otherwise, and the annotation not removed) and its latest. Which is live cannot be told from
/// anything a claim writer could not write too — the record, the claim's term, the claim itself are all
/// theirs to write — so the order is what holds for records netcm wrote: a leader starts a name's holds
/// one after another, each ending `--cidr-release-hold` after it started, so the latest `until` is the
/// latest hold. Cut to `now + hold` first, so a forged far-off `until` gains nothing over a live record;
/// among equals a record that needed no cut goes first. A candidate whose CIDRs are held or no longer
/// valid is not restored, and the next is tried: a stale record never hides a live one.
pub(crate) fn restorable(
    claims: &[ClaimAnnotations<'_>],
    now: jiff::Timestamp,
    hold: Duration,
) -> (Vec<Vec<(ReleaseHoldRecord, jiff::Timestamp)>>, Vec<Finding>) {
    let mut findings = Vec::new();
    // Each CIDR's records, as carried by claims whose block holds it.
    let mut carried: HashMap<IpNet, Vec<ReleaseHoldRecord>> = HashMap::new();
    let mut keyed = Vec::new();
    for &(block, annotations) in claims {
        let (records, unreadable) = parse(annotations);
        findings.extend(unreadable.into_iter().map(|key| Finding {
            claim: block,
            key,
            why: Distrust::Unreadable,
        }));
        for (cidr, record) in records {
            if !block.contains(&cidr) {
                findings.push(Finding {
                    claim: block,
                    key: key(&cidr),
                    why: Distrust::OutsideBlock,
                });
                continue;
            }
            carried.entry(cidr).or_default().push(record.clone());
            keyed.push((block, cidr, record));
        }
    }
    let latest = now.checked_add(hold).unwrap_or(jiff::Timestamp::MAX);
    let mut by_name: BTreeMap<String, Vec<(ReleaseHoldRecord, jiff::Timestamp, bool)>> =
        BTreeMap::new();
    for (block, cidr, record) in keyed {
        let on_every_block = record
            .cidrs
            .iter()
            .all(|c| carried.get(c).is_some_and(|rs| rs.contains(&record)));
        if !on_every_block {
            findings.push(Finding {
                claim: block,
                key: key(&cidr),
                why: Distrust::NotOnEveryBlock,
            });
            continue;
        }
        if record.until <= now {
            continue;
        }
        let cut = record.until > latest;
        if cut {
            findings.push(Finding {
                claim: block,
                key: key(&cidr),
                why: Distrust::UntilBeyondHold,
            });
        }
        let candidates = by_name.entry(record.node.clone()).or_default();
        // A dual-stack record sits on two claims: one candidate.
        if !candidates.iter().any(|(r, _, _)| *r == record) {
            candidates.push((record.clone(), record.until.min(latest), cut));
        }
    }
    let ordered = by_name
        .into_values()
        .map(|mut candidates| {
            candidates.sort_by(|a, b| {
                b.1.cmp(&a.1)
                    .then(a.2.cmp(&b.2))
                    .then_with(|| a.0.cidrs.cmp(&b.0.cidrs))
            });
            candidates
                .into_iter()
                .map(|(r, until, _)| (r, until))
                .collect()
        })
        .collect();
    (ordered, findings)
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
        assert_eq!(records, vec![(record.cidrs[0], record)]);
        assert_eq!(
            unreadable,
            vec![
                format!("{KEY_PREFIX}v4-10.0.8.0-24"),
                format!("{KEY_PREFIX}v4-10.0.9.0-24")
            ]
        );
    }

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn rec(node: &str, until: &str, cidrs: &[&str]) -> ReleaseHoldRecord {
        ReleaseHoldRecord {
            node: node.into(),
            provider_id: None,
            until: at(until),
            cidrs: cidrs.iter().map(|c| net(c)).collect(),
        }
    }

    fn carrying(records: &[&ReleaseHoldRecord], keyed_by: usize) -> BTreeMap<String, String> {
        records
            .iter()
            .map(|r| (key(&r.cidrs[keyed_by]), value(r)))
            .collect()
    }

    const NOW: &str = "2026-12-01T10:00:00Z";
    const HOLD: Duration = Duration::from_secs(3600);

    #[test]
    fn a_dual_stack_record_counts_only_on_the_claims_of_both_its_blocks() {
        let both = rec(
            "a",
            "2026-12-01T10:30:00Z",
            &["10.0.1.0/24", "fd00:0:0:1::/64"],
        );
        let half = rec(
            "b",
            "2026-12-01T10:30:00Z",
            &["10.0.2.0/24", "fd00:0:0:2::/64"],
        );
        let v4 = carrying(&[&both, &half], 0);
        let v6 = carrying(&[&both], 1);
        let claims = [(net("10.0.0.0/16"), &v4), (net("fd00::/48"), &v6)];
        let (restorable, findings) = restorable(&claims, at(NOW), HOLD);
        assert_eq!(restorable, vec![vec![(both.clone(), both.until)]]);
        assert_eq!(
            findings,
            vec![Finding {
                claim: net("10.0.0.0/16"),
                key: key(&half.cidrs[0]),
                why: Distrust::NotOnEveryBlock
            }]
        );
    }

    #[test]
    fn a_record_for_a_cidr_outside_its_claims_block_is_ignored_and_an_ended_one_skipped() {
        let outside = rec("x", "2026-12-01T10:30:00Z", &["10.9.0.0/24"]);
        let ended = rec("y", "2026-12-01T09:59:59Z", &["10.0.3.0/24"]);
        let on_claim = carrying(&[&outside, &ended], 0);
        let claims = [(net("10.0.0.0/16"), &on_claim)];
        let (restorable, findings) = restorable(&claims, at(NOW), HOLD);
        assert!(restorable.is_empty(), "{restorable:?}");
        assert_eq!(
            findings,
            vec![Finding {
                claim: net("10.0.0.0/16"),
                key: key(&outside.cidrs[0]),
                why: Distrust::OutsideBlock
            }]
        );
    }

    #[test]
    fn a_names_records_come_latest_first_each_cut_to_one_hold_from_now_and_an_uncut_one_first_among_equals(
    ) {
        let stale = rec("a", "2026-12-01T10:20:00Z", &["10.0.1.0/24"]);
        let live = rec("a", "2026-12-01T10:50:00Z", &["10.0.2.0/24"]);
        let forged = rec("a", "2031-01-01T00:00:00Z", &["10.0.3.0/24"]);
        let at_limit = rec("a", "2026-12-01T11:00:00Z", &["10.0.4.0/24"]);
        // The stale one sits on the claim that sorts first, and its key sorts first.
        let first = carrying(&[&stale], 0);
        let second = carrying(&[&live, &forged, &at_limit], 0);
        let claims = [(net("10.0.0.0/16"), &first), (net("10.0.0.0/16"), &second)];
        let (restorable, findings) = restorable(&claims, at(NOW), HOLD);
        let limit = at("2026-12-01T11:00:00Z");
        assert_eq!(
            restorable,
            vec![vec![
                (at_limit.clone(), limit),
                (forged.clone(), limit),
                (live.clone(), live.until),
                (stale.clone(), stale.until),
            ]]
        );
        assert_eq!(
            findings.iter().map(|f| f.why).collect::<Vec<_>>(),
            [Distrust::UntilBeyondHold]
        );
    }
}
