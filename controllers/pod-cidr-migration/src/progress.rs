//! The planner's [`Progress`] as the PodCIDRMigration's status holds it (`status.nodes`), both ways.
//!
//! The status is the only memory a new leader has, so reading it back must give exactly what was
//! written; an entry someone else wrote that does not read is an error naming the Node, and the
//! controller then does nothing to that migration until it is mended (guessing a step could uncordon a
//! Node an operator cordoned, or delete one twice).

use std::collections::BTreeMap;

use jiff::Timestamp;
use netcm_api::pod_cidr_migration::{NodeStatus, StepName};

use crate::plan::{Failure, NodeStep, Progress};

/// An entry of `status.nodes` that does not read as a step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("status.nodes[{node}]: {why}")]
pub struct BadEntry {
    /// The Node the entry is for.
    pub node: String,
    /// What is wrong with it.
    pub why: String,
}

/// `status.nodes` for `progress`.
pub fn to_status(progress: &Progress) -> BTreeMap<String, NodeStatus> {
    progress
        .nodes
        .iter()
        .map(|(name, step)| (name.clone(), entry(step)))
        .collect()
}

fn entry(step: &NodeStep) -> NodeStatus {
    let base = |step, toward: &String, since: &Timestamp| NodeStatus {
        step,
        toward: toward.clone(),
        since: since.to_string(),
        uid: None,
        was_unschedulable: false,
        reason: None,
        pods_left: None,
        pools: None,
    };
    match step {
        NodeStep::Draining {
            uid,
            since,
            toward,
            was_unschedulable,
        } => NodeStatus {
            uid: Some(uid.clone()),
            was_unschedulable: *was_unschedulable,
            ..base(StepName::Draining, toward, since)
        },
        NodeStep::Registering {
            old_uid,
            since,
            toward,
            was_unschedulable,
        } => NodeStatus {
            uid: Some(old_uid.clone()),
            was_unschedulable: *was_unschedulable,
            ..base(StepName::Registering, toward, since)
        },
        NodeStep::Failed { toward, at, reason } => {
            let mut e = base(StepName::Failed, toward, at);
            e.reason = Some(failure_word(reason).to_string());
            match reason {
                Failure::DrainTimedOut { pods_left } => e.pods_left = Some(*pods_left as u64),
                Failure::OutsideDestination { pools } => {
                    e.pools = Some(
                        pools
                            .iter()
                            .map(|p| p.clone().unwrap_or_default())
                            .collect(),
                    )
                }
                Failure::NeverRegistered | Failure::NotAllocated => {}
            }
            e
        }
    }
}

/// The one word a failure is written as.
pub fn failure_word(f: &Failure) -> &'static str {
    match f {
        Failure::DrainTimedOut { .. } => "DrainTimedOut",
        Failure::NeverRegistered => "NeverRegistered",
        Failure::NotAllocated => "NotAllocated",
        Failure::OutsideDestination { .. } => "OutsideDestination",
    }
}

/// The progress `status.nodes` holds.
pub fn from_status(nodes: &BTreeMap<String, NodeStatus>) -> Result<Progress, BadEntry> {
    let mut progress = Progress::default();
    for (name, e) in nodes {
        let bad = |why: &str| BadEntry {
            node: name.clone(),
            why: why.to_string(),
        };
        let since: Timestamp = e
            .since
            .parse()
            .map_err(|_| bad("since is not an RFC 3339 time"))?;
        let uid = || e.uid.clone().ok_or_else(|| bad("uid is missing"));
        let step = match e.step {
            StepName::Draining => NodeStep::Draining {
                uid: uid()?,
                since,
                toward: e.toward.clone(),
                was_unschedulable: e.was_unschedulable,
            },
            StepName::Registering => NodeStep::Registering {
                old_uid: uid()?,
                since,
                toward: e.toward.clone(),
                was_unschedulable: e.was_unschedulable,
            },
            StepName::Failed => {
                let reason = match e.reason.as_deref() {
                    Some("DrainTimedOut") => Failure::DrainTimedOut {
                        pods_left: e.pods_left.unwrap_or(0) as usize,
                    },
                    Some("NeverRegistered") => Failure::NeverRegistered,
                    Some("NotAllocated") => Failure::NotAllocated,
                    Some("OutsideDestination") => Failure::OutsideDestination {
                        pools: e
                            .pools
                            .iter()
                            .flatten()
                            .map(|p| (!p.is_empty()).then(|| p.clone()))
                            .collect(),
                    },
                    _ => return Err(bad("reason is not a known failure")),
                };
                NodeStep::Failed {
                    toward: e.toward.clone(),
                    at: since,
                    reason,
                }
            }
        };
        progress.nodes.insert(name.clone(), step);
    }
    Ok(progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_reads_back_as_it_was_written() {
        let at: Timestamp = "2026-03-01T10:00:00Z".parse().expect("a time");
        let mut progress = Progress::default();
        let steps = [
            NodeStep::Draining {
                uid: "u1".into(),
                since: at,
                toward: "new".into(),
                was_unschedulable: true,
            },
            NodeStep::Registering {
                old_uid: "u2".into(),
                since: at,
                toward: "new".into(),
                was_unschedulable: false,
            },
            NodeStep::Failed {
                toward: "new".into(),
                at,
                reason: Failure::DrainTimedOut { pods_left: 3 },
            },
            NodeStep::Failed {
                toward: "new".into(),
                at,
                reason: Failure::OutsideDestination {
                    pools: vec![Some("old".into()), None],
                },
            },
            NodeStep::Failed {
                toward: "old".into(),
                at,
                reason: Failure::NeverRegistered,
            },
            NodeStep::Failed {
                toward: "old".into(),
                at,
                reason: Failure::NotAllocated,
            },
        ];
        for (i, step) in steps.into_iter().enumerate() {
            progress.nodes.insert(format!("n{i}"), step);
        }
        let wire = serde_json::to_value(to_status(&progress)).expect("serializes");
        let back = serde_json::from_value(wire).expect("parses");
        assert_eq!(from_status(&back), Ok(progress));
    }

    #[test]
    fn an_entry_that_does_not_read_names_its_node() {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            "n1".to_string(),
            NodeStatus {
                step: StepName::Draining,
                toward: "new".into(),
                since: "2026-03-01T10:00:00Z".into(),
                uid: None,
                was_unschedulable: false,
                reason: None,
                pods_left: None,
                pools: None,
            },
        );
        let err = from_status(&nodes).expect_err("no uid");
        assert_eq!(err.node, "n1");
        nodes.get_mut("n1").expect("entry").uid = Some("u".into());
        nodes.get_mut("n1").expect("entry").since = "yesterday".into();
        assert!(from_status(&nodes).is_err());
    }
}
