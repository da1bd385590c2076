//! The fence's rules, on the monotonic clock, without an API server.

use super::*;

fn cfg(lease_ms: u64, renew_ms: u64) -> LeaderElectionConfig {
    LeaderElectionConfig {
        name: "netcm".into(),
        namespace: "kube-system".into(),
        identity: "a".into(),
        lease_duration: Duration::from_millis(lease_ms),
        renew_deadline: Duration::from_millis(renew_ms),
        retry_period: Duration::from_millis(10),
    }
}

fn guard(lease_ms: u64, renew_ms: u64) -> LeaderGuard {
    LeaderGuard::new(&cfg(lease_ms, renew_ms), &Registry::new()).expect("guard")
}

#[test]
fn the_fence_refuses_writes_before_leadership_is_won() {
    let g = guard(15_000, 50);
    assert!(g.ensure_leader().is_err());
    assert!(g.begin_write().is_err());
    assert_eq!(g.inner.fenced.get(), 2);
}

#[test]
fn the_fence_allows_writes_after_a_fresh_renewal_and_refuses_once_it_is_older_than_the_renew_deadline(
) {
    let g = guard(15_000, 50);
    g.renewed(Instant::now());
    assert!(g.ensure_leader().is_ok());
    std::thread::sleep(Duration::from_millis(60));
    assert!(
        g.ensure_leader().is_err(),
        "a stale renewal must fence writes"
    );
}

#[test]
fn the_fence_refuses_writes_after_stepping_down() {
    let g = guard(15_000, 50);
    g.renewed(Instant::now());
    g.step_down();
    assert!(g.ensure_leader().is_err());
    assert!(!g.is_leader());
}

#[test]
fn without_leader_election_every_write_is_allowed_with_no_deadline() {
    let g = LeaderGuard::disabled(&Registry::new()).expect("guard");
    assert!(g.ensure_leader().is_ok());
    assert_eq!(g.write_budget().ok(), Some(Duration::MAX));
    assert_eq!(g.begin_write().expect("allowed").deadline(), None);
    assert!(g.is_leader());
    assert!(g.watchdog().is_ok());
}

#[test]
fn the_watchdog_passes_for_a_standby_and_a_freshly_renewed_leader() {
    let g = guard(15_000, 50);
    assert!(g.watchdog().is_ok());
    g.renewed(Instant::now());
    assert!(g.watchdog().is_ok());
}

#[test]
fn a_write_must_end_a_safety_margin_before_the_renewal_plus_the_lease_duration() {
    let g = guard(15_000, 10_000);
    assert_eq!(g.safety_margin(), Duration::from_millis(2500));
    let sent = Instant::now() - Duration::from_secs(4);
    g.renewed(sent);
    let ticket = g.begin_write().expect("fresh enough");
    assert_eq!(
        ticket.deadline(),
        Some(sent + Duration::from_millis(12_500))
    );
    let budget = g.write_budget().expect("fresh enough");
    assert!(
        budget <= Duration::from_millis(8500) && budget > Duration::from_millis(8000),
        "{budget:?}"
    );
}

#[test]
fn a_write_started_at_the_fences_last_moment_still_gets_half_the_gap() {
    let g = guard(15_000, 10_000);
    g.renewed(Instant::now() - Duration::from_millis(9_999));
    let budget = g.write_budget().expect("still inside the renew deadline");
    assert!(budget > Duration::from_millis(2500), "{budget:?}");
}

#[test]
fn a_write_that_could_arrive_after_the_term_is_refused_while_a_request_is_held_that_long() {
    let g = guard(15_000, 10_000);
    // 3.5 s are left before the deadline (renewal + 15 s − 2.5 s margin).
    g.renewed(Instant::now() - Duration::from_secs(9));
    g.state()
        .path
        .started(Instant::now() - Duration::from_secs(4));
    assert!(
        g.begin_write().is_err(),
        "a request unanswered for 4 s means a write sent now may arrive after the term"
    );
    assert!(g.ensure_leader().is_err());
    assert_eq!(g.inner.fenced.get(), 2);
}

#[test]
fn the_api_server_is_told_the_time_left_after_the_paths_worst_round_trip() {
    let g = guard(15_000, 10_000);
    let sent = Instant::now();
    g.renewed(sent);
    {
        let mut st = g.state();
        let t = Instant::now() - Duration::from_secs(2);
        st.path.started(t);
        st.path.ended(t, t + Duration::from_millis(1500));
    }
    let ticket = g.begin_write().expect("12.5 s left, the path takes 1.5 s");
    assert_eq!(
        ticket.deadline(),
        Some(sent + Duration::from_millis(12_500))
    );
    let told = ticket.server_timeout().expect("leader election is on");
    assert!(
        told <= Duration::from_millis(11_000) && told > Duration::from_millis(10_900),
        "{told:?}"
    );
}

#[test]
fn an_abandoned_renewal_attempt_stops_counting_as_in_flight() {
    let g = guard(15_000, 10_000);
    g.renewed(Instant::now());
    let attempt = g.renewal_sent(Instant::now() - Duration::from_secs(20));
    assert!(g.begin_write().is_err(), "a renewal unanswered for 20 s");
    drop(attempt);
    g.state().path = PathDelay::new(Duration::from_secs(15));
    assert!(g.begin_write().is_ok());
}

#[tokio::test]
async fn the_lease_may_be_released_once_every_answered_write_has_ended() {
    let g = guard(15_000, 10_000);
    g.renewed(Instant::now());
    let ticket = g.begin_write().expect("leader");
    let settle = tokio::spawn({
        let g = g.clone();
        async move { g.stop_writes_and_settle(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        g.begin_write().is_err(),
        "no write may start once settling began"
    );
    ticket.answered();
    assert_eq!(settle.await.expect("join"), Ok(()));
}

#[tokio::test]
async fn a_write_still_in_flight_keeps_the_lease_from_being_released() {
    let g = guard(15_000, 10_000);
    g.renewed(Instant::now());
    let _ticket = g.begin_write().expect("leader");
    let err = g
        .stop_writes_and_settle(Duration::from_millis(20))
        .await
        .expect_err("a write is in flight");
    assert_eq!(err.in_flight, 1);
}

#[tokio::test]
async fn a_write_abandoned_without_an_answer_may_land_until_its_deadline() {
    let g = guard(15_000, 10_000);
    let sent = Instant::now();
    g.renewed(sent);
    drop(g.begin_write().expect("leader"));
    let err = g
        .stop_writes_and_settle(Duration::from_millis(20))
        .await
        .expect_err("the abandoned write may still land");
    assert_eq!(err.in_flight, 0);
    assert!(err.may_land_for > Duration::from_secs(12), "{err}");
}

#[tokio::test]
async fn an_abandoned_write_whose_deadline_has_passed_no_longer_holds_the_lease() {
    let g = guard(1_000, 800);
    g.renewed(Instant::now());
    drop(g.begin_write().expect("leader"));
    // Its deadline is the renewal + 900 ms; waiting that long settles it by the clock alone.
    assert_eq!(
        g.stop_writes_and_settle(Duration::from_secs(5)).await,
        Ok(())
    );
}

#[test]
fn a_write_is_refused_while_a_fast_path_has_left_a_request_unanswered_far_beyond_its_round_trips() {
    let g = guard(15_000, 10_000);
    let now = Instant::now();
    g.renewed(now);
    let fast = g.begin_write().expect("leader");
    fast.answered();
    // A renewal sent 1 s ago over a path whose round trips took well under 250 ms: the path has changed,
    // and the bound left (13 s of term against 1 s of waiting) would still let the write through.
    let _attempt = g.renewal_sent(now - Duration::from_secs(1));
    let err = g.begin_write().expect_err("the path stalled");
    assert!(
        err.0.contains("far longer than its recent round trips"),
        "{err}"
    );
}

#[test]
fn the_api_server_counts_as_answering_after_a_renewal_an_answered_write_or_probe_and_not_after_a_silent_one(
) {
    let g = guard(15_000, 10_000);
    let within = Duration::from_millis(30);
    assert!(!g.answered_within(within), "nothing was ever answered");
    g.renewed(Instant::now());
    assert!(g.answered_within(within));
    std::thread::sleep(Duration::from_millis(40));
    assert!(!g.answered_within(within), "the renewal's answer is old");
    g.begin_write().expect("write").answered();
    assert!(g.answered_within(within), "an answered write");
    std::thread::sleep(Duration::from_millis(40));
    drop(g.begin_write().expect("write"));
    assert!(!g.answered_within(within), "a write that got no answer");
    let probe = g.probe_sent();
    assert!(!g.answered_within(within), "a probe on its way");
    probe.answered();
    assert!(g.answered_within(within), "an answered probe");
}

#[test]
fn a_probe_left_unanswered_stalls_the_path_like_any_request() {
    let g = guard(15_000, 10_000);
    g.renewed(Instant::now());
    let _probe = g.probe_sent();
    std::thread::sleep(Duration::from_millis(300));
    assert!(g.ensure_leader().is_err(), "a probe waiting 300 ms");
}

#[test]
fn without_leader_election_the_api_server_always_counts_as_answering() {
    let g = LeaderGuard::disabled(&Registry::new()).expect("guard");
    assert!(g.answered_within(Duration::ZERO));
}
