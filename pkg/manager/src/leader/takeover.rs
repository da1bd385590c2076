//! What a new leader knows about the leader before it, read from the Lease record its winning write
//! replaced: who held it, the configuration that holder published on it ([`crate::published`]), and until
//! when one of its writes could still land. That record is the one moment the predecessor's annotation is
//! certainly in hand: right after winning, this leader publishes its own over it.
//!
//! Controllers read it from the fence ([`super::LeaderGuard::takeover`]): a controller whose guarantee
//! needs every leader to have run as it does (the allocator's claims need claims on, and the same cluster
//! CIDRs and masks) compares the predecessor's configuration with its own and, when they differ, waits
//! until [`Takeover::writes_may_land_until`] before it writes.
//!
//! Why that instant: a leader's writes carry a deadline before anyone else may take over (the fence,
//! `docs/safety.md`, "Why it is safe"), so under the fence's assumption every predecessor write has
//! ended by the takeover. What the fence cannot see — a write its API server holds past the deadline (the
//! server's clock starts when it reads the request), an etcd commit after it — gets the predecessor's
//! lease duration more, and this process's safety margin on top. The predecessor's duration is the one its
//! record carries, or this process's own when that is longer (a released Lease records 1 s).
//!
//! A pure function of the record: unit-tested without an API.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};

use super::decision::Decision;
use crate::published::EffectiveConfiguration;

/// The leader before this one, as the Lease showed it when this process took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    /// Its identity; empty when it had released the Lease.
    pub previous_holder: String,
    /// The configuration it published on the Lease, when the Lease carried one that is its own
    /// (`None`: an annotation missing, unreadable, or published by an earlier holder).
    pub previous_configuration: Option<EffectiveConfiguration>,
    /// Until when one of its writes may still land (this process's monotonic clock).
    pub writes_may_land_until: Instant,
    /// Whether it is the holder of the record this process's winning write replaced (`false`: the last
    /// one this process saw before the Lease was deleted, and someone may have led after it).
    pub replaced: bool,
}

impl Takeover {
    /// The identity of the leader right before this one: the holder the Lease named, or, when it had
    /// released the Lease, the identity on the configuration it published. `None` when neither is known.
    /// Controllers trust what a predecessor vouched for (the allocator's idle claims) only when it names
    /// this identity: a leader between them could have undone it.
    pub fn previous_identity(&self) -> Option<&str> {
        if !self.replaced {
            return None;
        }
        if !self.previous_holder.is_empty() {
            return Some(&self.previous_holder);
        }
        self.previous_configuration
            .as_ref()
            .map(|c| c.identity.as_str())
            .filter(|i| !i.is_empty())
    }
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

fn duration(spec: &LeaseSpec) -> Duration {
    Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0))
}

/// The configuration `lease` carries, if it is its last holder's: an annotation whose identity is not the
/// holder's was left by an earlier holder that a leader without publishing followed. A released Lease
/// names no holder: its annotation is taken as the releaser's (a releaser that did not publish cannot be
/// told apart — that needs a version of netcm without `published.rs`).
fn last_holders_configuration(lease: &Lease) -> Option<EffectiveConfiguration> {
    let config = EffectiveConfiguration::from_lease(lease)?;
    let holder = lease.spec.as_ref().map_or("", holder);
    (holder.is_empty() || config.identity == holder).then_some(config)
}

/// The predecessor of a process that just won the Lease with `decision`, `replaced` being the Lease it
/// read (`None`: there was none) and `observed` the last record it had seen before that. `None`: nobody
/// is known to have held the Lease (a first start). `own_lease_duration` and `margin` are this process's.
pub fn after_winning(
    decision: &Decision,
    replaced: Option<&Lease>,
    observed: Option<&LeaseSpec>,
    own_lease_duration: Duration,
    margin: Duration,
    now: Instant,
) -> Option<Takeover> {
    let until = |spec: &LeaseSpec| now + duration(spec).max(own_lease_duration) + margin;
    match (decision, replaced) {
        (Decision::TakeOver, Some(lease)) => {
            let spec = lease.spec.clone().unwrap_or_default();
            Some(Takeover {
                previous_holder: holder(&spec).to_string(),
                previous_configuration: last_holders_configuration(lease),
                writes_may_land_until: until(&spec),
                replaced: true,
            })
        }
        // Created after a deletion during another holder's term (waited out): its configuration went
        // with the Lease.
        (Decision::Create, None) => observed
            .filter(|o| !holder(o).is_empty())
            .map(|o| Takeover {
                previous_holder: holder(o).to_string(),
                previous_configuration: None,
                writes_may_land_until: until(o),
                replaced: false,
            }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::published::ANNOTATION;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const L: Duration = Duration::from_secs(15);
    const MARGIN: Duration = Duration::from_millis(2500);

    fn config(identity: &str) -> EffectiveConfiguration {
        EffectiveConfiguration {
            identity: identity.into(),
            version: "0.1.0".into(),
            controllers: vec!["subnet-allocator".into()],
            flags: [("--pod-cidr-claims".to_string(), "false".to_string())].into(),
        }
    }

    fn lease(
        holder: Option<&str>,
        seconds: i32,
        published: Option<&EffectiveConfiguration>,
    ) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: published.map(|c| {
                    [(
                        ANNOTATION.to_string(),
                        serde_json::to_string(c).expect("json"),
                    )]
                    .into()
                }),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(seconds),
                ..Default::default()
            }),
        }
    }

    /// The predecessor of a process that took `lease` over at `now`.
    fn taken_over(lease: &Lease, now: Instant) -> Takeover {
        after_winning(&Decision::TakeOver, Some(lease), None, L, MARGIN, now)
            .expect("a predecessor")
    }

    #[test]
    fn taking_over_an_expired_lease_reads_its_holders_configuration_and_waits_out_its_term() {
        let now = Instant::now();
        let old = lease(Some("a_1"), 20, Some(&config("a_1")));
        let t = after_winning(&Decision::TakeOver, Some(&old), None, L, MARGIN, now)
            .expect("a predecessor");
        assert_eq!(t.previous_holder, "a_1");
        assert_eq!(t.previous_configuration, Some(config("a_1")));
        assert_eq!(t.previous_identity(), Some("a_1"));
        assert_eq!(
            t.writes_may_land_until,
            now + Duration::from_secs(20) + MARGIN,
            "the predecessor's longer term"
        );
    }

    #[test]
    fn an_annotation_an_earlier_holder_left_is_not_taken_for_the_last_holders() {
        let now = Instant::now();
        let old = lease(Some("b_2"), 15, Some(&config("a_1")));
        let t = after_winning(&Decision::TakeOver, Some(&old), None, L, MARGIN, now)
            .expect("a predecessor");
        assert_eq!(t.previous_holder, "b_2");
        assert_eq!(t.previous_configuration, None);
        assert_eq!(
            t.previous_identity(),
            Some("b_2"),
            "the holder, not the identity on an earlier holder's annotation"
        );
        let unpublished = lease(Some("b_2"), 15, None);
        let t = taken_over(&unpublished, now);
        assert_eq!(t.previous_configuration, None);
    }

    #[test]
    fn a_released_lease_is_still_a_predecessor_and_its_one_second_term_is_not_trusted() {
        let now = Instant::now();
        let released = lease(None, 1, Some(&config("a_1")));
        let t = after_winning(&Decision::TakeOver, Some(&released), None, L, MARGIN, now)
            .expect("a predecessor");
        assert_eq!(t.previous_holder, "");
        assert_eq!(t.previous_configuration, Some(config("a_1")));
        assert_eq!(
            t.previous_identity(),
            Some("a_1"),
            "a releaser is known by its published identity"
        );
        let unpublished = lease(None, 1, None);
        let t = taken_over(&unpublished, now);
        assert_eq!(
            t.previous_identity(),
            None,
            "a releaser that published nothing is unknown"
        );
        assert_eq!(t.writes_may_land_until, now + L + MARGIN);
    }

    #[test]
    fn a_first_start_has_no_predecessor_and_a_lease_recreated_after_a_deletion_has_an_unknown_one()
    {
        let now = Instant::now();
        assert_eq!(
            after_winning(&Decision::Create, None, None, L, MARGIN, now),
            None
        );
        let seen = LeaseSpec {
            holder_identity: Some("a_1".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        let t = after_winning(&Decision::Create, None, Some(&seen), L, MARGIN, now)
            .expect("the holder whose term was waited out");
        assert_eq!(t.previous_holder, "a_1");
        assert_eq!(t.previous_configuration, None);
        assert_eq!(
            t.previous_identity(),
            None,
            "someone may have led between the last record seen and the deletion"
        );
        let renewal = lease(Some("me"), 15, None);
        assert_eq!(
            after_winning(&Decision::Renew, Some(&renewal), None, L, MARGIN, now),
            None
        );
    }
}
