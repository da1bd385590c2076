//! The leader before this one, when claims cannot cover what it may still be writing.
//!
//! Claims and the quarantine (`blocks.rs`, `startup.rs`) keep an earlier leader's late writes safe only if
//! that leader claimed what it handed out, from blocks this leader computes the same way: it ran with
//! `--pod-cidr-claims` and with the same cluster CIDRs and masks. A rolling upgrade that changes any of
//! them breaks that silently: a leader without claims leaves nothing to quarantine, and the round-robin
//! here starts at the lowest free CIDR — the ones its in-flight PATCHes carry. So the allocator reads the
//! predecessor's configuration, published on the Lease and read by the elector while taking it over
//! ([`netcm_manager::leader::Takeover`]), and when claims cannot cover it ([`judge`]) — claims were off,
//! other cluster CIDRs or masks, or nothing published — it hands out no CIDR until that leader can send
//! no more writes ([`Takeover::writes_may_land_until`]: the takeover plus its lease duration and the
//! fence's margin), and then until every write it already sent is void: it lists the Nodes consistently,
//! records every CIDR they hold, and touches each Node without pod CIDRs — the Nodes that leader could
//! have been writing to — as the claims quarantine does (`startup.rs`). Each of netcm's PATCHes tests the
//! fence annotation as its sender's cache saw it, so one a frozen API server delivers after the touch is
//! refused, however late; one that landed before it shows in the touch's answer and is recorded. The
//! wait alone is not enough: it bounds the writes that leader could still send, not one already on the
//! wire. Gauge `netcm_pod_cidr_predecessor_quarantine` is 1 meanwhile.
//!
//! The simplest safe rule: nothing at all is handed out after such a takeover until both are done, rare by
//! nature (a configuration change). A Node whose touch the API refuses for good (an admission policy, the
//! annotation size limit) gets a Warning Event, and `netcm_pod_cidr_predecessor_touch_refused_nodes`
//! counts such Nodes. One alone is allocated first, before any worker starts, once every other Node is
//! touched, recorded or gone ([`Allocator::serve_untouchable_first`]): its own PATCH stands in for the
//! touch. Two or more keep allocation held until all but one have pod CIDRs, are gone, or can be touched:
//! a CIDR given to one may be on its way to another. A leader that itself runs without claims relies on
//! the fence alone, by its configuration, and does not wait.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use netcm_manager::leader::Takeover;
use netcm_manager::supervision::ControllerHealth;
use netcm_manager::{CachedNode, ControllerOptions, Prepared};
use prometheus::{IntGauge, Registry};
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, SyncError, NAME};
use crate::flags::Flags;
use crate::start_lists::FailingList;
use crate::startup::{Touch, CONCURRENT_TOUCHES};

/// The flags whose values two leaders must share for claims to cover the earlier one's writes: they
/// decide which CIDRs exist and how they are cut into blocks (a sized pool cuts them on its smallest
/// size: [`crate::blocks::block_of_sized`]).
const MUST_MATCH: [&str; 7] = [
    "--cluster-cidr",
    "--node-cidr-mask-size",
    "--node-cidr-mask-size-ipv4",
    "--node-cidr-mask-size-ipv6",
    netcm_ipam::FLAG_SIZE_FROM_PODS,
    netcm_ipam::FLAG_MIN_MASK_V4,
    netcm_ipam::FLAG_MAX_MASK_V4,
];

/// The value a flag added after the first release had before it existed: an earlier leader that does
/// not publish it ran with that, so upgrading with the feature off is no configuration change.
fn value_before_it_existed(flag: &str) -> Option<&'static str> {
    (flag == netcm_ipam::FLAG_SIZE_FROM_PODS).then_some("false")
}

/// Nodes per page of the consistent list read after the wait.
const PAGE: u32 = 500;

/// What the allocator does about the leader before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Claims and the quarantine cover it (or nobody led before): allocate as usual.
    Covered(&'static str),
    /// Hand out nothing until `until`, then record what the Nodes hold; `why` is logged.
    WaitOut {
        /// What claims cannot cover.
        why: String,
        /// When none of the earlier leader's writes can land any more.
        until: Instant,
    },
}

/// Decides from the earlier leader (`None`: nobody led before) and this leader's flags.
pub(crate) fn judge(takeover: Option<&Takeover>, ours: &Flags) -> Verdict {
    if !ours.pod_cidr_claims {
        return Verdict::Covered("this leader runs without claims and relies on the fence alone");
    }
    let Some(takeover) = takeover else {
        return Verdict::Covered("no earlier leader");
    };
    let wait = |why: String| Verdict::WaitOut {
        why,
        until: takeover.writes_may_land_until,
    };
    let Some(theirs) = &takeover.previous_configuration else {
        return wait("the earlier leader published no configuration on the Lease".into());
    };
    if !theirs.controllers.iter().any(|c| c == NAME)
        || theirs.flag("--allocate-node-cidrs") == Some("false")
    {
        return Verdict::Covered("the earlier leader did not allocate pod CIDRs");
    }
    if theirs.flag("--pod-cidr-claims") != Some("true") {
        return wait("the earlier leader ran without PodCIDRClaims".into());
    }
    let effective = ours.effective_config();
    let ours = |flag: &str| {
        effective
            .iter()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    for flag in MUST_MATCH {
        let (before, now) = (
            theirs.flag(flag).or_else(|| value_before_it_existed(flag)),
            ours(flag),
        );
        if before != now {
            return wait(format!(
                "the earlier leader ran with {flag}={}, this one with {flag}={}",
                before.unwrap_or(""),
                now.unwrap_or("")
            ));
        }
    }
    Verdict::Covered("the earlier leader ran with claims and the same cluster CIDRs and masks")
}

/// The gauges of waiting out an earlier leader.
#[derive(Clone)]
pub(crate) struct Gauges {
    /// `netcm_pod_cidr_predecessor_quarantine`: 1 while nothing is handed out.
    pub(crate) quarantine: IntGauge,
    /// `netcm_pod_cidr_predecessor_touch_refused_nodes`: Nodes without pod CIDRs whose touch the API
    /// refused for good in the last pass.
    pub(crate) touch_refused: IntGauge,
}

/// Registers [`Gauges`].
pub(crate) fn register_gauges(registry: &Registry) -> Result<Gauges, prometheus::Error> {
    let quarantine = IntGauge::new(
        "netcm_pod_cidr_predecessor_quarantine",
        "1 while no pod CIDR is handed out because the leader before ran with a configuration claims cannot cover (claims off, other cluster CIDRs or masks, or unknown) and one of its writes may still land.",
    )?;
    let touch_refused = IntGauge::new(
        "netcm_pod_cidr_predecessor_touch_refused_nodes",
        "Nodes without pod CIDRs whose touch the API refused for good (CIDRPredecessorTouchRefused) while no pod CIDR is handed out after a leader claims cannot cover: one alone is allocated first, then everyone else; two or more keep allocation held until all but one have pod CIDRs, are gone, or can be touched.",
    )?;
    registry.register(Box::new(quarantine.clone()))?;
    registry.register(Box::new(touch_refused.clone()))?;
    Ok(Gauges {
        quarantine,
        touch_refused,
    })
}

/// How waiting out an earlier leader ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WaitedOut {
    /// None of its writes can land on a Node without recorded pod CIDRs any more: allocate as usual.
    Over,
    /// Every Node without pod CIDRs is touched or gone but this one, whose touch the API refuses for
    /// good: it is allocated before any other ([`Allocator::serve_untouchable_first`]).
    AllBut(Untouchable),
    /// Shut down, or a list kept failing.
    Stopped(Prepared),
}

/// A Node without pod CIDRs whose touch the API refuses for good, as the list showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Untouchable {
    name: String,
    uid: String,
}

impl Allocator {
    /// Before the first allocation: when `verdict` says so, waits until the earlier leader can send no
    /// more writes, then records every CIDR the Nodes hold from a consistent list and voids the writes it
    /// may have in flight (retried until every Node is recorded, voided or gone — or all but one whose
    /// touch the API refuses for good, returned for [`Allocator::serve_untouchable_first`]; a list that
    /// keeps failing fails the replica: [`crate::start_lists`]).
    pub(crate) async fn wait_out_predecessor(
        &self,
        verdict: &Verdict,
        gauges: &Gauges,
        readiness: &ControllerHealth,
        shutdown: &CancellationToken,
    ) -> WaitedOut {
        let (why, until) = match verdict {
            Verdict::Covered(why) => {
                tracing::info!(
                    controller = NAME,
                    reason = why,
                    "the earlier leader's writes are covered by claims, or there was none"
                );
                return WaitedOut::Over;
            }
            Verdict::WaitOut { why, until } => (why, *until),
        };
        gauges.quarantine.set(1);
        tracing::warn!(controller = NAME, reason = %why, wait = ?until.saturating_duration_since(Instant::now()), "claims cannot cover what the earlier leader may still be writing: handing out no pod CIDR until none of its writes can land");
        tokio::select! {
            _ = shutdown.cancelled() => return WaitedOut::Stopped(Prepared::ShutDown),
            _ = tokio::time::sleep_until(until.into()) => {}
        }
        let mut failing = FailingList::new(
            "Nodes",
            readiness,
            self.metrics
                .start_list_failures
                .with_label_values(&["nodes"]),
        );
        let mut delay = Duration::from_millis(500);
        // One stamp for the term: a Node touched once is void for good, so a retry touches only the rest.
        let stamp = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut voided = HashSet::new();
        loop {
            match self.record_and_void(&stamp, &mut voided).await {
                Ok(mut pass) => {
                    failing.succeeded();
                    gauges.touch_refused.set(pass.refused.len() as i64);
                    match pass.refused.len() {
                        0 => {
                            tracing::info!(controller = NAME, nodes_with_cidrs = pass.recorded, nodes_touched = voided.len(), "the earlier leader's writes are over: recorded the pod CIDRs the nodes hold now and voided any write still on its way");
                            gauges.quarantine.set(0);
                            return WaitedOut::Over;
                        }
                        // Every other Node the earlier leader could have been writing to is touched, recorded
                        // or gone, so a write of its still on its way can land only on this one, whose pod
                        // CIDRs the API server sets once: of that PATCH and ours exactly one takes effect (a
                        // second with other CIDRs is refused as a change of pod CIDRs). No worker starts until
                        // this Node is read back and what it holds recorded (`serve_untouchable_first`), so no
                        // other Node is given a CIDR that write carried.
                        1 => {
                            if let Some(untouchable) = pass.refused.pop() {
                                tracing::warn!(controller = NAME, node = %untouchable.name, nodes_with_cidrs = pass.recorded, nodes_touched = voided.len(), "every node the earlier leader may still be writing to is voided but one whose touch the API refuses: it is given pod CIDRs before any other node");
                                return WaitedOut::AllBut(untouchable);
                            }
                        }
                        refused => tracing::warn!(controller = NAME, nodes_refused = refused, "the API refused to touch nodes the earlier leader may still be writing to: handing out no pod CIDR until all but one have pod CIDRs, are gone, or can be touched; retrying"),
                    }
                }
                Err(e) => {
                    if let Err(reason) = failing.failed(&e) {
                        return WaitedOut::Stopped(Prepared::Failed(reason));
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return WaitedOut::Stopped(Prepared::ShutDown),
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }

    /// Gives the one Node [`Allocator::wait_out_predecessor`] could not touch its pod CIDRs, before any
    /// worker starts, and returns once what landed on it is recorded (or it is gone): only then may other
    /// Nodes be allocated. Retried with backoff while it still has no pod CIDRs — our PATCH unanswered, or
    /// refused for another reason. Why this is safe: at [`WaitedOut::AllBut`]'s decision.
    pub(crate) async fn serve_untouchable_first(
        &self,
        untouchable: Untouchable,
        gauges: &Gauges,
        shutdown: &CancellationToken,
    ) -> Prepared {
        let Untouchable { name, uid } = untouchable;
        let mut delay = Duration::from_millis(500);
        loop {
            if let Err(e) = self.sync_node(&name).await {
                tracing::warn!(controller = NAME, node = %name, error = %e, "could not give pod CIDRs to the node the earlier leader may still be writing to; no other node is allocated meanwhile");
            }
            let written = self.state.lock().tracking.recorded(&name).written_uid;
            if written.as_deref() == Some(uid.as_str()) {
                break;
            }
            // Our PATCH failed or is unanswered: the Node itself says whether either write landed.
            match self.api.get_opt(&name).await {
                Ok(Some(live)) if live.metadata.uid.as_deref() == Some(uid.as_str()) => {
                    if !netcm_node::raw_pod_cidrs(&live).is_empty() {
                        self.record_touched(&name, &uid, &live).await;
                        break;
                    }
                }
                // Gone or re-created: a write tests the UID it was meant for and cannot land.
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(controller = NAME, node = %name, error = %e, "could not read the node the earlier leader may still be writing to; retrying")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Prepared::ShutDown,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(10));
        }
        tracing::info!(controller = NAME, node = %name, "the node the earlier leader may have been writing to holds pod CIDRs, recorded, or is gone: its writes are over");
        gauges.touch_refused.set(0);
        gauges.quarantine.set(0);
        Prepared::Ready
    }

    /// One pass over every Node, read page by page with a consistent list (no resourceVersion: etcd's
    /// present, whatever the informer has seen so far): records the CIDRs of each Node with pod CIDRs and
    /// touches each without, except those in `voided` (touched before, by UID), which gains the ones
    /// touched now. A touch's answer shows a late write that landed before it, and that CIDR is recorded.
    async fn record_and_void(
        &self,
        stamp: &str,
        voided: &mut HashSet<String>,
    ) -> Result<Pass, SyncError> {
        let mut pass = Pass::default();
        let mut continue_token = None;
        loop {
            let params = ListParams {
                limit: Some(PAGE),
                continue_token: continue_token.take(),
                ..ListParams::default()
            };
            let page = self
                .api
                .list(&params)
                .await
                .map_err(SyncError::VoidLateWrites)?;
            let mut to_touch = Vec::new();
            for node in &page.items {
                if let Some(cached) = cached(node) {
                    let raw: Vec<String> = cached.raw_pod_cidrs().map(str::to_string).collect();
                    let (name, uid) = (cached.name().to_string(), cached.uid().to_string());
                    self.record_existing(&cached, &name, &uid, &raw).await;
                    pass.recorded += 1;
                } else if let (Some(name), Some(uid)) =
                    (node.metadata.name.as_deref(), node.metadata.uid.as_deref())
                {
                    if !voided.contains(uid) {
                        to_touch.push((name.to_string(), uid.to_string()));
                    }
                }
            }
            for chunk in to_touch.chunks(CONCURRENT_TOUCHES) {
                self.guard.ensure_leader()?;
                let touched = futures::future::join_all(
                    chunk.iter().map(|(name, uid)| self.touch(name, uid, stamp)),
                )
                .await;
                for ((name, uid), touch) in chunk.iter().zip(touched) {
                    match touch? {
                        Touch::Answered(node) => {
                            if !netcm_node::raw_pod_cidrs(&node).is_empty() {
                                pass.recorded += 1;
                            }
                            self.record_touched(name, uid, &node).await;
                            voided.insert(uid.clone());
                        }
                        Touch::Gone => {
                            voided.insert(uid.clone());
                        }
                        Touch::Refused(node, e) => {
                            pass.refused.push(Untouchable {
                                name: name.clone(),
                                uid: uid.clone(),
                            });
                            self.say_touch_refused(name, &node, &e, "CIDRPredecessorTouchRefused", "a write of the earlier leader, which ran with a configuration claims cannot cover, may still land on it: no pod CIDR is handed out until it is the only such node, which is then given pod CIDRs before any other node").await;
                        }
                    }
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => continue_token = Some(next),
                None => return Ok(pass),
            }
        }
    }
}

/// What one pass of [`Allocator::record_and_void`] did.
#[derive(Debug, Default)]
struct Pass {
    /// Nodes whose pod CIDRs were recorded.
    recorded: usize,
    /// Nodes without pod CIDRs whose touch the API refused for good.
    refused: Vec<Untouchable>,
}

/// A listed Node with pod CIDRs, as the cache would hold it for recording; `None` without pod CIDRs
/// (or without a name and UID, which no served Node lacks).
fn cached(node: &Node) -> Option<CachedNode> {
    let name = node.metadata.name.as_deref()?;
    let uid = node.metadata.uid.as_deref()?;
    let spec = node.spec.as_ref()?;
    let list = spec.pod_cidrs.as_deref().unwrap_or_default();
    let mut builder = CachedNode::builder(
        name,
        uid,
        node.metadata.resource_version.as_deref().unwrap_or(""),
    );
    builder.pod_cidrs(list, spec.pod_cidr.as_deref());
    let cached = builder.build();
    let has_cidrs = cached.raw_pod_cidrs().len() > 0;
    has_cidrs.then_some(cached)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use netcm_manager::published::EffectiveConfiguration;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
    }

    fn flags(args: &[&str]) -> Flags {
        Cli::parse_from(std::iter::once("netcm").chain(args.iter().copied())).flags
    }

    fn takeover(published: Option<&Flags>, until: Instant) -> Takeover {
        Takeover {
            previous_holder: "a_1".into(),
            previous_configuration: published.map(|f| EffectiveConfiguration {
                identity: "a_1".into(),
                version: "0.1.0".into(),
                controllers: vec![NAME.into()],
                flags: f.effective_config().into_iter().collect(),
            }),
            writes_may_land_until: until,
            replaced: true,
        }
    }

    const CIDR: &str = "--cluster-cidr=10.0.0.0/22";

    #[test]
    fn a_leader_with_claims_waits_out_one_that_ran_without_them() {
        let until = Instant::now() + Duration::from_secs(18);
        let before = flags(&[CIDR, "--pod-cidr-claims=false"]);
        let verdict = judge(Some(&takeover(Some(&before), until)), &flags(&[CIDR]));
        assert!(
            matches!(&verdict, Verdict::WaitOut { why, until: u } if why.contains("without PodCIDRClaims") && *u == until),
            "{verdict:?}"
        );
    }

    #[test]
    fn other_cluster_cidrs_or_masks_or_nothing_published_are_waited_out_too() {
        let until = Instant::now();
        let ours = flags(&[CIDR, "--node-cidr-mask-size=24"]);
        for before in [
            flags(&["--cluster-cidr=10.0.0.0/16", "--node-cidr-mask-size=24"]),
            flags(&[CIDR, "--node-cidr-mask-size=26"]),
            flags(&[CIDR]),
        ] {
            let verdict = judge(Some(&takeover(Some(&before), until)), &ours);
            assert!(
                matches!(&verdict, Verdict::WaitOut { why, .. } if why.contains("the earlier leader ran with --")),
                "{verdict:?}"
            );
        }
        let verdict = judge(Some(&takeover(None, until)), &ours);
        assert!(
            matches!(&verdict, Verdict::WaitOut { why, .. } if why.contains("published no configuration")),
            "{verdict:?}"
        );
    }

    #[test]
    fn the_same_configuration_a_first_start_or_an_earlier_leader_that_did_not_allocate_is_covered()
    {
        let until = Instant::now();
        let ours = flags(&[CIDR]);
        let same = takeover(Some(&ours), until);
        assert!(matches!(judge(Some(&same), &ours), Verdict::Covered(_)));
        assert!(matches!(judge(None, &ours), Verdict::Covered(_)));
        let mut syncer_only = takeover(Some(&flags(&[CIDR, "--pod-cidr-claims=false"])), until);
        if let Some(c) = syncer_only.previous_configuration.as_mut() {
            c.controllers = vec!["node-annotation-syncer".into()];
        }
        assert!(matches!(
            judge(Some(&syncer_only), &ours),
            Verdict::Covered(_)
        ));
        let not_allocating = flags(&[CIDR, "--allocate-node-cidrs=false"]);
        assert!(matches!(
            judge(Some(&takeover(Some(&not_allocating), until)), &ours),
            Verdict::Covered(_)
        ));
    }

    #[test]
    fn an_earlier_leader_from_before_the_sizing_flags_is_covered_unless_this_one_sizes() {
        let until = Instant::now();
        let mut older = takeover(Some(&flags(&[CIDR])), until);
        if let Some(c) = older.previous_configuration.as_mut() {
            c.flags.retain(|flag, _| {
                !flag.contains("size-from-pods")
                    && !flag.ends_with("-min")
                    && !flag.ends_with("-max")
            });
        }
        assert!(matches!(
            judge(Some(&older), &flags(&[CIDR])),
            Verdict::Covered(_)
        ));
        let sized = flags(&[CIDR, "--node-cidr-size-from-pods"]);
        let verdict = judge(Some(&older), &sized);
        assert!(
            matches!(&verdict, Verdict::WaitOut { why, .. } if why.contains("--node-cidr-size-from-pods=false")),
            "{verdict:?}"
        );
        let other_bounds = flags(&[
            CIDR,
            "--node-cidr-size-from-pods",
            "--node-cidr-mask-size-ipv4-max=27",
        ]);
        let verdict = judge(Some(&takeover(Some(&sized), until)), &other_bounds);
        assert!(
            matches!(&verdict, Verdict::WaitOut { why, .. } if why.contains("--node-cidr-mask-size-ipv4-max=27")),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_leader_without_claims_relies_on_the_fence_and_does_not_wait() {
        let until = Instant::now();
        let ours = flags(&[CIDR, "--pod-cidr-claims=false"]);
        assert!(matches!(
            judge(Some(&takeover(None, until)), &ours),
            Verdict::Covered(_)
        ));
    }

    #[test]
    fn a_listed_node_is_recorded_with_the_cidrs_the_cache_would_hold() {
        let mut node = Node::default();
        node.metadata.name = Some("a".into());
        node.metadata.uid = Some("a1".into());
        assert!(cached(&node).is_none(), "no spec");
        node.spec = Some(Default::default());
        assert!(cached(&node).is_none(), "no pod CIDRs");
        if let Some(spec) = node.spec.as_mut() {
            spec.pod_cidr = Some("10.0.1.0/24".into());
        }
        let c = cached(&node).expect("pod CIDR from spec.podCIDR");
        assert_eq!(c.raw_pod_cidrs().collect::<Vec<_>>(), ["10.0.1.0/24"]);
        assert_eq!((c.name(), c.uid()), ("a", "a1"));
    }
}
