//! The elector's decisions as pure functions of what it saw and when — no API, no clock of its own — so
//! every rule is unit-tested: client-go's `tryAcquireOrRenew` (a lease is valid for its duration after
//! this candidate *observed* it change, whatever its timestamps say), plus one rule client-go lacks: a
//! Lease deleted while another replica held it is not recreated until that holder's term has run out.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// The last Lease record this candidate saw, and when it saw it change (its own monotonic clock).
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The record.
    pub spec: LeaseSpec,
    /// When this candidate first saw this exact record.
    pub at: Instant,
}

/// What to do with the Lease after reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease and nobody's term can still be running: create it, holding it.
    Create,
    /// This process holds it: renew.
    Renew,
    /// Released (no holder) or expired: take it over.
    TakeOver,
    /// Another replica's term is running; it ends `wait` from now unless renewed. Also returned when
    /// the Lease is gone but its last holder's term is not over.
    HeldByOther {
        /// The holder.
        holder: String,
        /// The rest of its term as this candidate measures it.
        wait: Duration,
    },
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

fn duration(spec: &LeaseSpec) -> Duration {
    Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0))
}

/// Updates the observation with what a read returned at `now`. A changed record restarts the clock
/// (client-go's observedTime); an unchanged one keeps it; a missing Lease keeps the last one seen, so its
/// holder's term is still honoured after a deletion.
pub fn observe(
    previous: Option<Observation>,
    current: Option<&LeaseSpec>,
    now: Instant,
) -> Option<Observation> {
    match (previous, current) {
        (Some(prev), Some(spec)) if prev.spec == *spec => Some(prev),
        (_, Some(spec)) => Some(Observation {
            spec: spec.clone(),
            at: now,
        }),
        (prev, None) => prev,
    }
}

/// The term of a holder seen in `o`, as measured from when it was seen: what remains of it at `now`.
fn remaining_term(o: &Observation, now: Instant) -> Duration {
    (o.at + duration(&o.spec)).saturating_duration_since(now)
}

/// Decides from the (already updated) observation and the Lease as read (`None`: not found).
pub fn decide(
    observed: Option<&Observation>,
    current: Option<&LeaseSpec>,
    me: &str,
    now: Instant,
) -> Decision {
    let Some(spec) = current else {
        return match observed {
            Some(o) if !holder(&o.spec).is_empty() && holder(&o.spec) != me => {
                match remaining_term(o, now) {
                    wait if wait.is_zero() => Decision::Create,
                    wait => Decision::HeldByOther {
                        holder: holder(&o.spec).to_string(),
                        wait,
                    },
                }
            }
            _ => Decision::Create,
        };
    };
    let current_holder = holder(spec);
    if current_holder == me {
        return Decision::Renew;
    }
    if current_holder.is_empty() {
        return Decision::TakeOver;
    }
    // The record has to have been observed by now; if not, count it as seen this instant.
    let seen = observed
        .filter(|o| o.spec == *spec)
        .map(|o| o.at)
        .unwrap_or(now);
    match (seen + duration(spec)).saturating_duration_since(now) {
        wait if wait.is_zero() => Decision::TakeOver,
        wait => Decision::HeldByOther {
            holder: current_holder.to_string(),
            wait,
        },
    }
}

/// The record to write for `decision` (Create, Renew or TakeOver): this process as holder, renewed at
/// `now`; acquire time and one more transition when leadership changes hands.
pub fn next_record(
    current: Option<&LeaseSpec>,
    decision: &Decision,
    me: &str,
    lease_duration_seconds: i32,
    now: MicroTime,
) -> LeaseSpec {
    let mut spec = current.cloned().unwrap_or_default();
    match decision {
        Decision::Create => {
            spec = LeaseSpec {
                acquire_time: Some(now.clone()),
                lease_transitions: Some(0),
                ..Default::default()
            };
        }
        Decision::TakeOver => {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        Decision::Renew | Decision::HeldByOther { .. } => {}
    }
    spec.holder_identity = Some(me.to_string());
    spec.lease_duration_seconds = Some(lease_duration_seconds);
    spec.renew_time = Some(now);
    spec
}

/// How long one acquire or renewal attempt may take by itself (client-go gives each attempt a share of
/// the renew deadline).
pub fn attempt_timeout(renew_deadline: Duration) -> Duration {
    (renew_deadline / 2).max(Duration::from_secs(1))
}

/// How long the next renewal attempt may take, `since_renewal` after the last successful renewal was
/// sent: its usual timeout, but never past the renew deadline, so a leader whose requests hang steps
/// down on time rather than an attempt's timeout later. `None`: the deadline has passed — step down.
pub fn renewal_attempt_timeout(
    renew_deadline: Duration,
    since_renewal: Duration,
) -> Option<Duration> {
    let remaining = renew_deadline.saturating_sub(since_renewal);
    (!remaining.is_zero()).then(|| attempt_timeout(renew_deadline).min(remaining))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";

    fn held_by(h: &str, secs: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(h.to_string()),
            lease_duration_seconds: Some(secs),
            lease_transitions: Some(3),
            ..Default::default()
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Reads `current` at `now` after `previous`, as the elector does: observe, then decide.
    fn read(
        previous: Option<Observation>,
        current: Option<&LeaseSpec>,
        now: Instant,
    ) -> (Option<Observation>, Decision) {
        let observed = observe(previous, current, now);
        let decision = decide(observed.as_ref(), current, ME, now);
        (observed, decision)
    }

    #[test]
    fn a_candidate_that_never_saw_a_lease_creates_it() {
        let (_, d) = read(None, None, Instant::now());
        assert_eq!(d, Decision::Create);
    }

    #[test]
    fn the_holder_renews_its_own_lease() {
        let (_, d) = read(None, Some(&held_by(ME, 15)), Instant::now());
        assert_eq!(d, Decision::Renew);
    }

    #[test]
    fn a_released_lease_is_taken_over_at_once() {
        let released = LeaseSpec {
            lease_duration_seconds: Some(1),
            ..Default::default()
        };
        let (_, d) = read(None, Some(&released), Instant::now());
        assert_eq!(d, Decision::TakeOver);
    }

    #[test]
    fn another_holders_lease_is_valid_for_its_duration_after_this_candidate_first_saw_it() {
        let t0 = Instant::now();
        let lease = held_by("other", 15);
        let (seen, d) = read(None, Some(&lease), t0);
        assert_eq!(
            d,
            Decision::HeldByOther {
                holder: "other".into(),
                wait: secs(15)
            }
        );
        // Unchanged records do not restart the clock: 14 s later one second is left, at 15 s it expired.
        let (seen, d) = read(seen, Some(&lease), t0 + secs(14));
        assert_eq!(
            d,
            Decision::HeldByOther {
                holder: "other".into(),
                wait: secs(1)
            }
        );
        let (_, d) = read(seen, Some(&lease), t0 + secs(15));
        assert_eq!(d, Decision::TakeOver);
    }

    #[test]
    fn a_renewal_restarts_the_observed_term_whatever_the_records_timestamps_say() {
        let t0 = Instant::now();
        let mut lease = held_by("other", 15);
        let (seen, _) = read(None, Some(&lease), t0);
        // The holder renews; its renewTime is from a clock far in the past, which must not matter.
        lease.renew_time = Some(MicroTime(jiff::Timestamp::UNIX_EPOCH));
        let (seen, d) = read(seen, Some(&lease), t0 + secs(14));
        assert_eq!(
            d,
            Decision::HeldByOther {
                holder: "other".into(),
                wait: secs(15)
            }
        );
        assert_eq!(seen.map(|o| o.at), Some(t0 + secs(14)));
    }

    #[test]
    fn a_lease_deleted_during_another_holders_term_is_not_recreated_until_that_term_is_over() {
        let t0 = Instant::now();
        let (seen, _) = read(None, Some(&held_by("other", 15)), t0);
        let (seen, d) = read(seen, None, t0 + secs(5));
        assert_eq!(
            d,
            Decision::HeldByOther {
                holder: "other".into(),
                wait: secs(10)
            }
        );
        let (_, d) = read(seen, None, t0 + secs(15));
        assert_eq!(d, Decision::Create);
    }

    #[test]
    fn a_holder_whose_lease_was_deleted_recreates_it_at_once() {
        let t0 = Instant::now();
        let (seen, _) = read(None, Some(&held_by(ME, 15)), t0);
        let (_, d) = read(seen, None, t0 + secs(1));
        assert_eq!(d, Decision::Create);
    }

    #[test]
    fn a_lease_deleted_after_it_was_released_is_created_at_once() {
        let t0 = Instant::now();
        let released = LeaseSpec {
            lease_duration_seconds: Some(1),
            ..Default::default()
        };
        let (seen, _) = read(None, Some(&released), t0);
        let (_, d) = read(seen, None, t0);
        assert_eq!(d, Decision::Create);
    }

    #[test]
    fn a_lease_without_a_duration_expires_at_once() {
        let lease = LeaseSpec {
            holder_identity: Some("other".into()),
            ..Default::default()
        };
        let (_, d) = read(None, Some(&lease), Instant::now());
        assert_eq!(d, Decision::TakeOver);
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let now = MicroTime(jiff::Timestamp::now());
        let current = held_by("other", 15);
        let taken = next_record(Some(&current), &Decision::TakeOver, ME, 15, now.clone());
        assert_eq!(taken.holder_identity.as_deref(), Some(ME));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(now.clone()));
        let mine = held_by(ME, 15);
        let renewed = next_record(Some(&mine), &Decision::Renew, ME, 15, now.clone());
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, None);
        assert_eq!(renewed.renew_time, Some(now.clone()));
        let created = next_record(None, &Decision::Create, ME, 15, now);
        assert_eq!(created.lease_transitions, Some(0));
        assert_eq!(created.lease_duration_seconds, Some(15));
    }

    #[test]
    fn a_renewal_attempt_never_runs_past_the_renew_deadline() {
        let deadline = secs(10);
        assert_eq!(renewal_attempt_timeout(deadline, secs(2)), Some(secs(5)));
        assert_eq!(
            renewal_attempt_timeout(deadline, Duration::from_millis(9_000)),
            Some(secs(1))
        );
        assert_eq!(
            renewal_attempt_timeout(deadline, Duration::from_millis(9_900)),
            Some(Duration::from_millis(100))
        );
        assert_eq!(renewal_attempt_timeout(deadline, secs(10)), None);
        assert_eq!(renewal_attempt_timeout(deadline, secs(14)), None);
    }

    #[test]
    fn with_default_timings_a_hanging_api_costs_the_lease_at_the_renew_deadline_not_later() {
        // Walk the renew loop's schedule against an API that never answers: attempts at every retry
        // period, each cut at its timeout; the loss must be declared at the 10 s renew deadline.
        let (deadline, retry) = (secs(10), secs(2));
        let mut t = retry;
        let lost_at = loop {
            match renewal_attempt_timeout(deadline, t) {
                None => break t,
                Some(timeout) => t += timeout + retry.min(deadline.saturating_sub(t + timeout)),
            }
        };
        assert_eq!(lost_at, deadline);
    }
}
