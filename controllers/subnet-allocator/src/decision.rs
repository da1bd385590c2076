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
}
