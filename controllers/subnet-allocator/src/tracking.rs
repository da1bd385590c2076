//! [`Tracking`]: which Node name each ledger record (keyed by Node UID) belongs to.

use std::collections::HashMap;
use std::sync::Arc;

use crate::decision::Recorded;

/// Which Node (name and UID) each ledger record belongs to, and whether its PATCH succeeded before the
/// cache showed it. One map of exact-size strings: at 50,000 Nodes a second map (UID → name, or the
/// written Nodes) costs a few MiB, and only Events about conflicting CIDRs — bad data, rare — need the
/// reverse direction.
#[derive(Debug, Default)]
pub(crate) struct Tracking {
    by_name: HashMap<Box<str>, Tracked>,
    /// Entries visited by lookups from UID to name: the bound the bad-data tests hold them to.
    scanned: std::cell::Cell<u64>,
}

/// What [`Tracking`] holds for one Node name.
#[derive(Debug)]
struct Tracked {
    /// Shared with the ledger's record when there is one (`Pools::owner`).
    uid: Arc<str>,
    /// The PATCH for this UID succeeded and the cache has not shown its CIDRs yet.
    written: bool,
}

impl Tracking {
    pub(crate) fn track(&mut self, name: &str, uid: impl Into<Arc<str>>) {
        let uid: Arc<str> = uid.into();
        if self.by_name.get(name).map(|t| t.uid.as_ref()) != Some(uid.as_ref()) {
            let tracked = Tracked {
                uid,
                written: false,
            };
            netcm_table::make_room_for_one(&mut self.by_name);
            self.by_name.insert(name.into(), tracked);
        }
    }

    pub(crate) fn forget(&mut self, name: &str, uid: &str) {
        if self.by_name.get(name).map(|t| t.uid.as_ref()) == Some(uid) {
            self.by_name.remove(name);
        }
    }

    /// Records that the PATCH for `name`/`uid` succeeded.
    pub(crate) fn mark_written(&mut self, name: &str, uid: &str) {
        match self.by_name.get_mut(name) {
            Some(t) if t.uid.as_ref() == uid => t.written = true,
            _ => {
                let tracked = Tracked {
                    uid: uid.into(),
                    written: true,
                };
                netcm_table::make_room_for_one(&mut self.by_name);
                self.by_name.insert(name.into(), tracked);
            }
        }
    }

    /// The cache shows `name`'s CIDRs: nothing is pending a write any more.
    pub(crate) fn shown(&mut self, name: &str) {
        if let Some(t) = self.by_name.get_mut(name) {
            t.written = false;
        }
    }

    pub(crate) fn recorded(&self, name: &str) -> Recorded {
        let tracked = self.by_name.get(name);
        Recorded {
            uid: tracked.map(|t| t.uid.to_string()),
            written_uid: tracked.filter(|t| t.written).map(|t| t.uid.to_string()),
        }
    }

    /// Entries visited by lookups from UID to name so far.
    #[cfg(test)]
    pub(crate) fn scanned(&self) -> u64 {
        self.scanned.get()
    }

    /// The names of the Nodes with these UIDs (ledger owners), as far as they are tracked. One scan for
    /// all of them, stopping once each is found: only Events about bad data ask, at most once per Node
    /// per window, for the few Nodes they name.
    pub(crate) fn names_of<'a>(&self, owners: &[&'a str]) -> HashMap<&'a str, String> {
        let wanted: std::collections::HashSet<&'a str> = owners.iter().copied().collect();
        let mut names: HashMap<&'a str, String> = HashMap::with_capacity(wanted.len());
        if !wanted.is_empty() {
            for (name, t) in &self.by_name {
                self.scanned.set(self.scanned.get() + 1);
                if let Some(owner) = wanted.get(t.uid.as_ref()) {
                    names.insert(owner, name.to_string());
                    if names.len() == wanted.len() {
                        break;
                    }
                }
            }
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_stays_marked_until_the_cache_shows_it_and_only_for_its_uid() {
        let mut t = Tracking::default();
        t.track("a", "a1");
        t.mark_written("a", "a1");
        assert_eq!(t.recorded("a").written_uid.as_deref(), Some("a1"));
        t.track("a", "a1");
        assert_eq!(
            t.recorded("a").written_uid.as_deref(),
            Some("a1"),
            "tracking the same UID again keeps the mark"
        );
        t.shown("a");
        assert_eq!(t.recorded("a").written_uid, None);
        t.mark_written("a", "a1");
        t.track("a", "a2");
        assert_eq!(
            t.recorded("a").written_uid,
            None,
            "a Node re-created under the name has written nothing"
        );
        t.forget("a", "a2");
        assert_eq!(t.recorded("a").uid, None);
    }

    #[test]
    fn tracking_forgets_a_name_only_for_the_uid_it_recorded() {
        let mut t = Tracking::default();
        t.track("a", "a2");
        t.forget("a", "a1");
        assert_eq!(t.recorded("a").uid.as_deref(), Some("a2"));
        let names = t.names_of(&["a2", "claim:x"]);
        assert_eq!((names["a2"].as_str(), names.get("claim:x")), ("a", None));
        t.forget("a", "a2");
        assert_eq!(t.recorded("a").uid, None);
    }
}
