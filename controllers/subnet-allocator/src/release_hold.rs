//! The release hold in the allocator (`--cidr-release-hold`; the pools keep it, `netcm_ipam`'s
//! `pools/release_hold.rs`): a deleted Node's CIDRs are held rather than released, a task ends each hold
//! on time and wakes the Nodes waiting for a CIDR, and a CIDR handed out before its hold ended gets a
//! Warning Event on the Node that received it.
//!
//! Every hold that ends is counted (`netcm_pool_release_holds_ended_total{pool,reason}`), and one that
//! ends early — its CIDRs free or another Node's while routes elsewhere may still point at the deleted
//! Node — gets a Warning Event `CIDRReleaseHoldEnded` on that Node's name.
//!
//! Holds outlive this leader: each is written on the PodCIDRClaim of its CIDRs' blocks
//! ([`record`], below) and a new leader with the flag on restores the ones still running
//! before it hands anything out, as far as it trusts their records. Without claims
//! (`--pod-cidr-claims=false`) holds live in memory only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ObjectReference;
use netcm_ipam::{EndedReleaseHold, Pools, ReleaseHoldEnd, ReleaseHoldUse};
use netcm_manager::{CachedNode, EventType};
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, ReleaseReason, SyncError, NAME};
use crate::blocks::block_in;
use crate::claims::Claim;
use record::ReleaseHoldRecord;

impl Allocator {
    /// Releases what a deleted (or re-created) Node held: into the release hold when one is configured.
    pub(crate) async fn release_deleted(
        &self,
        name: &str,
        uid: &str,
    ) -> Result<Vec<IpNet>, SyncError> {
        let held_until = (!self.release_hold.is_zero()).then(|| Instant::now() + self.release_hold);
        self.release_until(name, uid, held_until, ReleaseReason::NodeDeleted)
            .await
    }

    /// Says how an allocation used the release hold: a Node given back its own CIDRs is logged; CIDRs
    /// handed out before their hold ended (the pool had nothing else free) get a Warning Event.
    pub(crate) async fn report_release_hold_use(
        &self,
        node: &CachedNode,
        name: &str,
        pool: &str,
        used: &ReleaseHoldUse,
    ) {
        if !used.early {
            if used.released_by == name {
                tracing::info!(
                    controller = NAME,
                    node = name,
                    pool,
                    "a node that came back under its name gets the pod CIDRs it held before"
                );
            } else {
                let provider_id = node.provider_id().unwrap_or_default();
                tracing::info!(controller = NAME, node = name, pool, released_by = %used.released_by, provider_id, "a node that came back on the same machine (spec.providerID) under another name gets the pod CIDRs its machine held before");
                // Its providerID is its own word (--cidr-release-hold-rejoin-by-provider-id): say so on it.
                let note = format!(
                    "This Node gets the pod CIDRs Node {} released, because it registered the same spec.providerID ({provider_id}) within --cidr-release-hold (--cidr-release-hold-rejoin-by-provider-id)",
                    used.released_by
                );
                self.recorder
                    .publish(
                        &node.object_ref(),
                        EventType::Normal,
                        "CIDRReleaseHoldRejoinedByProviderID",
                        "AllocateCIDR",
                        note,
                    )
                    .await;
            }
            return;
        }
        self.metrics.release_hold_cut_short(pool);
        let note = format!(
            "Pool {pool} had no free CIDR: this Node gets CIDRs that Node {} released less than {:?} ago (--cidr-release-hold); routes, neighbour entries and flannel leases elsewhere may still point at {}",
            used.released_by, self.release_hold, used.released_by
        );
        tracing::warn!(controller = NAME, node = name, pool, released_by = %used.released_by, "handed out pod CIDRs before their release hold ended: the pool had nothing else free");
        self.recorder
            .publish(
                &node.object_ref(),
                EventType::Warning,
                "CIDRReleaseHoldCutShort",
                "AllocateCIDR",
                note,
            )
            .await;
    }

    /// The block of each of `cidrs` (its claim carries the record).
    fn blocks_of(&self, cidrs: &[IpNet]) -> Vec<(IpNet, IpNet)> {
        let state = self.state.lock();
        cidrs
            .iter()
            .map(|c| (*c, block_in(&state.pools, *c)))
            .collect()
    }

    /// Writes the hold `name` just started for `cidrs` on their blocks' claims, so a new leader finds it.
    /// A failed write is logged: the hold goes on in this leader's memory.
    pub(crate) async fn record_release_hold(
        &self,
        name: &str,
        provider_id: Option<String>,
        cidrs: &[IpNet],
    ) {
        let Some(claims) = &self.claims else {
            return;
        };
        let Ok(until) = jiff::Timestamp::now().checked_add(self.release_hold) else {
            return;
        };
        let value = record::value(&ReleaseHoldRecord {
            node: name.to_string(),
            provider_id,
            until,
            cidrs: cidrs.to_vec(),
        });
        for (cidr, block) in self.blocks_of(cidrs) {
            let written = match self.guard.ensure_leader() {
                Ok(()) => claims
                    .annotate(&block, &record::key(&cidr), Some(&value))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = written {
                tracing::warn!(controller = NAME, node = name, cidr = %cidr, block = %block, %error, "could not record a release hold on its PodCIDRClaim: a new leader would not keep it");
            }
        }
    }

    /// Removes the records of holds that ended on time. Failures only leave a record a new leader
    /// will find ended.
    async fn forget_release_hold_records(&self, ended: &[(String, Vec<IpNet>)]) {
        let Some(claims) = &self.claims else {
            return;
        };
        for (name, cidrs) in ended {
            for (cidr, block) in self.blocks_of(cidrs) {
                if self.guard.ensure_leader().is_err() {
                    return;
                }
                if let Err(error) = claims.annotate(&block, &record::key(&cidr), None).await {
                    tracing::debug!(controller = NAME, node = %name, cidr = %cidr, %error, "could not remove an ended release hold's record; it is ignored once ended");
                }
            }
        }
    }

    /// Restores the holds earlier leaders recorded on `claims` that have not ended, before anything is
    /// handed out, as far as their records are trusted ([`record::restorable`]: a record outside its
    /// claim's block or missing from the claim of another of its CIDRs is ignored, an `until` beyond a
    /// hold started now is cut down, and a name's stale record never hides its live one). Each is checked
    /// again ([`netcm_ipam::Pools::restore_release_hold`]).
    pub(crate) fn restore_release_holds(&self, claims: &[Claim]) {
        let now = jiff::Timestamp::now();
        let listed: Vec<record::ClaimAnnotations<'_>> =
            claims.iter().map(|c| (c.cidr, &c.annotations)).collect();
        let (candidates, findings) = record::restorable(&listed, now, self.release_hold);
        self.say_distrusted(&findings);
        let mut restored = 0usize;
        let mut state = self.state.lock();
        let pools = &mut state.pools;
        for per_name in candidates {
            for (r, until) in per_name {
                let Ok(left) = Duration::try_from(now.duration_until(until)) else {
                    continue;
                };
                if left.is_zero() {
                    continue;
                }
                let until = Instant::now() + left;
                if pools.restore_release_hold(&r.node, r.provider_id.as_deref(), &r.cidrs, until) {
                    restored += 1;
                    break;
                }
            }
        }
        self.publish_usage(pools);
        drop(state);
        if restored > 0 {
            tracing::info!(
                controller = NAME,
                holds = restored,
                "restored the release holds earlier leaders recorded"
            );
            self.release_hold_started.notify_one();
        }
    }

    /// Counts every record not taken as written and logs the first few (a claim writer could leave
    /// thousands).
    fn say_distrusted(&self, findings: &[record::Finding]) {
        const LOGGED: usize = 16;
        for (i, f) in findings.iter().enumerate() {
            self.metrics.release_hold_record_distrusted(f.why.label());
            if i < LOGGED {
                tracing::warn!(controller = NAME, claim = %f.claim, annotation = %f.key, reason = f.why.label(), "{}", f.why.describe());
            }
        }
        if findings.len() > LOGGED {
            tracing::warn!(
                controller = NAME,
                records = findings.len(),
                "release-hold records not taken as written; the first are logged above, netcm_pod_cidr_release_hold_records_distrusted_total counts each"
            );
        }
    }

    /// Takes the holds that ended from `pools` (under the state lock), counts each, counts the CIDRs of
    /// each that went back into the pool as released, and publishes the pools' usage if any ended;
    /// returns those that ended early, for [`Allocator::report_ended_holds`] once the lock is dropped.
    pub(crate) fn take_ended_holds(&self, pools: &mut Pools) -> Vec<EndedReleaseHold> {
        let mut ended = pools.take_ended_release_holds();
        for e in &ended {
            self.metrics.release_hold_ended(&e.pool, e.why.label());
            // Released into the pool (a hand-out counts as a fresh allocation); not when the CIDRs
            // went straight to a Node.
            if !matches!(
                e.why,
                ReleaseHoldEnd::GivenBack | ReleaseHoldEnd::NodeHoldsCidr
            ) {
                for cidr in &e.cidrs {
                    if let Some((pool, cluster)) = pools.pool_of(*cidr) {
                        self.metrics.released(pool, &cluster.to_string());
                    }
                }
            }
        }
        if !ended.is_empty() {
            self.publish_usage(pools);
        }
        ended.retain(|e| e.why.is_early());
        ended
    }

    /// Says that each of `ended` (from [`Allocator::take_ended_holds`]) ended early: a warning and a
    /// Warning Event `CIDRReleaseHoldEnded` about the deleted Node's name, naming `to`, the Node whose sync
    /// ended it, if one did. Wakes the Nodes waiting for a CIDR when CIDRs came free.
    pub(crate) async fn report_ended_holds(&self, ended: Vec<EndedReleaseHold>, to: Option<&str>) {
        /// The most Events one batch publishes: a deleted ClusterCIDR may end thousands of holds in one
        /// pass, which must not wait on thousands of writes; the log and the metric have every one.
        const EVENTS: usize = 16;
        if ended.is_empty() {
            return;
        }
        let to = to.unwrap_or("another node");
        for (i, e) in ended.iter().enumerate() {
            let cidrs = e
                .cidrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let why = match e.why {
                ReleaseHoldEnd::HandedOut => format!(
                    "pool {} had nothing else free, and ending it made room for Node {to}",
                    e.pool
                ),
                ReleaseHoldEnd::NoLongerValid => format!(
                    "Node {to} came back as it, but they are no longer a valid allocation for it (its pools changed); it gets new ones"
                ),
                ReleaseHoldEnd::NodeHoldsCidr => format!(
                    "Node {to} holds one of them, as the API shows it, and what the API shows wins"
                ),
                ReleaseHoldEnd::PoolDeleted => {
                    format!("ClusterCIDR {} is being deleted", e.pool)
                }
                ReleaseHoldEnd::Replaced => format!(
                    "Node {} was deleted again, holding other CIDRs, which are held instead",
                    e.node
                ),
                ReleaseHoldEnd::Expired | ReleaseHoldEnd::GivenBack => continue,
            };
            tracing::warn!(controller = NAME, node = %e.node, cidrs, pool = %e.pool, reason = e.why.label(), why, "a release hold ended before its time");
            if i >= EVENTS {
                continue;
            }
            let note = format!(
                "The release hold (--cidr-release-hold) of pod CIDRs {cidrs} that Node {} released ended early: {why}. Routes, neighbour entries and flannel leases elsewhere may still point at {}",
                e.node, e.node
            );
            self.recorder
                .publish(
                    &held_node(&e.node),
                    EventType::Warning,
                    "CIDRReleaseHoldEnded",
                    "ReleaseCIDR",
                    note,
                )
                .await;
        }
        if ended.len() > EVENTS {
            tracing::warn!(
                controller = NAME,
                holds = ended.len(),
                events = EVENTS,
                "more release holds ended early at once than Events are published for; the log and netcm_pool_release_holds_ended_total have each"
            );
        }
        let freed = ended.iter().any(|e| {
            matches!(
                e.why,
                ReleaseHoldEnd::NoLongerValid
                    | ReleaseHoldEnd::PoolDeleted
                    | ReleaseHoldEnd::Replaced
            )
        });
        if freed {
            self.wake_waiting();
        }
    }

    /// Ends the release holds that are due; wakes the Nodes waiting for a CIDR when any ended.
    fn end_due_release_holds(&self) -> Vec<(String, Vec<IpNet>)> {
        let ended = {
            let mut state = self.state.lock();
            let pools = &mut state.pools;
            let ended = pools.end_release_holds(Instant::now());
            // Counted, their CIDRs as released, and published there; none ended early.
            self.take_ended_holds(pools);
            ended
        };
        if ended.is_empty() {
            return ended;
        }
        for (node, cidrs) in &ended {
            tracing::info!(controller = NAME, node = %node, cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(), "the release hold of a deleted node's pod CIDRs ended; they can be handed out again");
        }
        let freed: Vec<IpNet> = ended.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        self.wake_waiting_for(&freed);
        if let Some(changed) = &self.pools_changed {
            changed.notify_one();
        }
        ended
    }
}

/// What Events about the deleted Node `name` are about: the name alone (its UID is gone with it, and a
/// Node re-created under the name shows them too).
fn held_node(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// The task ending release holds on time, until `shutdown`.
pub(crate) async fn run(allocator: Arc<Allocator>, shutdown: CancellationToken) {
    loop {
        let next = allocator.state.lock().pools.next_release_hold_end();
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = allocator.release_hold_started.notified() => {}
            _ = sleep => {
                let ended = allocator.end_due_release_holds();
                allocator.forget_release_hold_records(&ended).await;
            }
        }
    }
}

// =================================================================================================
// How a hold is written down so the next leader finds it: the record on the PodCIDRClaim.
// =================================================================================================

pub(crate) mod record {
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
}
