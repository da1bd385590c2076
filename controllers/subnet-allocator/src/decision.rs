//! The allocator's decision step, pure: given what the cache shows of a Node and what the allocator has
//! recorded for that name, what to do. Records are keyed by Node UID: a Node deleted and re-created
//! under the same name is a new Node and inherits nothing.

/// What the cache shows of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.podCIDRs` (else `spec.podCIDR`), unparsed.
    pub pod_cidrs: Vec<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

/// What the allocator has recorded for a Node name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The UID whose CIDRs (held or pending) the ledger keeps under this name, if any.
    pub uid: Option<String>,
    /// The UID whose PATCH succeeded but which the cache does not show yet, if any.
    pub written_uid: Option<String>,
}

/// The action a sync takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The Node is gone: release what its record holds.
    Release,
    /// The Node has pod CIDRs: record them (and report bad data).
    Record,
    /// Nothing to do (being deleted with no CIDRs, or nothing recorded for a gone Node).
    Nothing,
    /// netcm's PATCH for this very Node succeeded; the cache has not caught up. Writing again would be
    /// a second write of the same allocation.
    AwaitCache,
    /// Allocate CIDRs and write them.
    Allocate,
}

/// A sync's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// A record of an earlier Node under the same name (its UID) to release first.
    pub release_previous: Option<String>,
    /// Then this.
    pub action: Action,
}

/// Decides one sync. `node` is the cached Node of the name, `recorded` the allocator's records for it.
pub fn decide(node: Option<&NodeFacts>, recorded: &Recorded) -> Decision {
    let Some(node) = node else {
        let action = if recorded.uid.is_some() {
            Action::Release
        } else {
            Action::Nothing
        };
        return Decision {
            release_previous: None,
            action,
        };
    };
    let release_previous = recorded.uid.clone().filter(|uid| *uid != node.uid);
    let action = if !node.pod_cidrs.is_empty() {
        Action::Record
    } else if node.deleting {
        Action::Nothing
    } else if recorded.written_uid.as_deref() == Some(node.uid.as_str()) {
        Action::AwaitCache
    } else {
        Action::Allocate
    };
    Decision {
        release_previous,
        action,
    }
}

/// How netcm's PATCH of a Node's pod CIDRs failed, when the Node may still be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedWrite {
    /// 409: the write conflicted with another.
    Conflict,
    /// 400, 403, 422: the API refused it for good.
    Refused,
}

/// What a read of the Node shows after netcm's PATCH failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveNode {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.podCIDRs` (else `spec.podCIDR`), unparsed.
    pub pod_cidrs: Vec<String>,
    /// The fence annotation (or whether the Node has annotations) differs from what the PATCH tested.
    pub fence_moved: bool,
}

/// What becomes of an allocation whose PATCH failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailedWrite {
    /// The Node holds exactly the CIDRs netcm chose: an earlier attempt landed unseen. They stay recorded.
    Written,
    /// The Node is gone or was re-created: release.
    NodeGone,
    /// The Node got other CIDRs from elsewhere: release ours; the cache's update records theirs.
    OtherCidrs,
    /// A leader touched the Node after the cache saw it: release and retry from the newer Node.
    FenceMoved,
    /// A conflict nothing above explains: release and retry.
    Retry,
    /// Refused for good: release, warn, back off.
    Refused,
}

/// Decides what a failed PATCH of `chosen` for the Node `uid` leaves recorded, from `live`, the Node as
/// the API shows it after the failure (`None`: gone).
pub fn after_failed_write(
    failure: FailedWrite,
    live: Option<&LiveNode>,
    uid: &str,
    chosen: &[String],
) -> AfterFailedWrite {
    let Some(live) = live.filter(|n| n.uid == uid) else {
        return AfterFailedWrite::NodeGone;
    };
    if same_networks(&live.pod_cidrs, chosen) {
        AfterFailedWrite::Written
    } else if !live.pod_cidrs.is_empty() {
        AfterFailedWrite::OtherCidrs
    } else if live.fence_moved {
        AfterFailedWrite::FenceMoved
    } else if failure == FailedWrite::Conflict {
        AfterFailedWrite::Retry
    } else {
        AfterFailedWrite::Refused
    }
}

/// Whether two non-empty lists of CIDRs name the same networks in the same order (however written).
fn same_networks(a: &[String], b: &[String]) -> bool {
    let net = |s: &String| s.trim().parse::<ipnet::IpNet>().ok().map(|n| n.trunc());
    !a.is_empty()
        && a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| net(x).is_some() && net(x) == net(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(uid: &str, cidrs: &[&str]) -> NodeFacts {
        NodeFacts {
            uid: uid.into(),
            pod_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            deleting: false,
        }
    }

    fn recorded(uid: Option<&str>, written: Option<&str>) -> Recorded {
        Recorded {
            uid: uid.map(Into::into),
            written_uid: written.map(Into::into),
        }
    }

    #[test]
    fn a_node_recreated_under_its_name_releases_the_old_record_and_is_allocated_afresh() {
        let d = decide(Some(&facts("a2", &[])), &recorded(Some("a1"), Some("a1")));
        assert_eq!(d.release_previous.as_deref(), Some("a1"));
        assert_eq!(d.action, Action::Allocate);
    }

    #[test]
    fn a_recreated_node_that_already_has_cidrs_releases_the_old_record_and_records_the_new() {
        let d = decide(
            Some(&facts("a2", &["10.0.0.0/24"])),
            &recorded(Some("a1"), None),
        );
        assert_eq!(d.release_previous.as_deref(), Some("a1"));
        assert_eq!(d.action, Action::Record);
    }

    #[test]
    fn a_pending_allocation_of_the_same_node_is_kept_and_retried() {
        let d = decide(Some(&facts("a1", &[])), &recorded(Some("a1"), None));
        assert_eq!(d.release_previous, None);
        assert_eq!(d.action, Action::Allocate);
    }

    #[test]
    fn a_written_allocation_the_cache_has_not_shown_yet_is_not_written_again() {
        let d = decide(Some(&facts("a1", &[])), &recorded(Some("a1"), Some("a1")));
        assert_eq!(d.action, Action::AwaitCache);
    }

    #[test]
    fn a_gone_node_releases_its_record_and_an_unknown_one_does_nothing() {
        assert_eq!(
            decide(None, &recorded(Some("a1"), None)).action,
            Action::Release
        );
        assert_eq!(decide(None, &recorded(None, None)).action, Action::Nothing);
    }

    #[test]
    fn a_node_being_deleted_without_cidrs_gets_nothing() {
        let mut f = facts("a1", &[]);
        f.deleting = true;
        assert_eq!(
            decide(Some(&f), &Recorded::default()).action,
            Action::Nothing
        );
    }

    fn live(uid: &str, cidrs: &[&str], fence_moved: bool) -> LiveNode {
        LiveNode {
            uid: uid.into(),
            pod_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            fence_moved,
        }
    }

    fn chosen(cidrs: &[&str]) -> Vec<String> {
        cidrs.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn a_node_holding_the_cidrs_netcm_chose_keeps_them_recorded_whatever_the_retry_was_answered() {
        let ours = chosen(&["10.0.3.0/24", "fd00:0:0:3::/64"]);
        // An earlier attempt landed unseen; the retry met a conflict, a policy or the changed fence.
        let landed = live("a1", &["10.0.3.0/24", "fd00:0:0:3::/64"], false);
        for failure in [FailedWrite::Conflict, FailedWrite::Refused] {
            assert_eq!(
                after_failed_write(failure, Some(&landed), "a1", &ours),
                AfterFailedWrite::Written,
                "{failure:?}"
            );
        }
        // The API may print a CIDR otherwise than netcm did: compared as networks.
        let spelled = live("a1", &["10.0.3.0/24", "fd00::3:0:0:0:0/64"], true);
        assert_eq!(
            after_failed_write(FailedWrite::Refused, Some(&spelled), "a1", &ours),
            AfterFailedWrite::Written
        );
    }

    #[test]
    fn a_failed_write_releases_when_the_node_is_gone_or_holds_other_cidrs() {
        let ours = chosen(&["10.0.3.0/24"]);
        for failure in [FailedWrite::Conflict, FailedWrite::Refused] {
            assert_eq!(
                after_failed_write(failure, None, "a1", &ours),
                AfterFailedWrite::NodeGone
            );
            assert_eq!(
                after_failed_write(failure, Some(&live("a2", &[], false)), "a1", &ours),
                AfterFailedWrite::NodeGone,
                "re-created under its name"
            );
            for other in [
                &["10.0.4.0/24"][..],
                &["10.0.3.0/24", "fd00::/64"],
                &["bogus"],
            ] {
                assert_eq!(
                    after_failed_write(failure, Some(&live("a1", other, false)), "a1", &ours),
                    AfterFailedWrite::OtherCidrs,
                    "{other:?}"
                );
            }
            assert_eq!(
                after_failed_write(failure, Some(&live("a1", &[], true)), "a1", &ours),
                AfterFailedWrite::FenceMoved
            );
        }
    }

    #[test]
    fn an_unexplained_conflict_is_retried_and_an_unexplained_refusal_is_reported() {
        let ours = chosen(&["10.0.3.0/24"]);
        let bare = live("a1", &[], false);
        assert_eq!(
            after_failed_write(FailedWrite::Conflict, Some(&bare), "a1", &ours),
            AfterFailedWrite::Retry
        );
        assert_eq!(
            after_failed_write(FailedWrite::Refused, Some(&bare), "a1", &ours),
            AfterFailedWrite::Refused
        );
    }
}
