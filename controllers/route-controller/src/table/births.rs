//! Learning when the Nodes in an overlap were created, before a sync decides which of them holds: its
//! own Node's creation time and those of the Nodes whose pod CIDRs overlap its own, read only when the
//! view does not know them yet and only as far as a decision needs them.

use futures::StreamExt;
use ipnet::IpNet;

use super::RouteSyncer;
use crate::seniority::{BirthError, Seniority};

/// Creation times one sync reads at most, beyond its own Node's: a pod CIDR over thousands of others
/// is decided by the first earlier one found, and each of the others reads its own at its sync.
const MAX_READS_PER_SYNC: usize = 16;
/// Reads in flight at once for one sync.
const CONCURRENT_READS: usize = 8;

impl RouteSyncer {
    /// Remembers the creation times of Nodes already read (a full listing), by name.
    pub fn remember_births(&self, births: impl IntoIterator<Item = (String, Seniority)>) {
        self.state().born.extend(births);
    }

    /// Reads the creation times the decisions on `claims` of the Node `name` (uid `uid`) need and the
    /// view does not know. A read that fails leaves that decision open; the sync says so and is tried
    /// again.
    pub(super) async fn learn_births(&self, name: &str, uid: &str, claims: &[IpNet]) {
        let needed = self.births_needed(name, uid, claims);
        if needed.is_empty() {
            return;
        }
        let read: Vec<(String, String, Result<Seniority, BirthError>)> =
            futures::stream::iter(needed)
                .map(|(node, uid)| async move {
                    let found = self.births.created(&node, &uid).await;
                    (node, uid, found)
                })
                .buffer_unordered(CONCURRENT_READS)
                .collect()
                .await;
        let mut st = self.state();
        for (node, read_uid, found) in read {
            match found {
                // Kept only for the Node the view still holds under that name (or is about to).
                Ok(s) => {
                    let current = if node == name {
                        uid == read_uid
                    } else {
                        st.asked.get(&node).is_some_and(|a| a.uid == read_uid)
                    };
                    if current {
                        st.born.insert(node, s);
                    }
                }
                Err(e @ BirthError::Api { .. }) => {
                    tracing::warn!(controller = crate::NAME, node = %node, error = %e, "cannot read when the node was created; its overlapping pod CIDRs wait")
                }
                Err(e) => {
                    tracing::debug!(controller = crate::NAME, node = %node, error = %e, "no creation time for the node yet")
                }
            }
        }
    }

    /// The (name, uid) of each Node whose creation time a decision on `claims` needs: this Node's as
    /// soon as one of its claims overlaps another's, and the unknown others' of each claim no known
    /// earlier Node decides already.
    fn births_needed(&self, name: &str, uid: &str, claims: &[IpNet]) -> Vec<(String, String)> {
        let st = self.state();
        let own = st.born.get(name).filter(|s| s.uid == uid);
        let mut own_needed = false;
        let mut others = Vec::new();
        for d in claims {
            let overlapping = st.contenders.overlapping(d);
            let mut overlapping = overlapping.iter().filter(|(_, n)| *n != name).peekable();
            if overlapping.peek().is_none() {
                continue;
            }
            own_needed |= own.is_none();
            let overlapping: Vec<&str> = overlapping.map(|(_, n)| *n).collect();
            let decided = own.is_some_and(|own| {
                overlapping
                    .iter()
                    .any(|o| st.seniority(o).is_some_and(|s| (s, *o) < (own, name)))
            });
            if decided {
                continue;
            }
            others.extend(
                overlapping
                    .into_iter()
                    .filter(|o| st.seniority(o).is_none())
                    .filter_map(|o| {
                        let uid = &st.asked.get(o)?.uid;
                        (!uid.is_empty()).then(|| (o.to_string(), uid.clone()))
                    }),
            );
        }
        others.sort();
        others.dedup();
        others.truncate(MAX_READS_PER_SYNC);
        if own_needed && !uid.is_empty() {
            others.insert(0, (name.to_string(), uid.to_string()));
        }
        others
    }
}
