//! Bad data on a Node — pod CIDRs that do not parse, lie outside every pool, overlap the service range
//! or another Node's, or are wider than a node CIDR — as Warning Events and the
//! `netcm_node_cidr_conflicts` and `netcm_node_cidr_oversized` gauges. Pure: [`plan`] decides from the
//! pools and the tracked names what to publish and which Nodes to sync again ([`assess`] and
//! [`name_nodes`], each in its own turn of the allocator's state lock); the allocator does it.
//!
//! Bounded, because a kubelet can write such data and make its Node sync at will: every sync costs
//! what the Node itself holds ([`Pools::has_problems`]); only when its Events are due — once per Node
//! per [`WINDOW`] — does it count and name the Nodes involved ([`Pools::problems`]: the first
//! [`NAMED`], a visit bound of [`VISITED`]) and look up their names (one scan of the tracked Nodes).
//! Then one Event per kind of bad data (at most five) summarises the Node's own data — "overlaps N
//! Nodes, e.g. a, b, c" — never one per overlapping pair, and none on the other Nodes: each tells its
//! own side when it syncs (those sharing the blame are synced again for that).
//!
//! A pod CIDR wider than the node CIDRs of a pool it overlaps (a kubelet may register one:
//! NodeRestriction does not guard `spec.podCIDR`) is kept reserved whole, like every CIDR a Node
//! holds: the promise is that no two Nodes hold overlapping pod CIDRs, so netcm hands out no address
//! inside it, even when it covers the whole pool and every new Node waits. What netcm does instead is
//! make it loud: a `CIDROversized` Event on that Node naming how many node CIDRs it covers and which
//! Nodes it overlaps, the `netcm_node_cidr_oversized` gauge, the waiting Nodes' `CIDRNotAvailable`
//! Events naming it, and `netcm check`. The Nodes inside it are not to blame and get no Event.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use netcm_ipam::{Limits, Overlaps, Pools, Problems};
use netcm_node::UnparsableCidr;

use crate::tracking::Tracking;

/// How often a Node's bad data is published at most (one Event per kind): the Event recorder's window
/// for identical Events, so a Node whose data does not change reads as before.
pub(crate) const WINDOW: Duration = netcm_manager::events::DEDUP_WINDOW;

/// Overlapping Nodes named in an Event.
pub(crate) const NAMED: usize = 3;

/// Overlapping holdings visited per pod CIDR when an Event is made: past it, the count is "at least".
pub(crate) const VISITED: usize = 10_000;

/// Whether a ledger owner is a reservation (the quarantine of earlier leaders' blocks), not a Node.
pub(crate) fn is_reservation(owner: &str) -> bool {
    owner.starts_with("claim:")
}

/// The Node a plan is made for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Subject<'a> {
    /// Its name.
    pub(crate) name: &'a str,
    /// Its UID: its owner name in the ledger.
    pub(crate) uid: &'a str,
}

/// A Warning Event to publish about a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    /// The Node it is about.
    pub(crate) node: String,
    /// Its reason.
    pub(crate) reason: &'static str,
    /// Its note.
    pub(crate) note: String,
}

/// What to do about the bad data of one Node.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Warning Events, in order.
    pub(crate) events: Vec<Planned>,
    /// Whether the Node has bad data now.
    pub(crate) bad: bool,
    /// Nodes sharing the blame for an overlap that are not flagged yet: synced again, so each
    /// reports its own side (a Node that has not changed is not synced otherwise).
    pub(crate) requeue: Vec<String>,
}

/// Which Nodes have bad data now (the gauges count them), and when each was last told.
#[derive(Debug, Default)]
pub(crate) struct BadData {
    flagged: BTreeSet<String>,
    oversized: BTreeSet<String>,
    /// Node → when its Events were last planned.
    published: HashMap<String, Instant>,
    /// `published` is pruned of expired entries once it grows to this size.
    prune_at: usize,
}

/// The reasons a Node's bad data is published under, in the order they are published.
const REASONS: [&str; 5] = [
    "CIDRInvalid",
    "CIDROversized",
    "CIDRConflict",
    "CIDROutOfRange",
    "CIDRServiceRangeOverlap",
];

impl BadData {
    /// How many Nodes have bad data now.
    pub(crate) fn flagged(&self) -> usize {
        self.flagged.len()
    }

    /// How many Nodes hold a pod CIDR wider than the node CIDRs of a pool it overlaps.
    pub(crate) fn oversized(&self) -> usize {
        self.oversized.len()
    }

    /// Up to `n` of the Nodes holding an oversized pod CIDR, by name.
    pub(crate) fn oversized_nodes(&self, n: usize) -> Vec<&str> {
        self.oversized.iter().take(n).map(String::as_str).collect()
    }

    /// Forgets the Node `name` (gone, re-created or clean).
    pub(crate) fn forget(&mut self, name: &str) {
        self.flagged.remove(name);
        self.oversized.remove(name);
        self.published.remove(name);
    }

    /// Whether the Events about `name` are due at `now`; if so, records them as published.
    fn due(&mut self, name: &str, now: Instant) -> bool {
        if self
            .published
            .get(name)
            .is_some_and(|at| now.saturating_duration_since(*at) < WINDOW)
        {
            return false;
        }
        self.published.insert(name.to_string(), now);
        if self.published.len() >= self.prune_at {
            self.published
                .retain(|_, at| now.saturating_duration_since(*at) < WINDOW);
            self.prune_at = (2 * self.published.len()).max(1024);
        }
        true
    }
}

/// What to publish about the bad data of `node` (recorded in `pools` already) at `now`, with `state`
/// updated: [`assess`], then [`name_nodes`].
#[cfg(test)]
pub(crate) fn plan(
    pools: &Pools,
    tracking: &Tracking,
    state: &mut BadData,
    node: Subject<'_>,
    unparsable: &[UnparsableCidr],
    now: Instant,
) -> Plan {
    let assessed = assess(pools, state, node, unparsable, now);
    name_nodes(assessed, tracking, state, node, unparsable)
}

/// The first step of a plan, in the turn that records the Node: whether `node` has bad data (flagged in `state`),
/// and, if its Events are due at `now`, its problems. Costs what the Node holds, but for the bounded
/// [`Pools::problems`] once per window.
pub(crate) fn assess(
    pools: &Pools,
    state: &mut BadData,
    node: Subject<'_>,
    unparsable: &[UnparsableCidr],
    now: Instant,
) -> Assessed {
    let name = node.name;
    let bad = !unparsable.is_empty() || pools.has_problems(node.uid, is_reservation);
    if !bad {
        state.forget(name);
        return Assessed::default();
    }
    state.flagged.insert(name.to_string());
    let held = pools.held_by(node.uid).unwrap_or_default();
    if held.iter().any(|c| pools.oversized(c).is_some()) {
        state.oversized.insert(name.to_string());
    } else {
        state.oversized.remove(name);
    }
    let due = state.due(name, now).then(|| {
        let limits = Limits {
            named: NAMED,
            visited: VISITED,
        };
        pools.problems(node.uid, limits, is_reservation)
    });
    Assessed { bad, due }
}

/// What [`assess`] found.
#[derive(Debug, Default)]
pub(crate) struct Assessed {
    bad: bool,
    /// The problems, when the Node's Events are due.
    due: Option<Problems>,
}

/// The second step of a plan, in a turn of its own: the Events, naming the Nodes involved (one scan
/// of the tracked Nodes, when Events are due), and the Nodes to sync again.
pub(crate) fn name_nodes(
    assessed: Assessed,
    tracking: &Tracking,
    state: &BadData,
    node: Subject<'_>,
    unparsable: &[UnparsableCidr],
) -> Plan {
    let mut plan = Plan {
        bad: assessed.bad,
        ..Plan::default()
    };
    let Some(problems) = assessed.due else {
        return plan;
    };
    let name = node.name;
    let owners: Vec<&str> = [&problems.inside_oversized, &problems.conflicts]
        .into_iter()
        .flat_map(|o| o.named.iter().map(|n| n.other.as_str()))
        .collect();
    let names = tracking.names_of(&owners);
    let shown = |owner: &str| {
        names
            .get(owner)
            .cloned()
            .unwrap_or_else(|| owner.to_string())
    };
    plan.events = REASONS
        .into_iter()
        .filter_map(|reason| {
            let note = note(reason, name, unparsable, &problems, &shown)?;
            Some(Planned {
                node: name.to_string(),
                reason,
                note,
            })
        })
        .collect();
    plan.requeue = problems
        .conflicts
        .named
        .iter()
        .filter_map(|o| names.get(o.other.as_str()))
        .filter(|other| !state.flagged.contains(other.as_str()))
        .cloned()
        .collect();
    plan
}

/// The note of the Event of `reason` about `name`, if it has that kind of bad data.
fn note(
    reason: &'static str,
    name: &str,
    unparsable: &[UnparsableCidr],
    p: &Problems,
    shown: &impl Fn(&str) -> String,
) -> Option<String> {
    let list = |items: &mut dyn Iterator<Item = String>| items.collect::<Vec<_>>().join(", ");
    let note = match reason {
        "CIDRInvalid" => match unparsable {
            [] => return None,
            [one] => format!(
                "node {name} has an unparsable pod CIDR {:?}; it is ignored and nothing is allocated over it",
                one.raw
            ),
            many => format!(
                "node {name} has unparsable pod CIDRs {}; they are ignored and nothing is allocated over them",
                list(&mut many.iter().map(|u| format!("{:?}", u.raw)))
            ),
        },
        "CIDROversized" => {
            if p.oversized.is_empty() {
                return None;
            }
            let mut note = format!(
                "node {name}: {}; netcm keeps all of it reserved and hands out no address inside it",
                list(&mut p.oversized.iter().map(ToString::to_string))
            );
            if !p.inside_oversized.is_empty() {
                let _ = write!(
                    note,
                    "; it overlaps the pod CIDRs of {}",
                    nodes(&p.inside_oversized, shown)
                );
            }
            note.push_str(". Fix what wrote it (a kubelet's --pod-cidr?), then delete the Node so it registers again");
            note
        }
        "CIDRConflict" => match (p.conflicts.count, p.conflicts.named.first()) {
            (0, _) | (_, None) => return None,
            (1, Some(o)) if !p.conflicts.more => format!(
                "node {name}: {} overlaps {} held by node {}; netcm keeps it reserved and never hands out an overlapping range",
                o.cidr,
                o.other_cidr,
                shown(&o.other)
            ),
            _ => format!(
                "node {name}: its pod CIDRs overlap those of {}; netcm keeps them reserved and never hands out an overlapping range",
                nodes(&p.conflicts, shown)
            ),
        },
        "CIDROutOfRange" => {
            if p.out_of_range.is_empty() {
                return None;
            }
            format!(
                "node {name}: pod CIDR {} is not inside any cluster CIDR; netcm keeps it reserved and never hands out an overlapping range",
                list(&mut p.out_of_range.iter().map(ToString::to_string))
            )
        }
        "CIDRServiceRangeOverlap" => {
            if p.service_overlaps.is_empty() {
                return None;
            }
            format!(
                "node {name}: {}; netcm keeps it reserved and never hands out an overlapping range",
                list(&mut p
                    .service_overlaps
                    .iter()
                    .map(|(c, svc)| format!("pod CIDR {c} overlaps service range {svc}")))
            )
        }
        _ => return None,
    };
    Some(note)
}

/// "N Nodes, e.g. a (10.0.1.0/24), b (…)" for an Event's note.
fn nodes(o: &Overlaps, shown: &impl Fn(&str) -> String) -> String {
    let at_least = if o.more { "at least " } else { "" };
    let plural = if o.count == 1 { "" } else { "s" };
    let named: Vec<String> = o
        .named
        .iter()
        .map(|n| format!("{} ({})", shown(&n.other), n.other_cidr))
        .collect();
    format!(
        "{at_least}{} Node{plural}, e.g. {}",
        o.count,
        named.join(", ")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
