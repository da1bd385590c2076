//! The rule that a relist never takes the cache back in time: a list older than the newest
//! resourceVersion the informer has seen is refused ([`Newest::admits`]).
//!
//! Comparing resourceVersions: the API calls them opaque — a client may only compare them for equality
//! and hand them back. But every API server backed by etcd3 (all built-in kinds, custom resources) makes
//! a resourceVersion the decimal etcd revision it was read or written at, one counter for the whole
//! cluster that only grows; the API server itself orders them that way (`resourceVersionMatch=NotOlderThan`,
//! "Too large resource version"), and so does client-go's watch cache. So two versions are compared as
//! `u64` when both parse, and not at all otherwise: then the list is accepted, as client-go accepts every
//! list. Such a server (an aggregated API with versions of its own) gets no protection from this check,
//! only from the consistent read every list already is ([`super::initial_list`]). A version that does
//! not parse is never taken as "older" — refusing every list from such a server would stop the cache.

/// The newest resourceVersion seen (from lists, watch events and bookmarks), as an etcd revision.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Newest(Option<u64>);

/// A list of `listed`, older than `seen`, a version the informer had already seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a list of resourceVersion {listed} is older than resourceVersion {seen}, already seen")]
pub struct OlderThanSeen {
    /// The list's resourceVersion.
    pub listed: u64,
    /// The newest resourceVersion seen before it.
    pub seen: u64,
}

/// The etcd revision a resourceVersion stands for, if it is one.
pub fn revision(resource_version: &str) -> Option<u64> {
    resource_version.parse().ok()
}

impl Newest {
    /// Records that `resource_version` was seen (ignored if it is not an integer).
    pub fn saw(&mut self, resource_version: &str) {
        if let Some(r) = revision(resource_version) {
            self.0 = Some(self.0.map_or(r, |n| n.max(r)));
        }
    }

    /// Whether a list of `listed` may replace the cache: not when it is older than what was seen.
    pub fn admits(&self, listed: &str) -> Result<(), OlderThanSeen> {
        match (revision(listed), self.0) {
            (Some(listed), Some(seen)) if listed < seen => Err(OlderThanSeen { listed, seen }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_older_than_a_version_already_seen_is_refused_and_an_equal_or_newer_one_admitted() {
        let mut newest = Newest::default();
        assert_eq!(
            newest.admits("5"),
            Ok(()),
            "a first list is always admitted"
        );
        newest.saw("100");
        newest.saw("42");
        assert_eq!(
            newest.admits("99"),
            Err(OlderThanSeen {
                listed: 99,
                seen: 100
            })
        );
        assert_eq!(newest.admits("100"), Ok(()));
        assert_eq!(newest.admits("101"), Ok(()));
    }

    #[test]
    fn versions_that_are_not_revisions_are_never_compared() {
        let mut newest = Newest::default();
        newest.saw("100");
        assert_eq!(newest.admits("opaque-7"), Ok(()));
        assert_eq!(newest.admits(""), Ok(()));
        newest.saw("not-a-number");
        assert_eq!(newest, {
            let mut n = Newest::default();
            n.saw("100");
            n
        });
        let mut none = Newest::default();
        none.saw("x");
        assert_eq!(none.admits("1"), Ok(()), "nothing comparable seen yet");
    }

    #[test]
    fn revisions_compare_as_numbers_not_as_strings() {
        let mut newest = Newest::default();
        newest.saw("9");
        assert_eq!(newest.admits("10"), Ok(()), "\"10\" < \"9\" as strings");
        newest.saw("18446744073709551615");
        assert!(newest.admits("18446744073709551614").is_err());
    }
}
