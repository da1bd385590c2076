//! Bad data on a Node — pod CIDRs that do not parse, lie outside every pool, overlap the service range
//! or another Node's — as Warning Events and the `netcm_node_cidr_conflicts` gauge. Pure: [`plan`]
//! decides from the pools and the tracked names what to publish and whom to flag; the allocator does it.

use std::collections::BTreeSet;
use std::time::Instant;

use netcm_ipam::{HoldFinding, Pools};
use netcm_node::UnparsableCidr;

use crate::tracking::Tracking;

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
}

/// Which Nodes have bad data now (the gauge counts them).
#[derive(Debug, Default)]
pub(crate) struct BadData {
    flagged: BTreeSet<String>,
}

impl BadData {
    /// How many Nodes have bad data now.
    pub(crate) fn flagged(&self) -> usize {
        self.flagged.len()
    }

    /// Forgets the Node `name` (gone or re-created).
    pub(crate) fn forget(&mut self, name: &str) {
        self.flagged.remove(name);
    }

    fn flag(&mut self, name: &str, bad: bool) {
        if bad {
            self.flagged.insert(name.to_string());
        } else {
            self.flagged.remove(name);
        }
    }
}

/// What to publish about the bad data of `node` (recorded in `pools` already), with the Nodes it names
/// flagged in `state`.
pub(crate) fn plan(
    pools: &Pools,
    tracking: &Tracking,
    state: &mut BadData,
    node: Subject<'_>,
    unparsable: &[UnparsableCidr],
    _now: Instant,
) -> Plan {
    let name = node.name;
    let findings: Vec<HoldFinding> = pools
        .findings_of(node.uid)
        .into_iter()
        .filter(|f| !matches!(f, HoldFinding::Conflict { other_node, .. } if is_reservation(other_node)))
        .collect();
    let mut plan = Plan {
        bad: !unparsable.is_empty() || !findings.is_empty(),
        ..Plan::default()
    };
    state.flag(name, plan.bad);
    for UnparsableCidr { raw: bad } in unparsable {
        plan.events.push(Planned {
            node: name.to_string(),
            reason: "CIDRInvalid",
            note: format!("node {name} has an unparsable pod CIDR {bad:?}; it is ignored and nothing is allocated over it"),
        });
    }
    for finding in findings {
        let (reason, other) = match &finding {
            HoldFinding::Conflict { other_node, .. } => {
                ("CIDRConflict", Some(tracking.display(other_node)))
            }
            HoldFinding::OutOfRange { .. } => ("CIDROutOfRange", None),
            HoldFinding::ServiceRangeOverlap { .. } => ("CIDRServiceRangeOverlap", None),
        };
        let shown = match (&finding, &other) {
            (
                HoldFinding::Conflict {
                    cidr, other_cidr, ..
                },
                Some(other),
            ) => format!("{cidr} overlaps {other_cidr} held by node {other}"),
            _ => finding.to_string(),
        };
        let note = format!("node {name}: {shown}; netcm keeps it reserved and never hands out an overlapping range");
        plan.events.push(Planned {
            node: name.to_string(),
            reason,
            note: note.clone(),
        });
        if let Some(other) = other {
            state.flag(&other, true);
            plan.events.push(Planned {
                node: other,
                reason,
                note,
            });
        }
    }
    plan
}
