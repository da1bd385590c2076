//! What the once-a-second pool reconcile remembers between passes, so a pass where nothing changed
//! does almost nothing: the pools are synced only when an object's pool or the pools' refusal epoch
//! changed, and beyond the objects put since the last pass it looks only at pools whose status counts
//! move with the Nodes (active and draining ones), at refusals whose Warning Event is due again and at
//! objects whose last write failed. Pure.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use netcm_ipam::PoolState;

/// A refusal's Event is published again after this long: the recorder's own window for repeats, so the
/// Events read as before, when the pass published every second and the recorder dropped the repeats.
pub(crate) const REPUBLISH_AFTER: Duration = netcm_manager::events::DEDUP_WINDOW;

/// What the last pass saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The store's pools version and the pools' refusal epoch when the pools were last synced.
    synced: Option<(u64, u64)>,
    /// Every object put at or before this store version was looked at.
    pub(crate) version: u64,
    /// Pools whose status counts move with the Nodes: active and draining ones, by name.
    live: BTreeSet<String>,
    /// Refused pools by name: the reason last published and when.
    refused: HashMap<String, (String, Instant)>,
    /// Objects a write for failed or was not allowed (not leading): looked at again next pass.
    retry: BTreeSet<String>,
}

/// Whether to publish a refusal now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// Published within the window, with this reason: nothing to do.
    No,
    /// A reason not published before (also worth a log line).
    New,
    /// The same reason, due again.
    Again,
}

impl Seen {
    /// Whether the pools must be synced with the objects: the objects' pools or the refusal epoch
    /// changed since the last sync.
    pub(crate) fn must_sync(&self, pools_version: u64, epoch: u64) -> bool {
        self.synced != Some((pools_version, epoch))
    }

    /// Records a sync at these versions.
    pub(crate) fn synced(&mut self, pools_version: u64, epoch: u64) {
        self.synced = Some((pools_version, epoch));
    }

    /// The pools to look at even if their objects did not change: live ones, refused ones whose
    /// Event is due at `now`, and those to retry.
    pub(crate) fn due(&self, now: Instant) -> Vec<String> {
        let refused = self
            .refused
            .iter()
            .filter(|(_, (_, at))| now.saturating_duration_since(*at) >= REPUBLISH_AFTER)
            .map(|(name, _)| name.clone());
        let mut due: BTreeSet<String> = self.live.iter().cloned().chain(refused).collect();
        due.extend(self.retry.iter().cloned());
        due.into_iter().collect()
    }

    /// Records the state of pool `name` as a pass found it, and whether all it needed was written
    /// (else it is looked at again next pass).
    pub(crate) fn looked_at(&mut self, name: &str, state: &PoolState, settled: bool) {
        if settled {
            self.retry.remove(name);
        } else {
            self.retry.insert(name.to_string());
        }
        if let PoolState::Refused(_) = state {
            self.live.remove(name);
        } else {
            self.refused.remove(name);
            self.live.insert(name.to_string());
        }
    }

    /// Whether to publish the refusal `why` of pool `name` now; if so, records it as published at
    /// `now`.
    pub(crate) fn publish(&mut self, name: &str, why: &str, now: Instant) -> Publish {
        let publish = match self.refused.get(name) {
            Some((text, _)) if text != why => Publish::New,
            Some((_, at)) if now.saturating_duration_since(*at) < REPUBLISH_AFTER => Publish::No,
            Some(_) => Publish::Again,
            None => Publish::New,
        };
        if publish != Publish::No {
            self.refused
                .insert(name.to_string(), (why.to_string(), now));
        }
        publish
    }

    /// Forgets the pools `present` says are gone.
    pub(crate) fn retain(&mut self, present: impl Fn(&str) -> bool) {
        self.live.retain(|n| present(n));
        self.refused.retain(|n, _| present(n));
        self.retry.retain(|n| present(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netcm_ipam::Refusal;

    fn refused() -> PoolState {
        PoolState::Refused(Refusal::Modified)
    }

    #[test]
    fn a_refusal_is_published_once_per_window_and_at_once_when_its_reason_changes() {
        let mut seen = Seen::default();
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(seen.publish("a", "x", t0), Publish::New);
        assert_eq!(seen.publish("a", "x", t0 + second), Publish::No);
        assert_eq!(seen.publish("a", "y", t0 + 2 * second), Publish::New);
        let later = t0 + 2 * second + REPUBLISH_AFTER;
        assert_eq!(seen.publish("a", "y", later), Publish::Again);
    }

    #[test]
    fn a_pass_where_nothing_changed_looks_at_live_pools_due_refusals_and_retries_only() {
        let mut seen = Seen::default();
        let t0 = Instant::now();
        for i in 0..1_000 {
            let name = format!("refused-{i}");
            seen.looked_at(&name, &refused(), true);
            seen.publish(&name, "x", t0);
        }
        seen.looked_at("live", &PoolState::Active, true);
        seen.looked_at("draining", &PoolState::Draining, true);
        seen.looked_at("unwritten", &refused(), false);
        let second = Duration::from_secs(1);
        assert_eq!(seen.due(t0 + second), ["draining", "live", "unwritten"]);
        assert_eq!(seen.due(t0 + REPUBLISH_AFTER).len(), 1_003);
        seen.looked_at("unwritten", &refused(), true);
        seen.retain(|n| n != "live");
        assert_eq!(seen.due(t0 + second), ["draining"]);
    }

    #[test]
    fn the_pools_are_synced_again_only_when_the_objects_pools_or_the_epoch_changed() {
        let mut seen = Seen::default();
        assert!(seen.must_sync(0, 0), "never synced");
        seen.synced(3, 7);
        assert!(!seen.must_sync(3, 7));
        assert!(seen.must_sync(4, 7));
        assert!(seen.must_sync(3, 8));
    }
}
