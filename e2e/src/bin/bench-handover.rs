//! Leader hand-over benchmark on the real control plane (run through `hack/bench.sh handover`).
//!
//! Each round starts two replicas (the allocator only), waits until one leads and the other stands by,
//! then ends the leader and times how long until the standby holds the Lease, as a client of the API
//! server sees it: with SIGTERM (the leader releases the Lease) at the default lease settings, and with
//! kill -9 (the lease must expire) at a 4 s lease, 3 s renew deadline, 1 s retry period. Prints each
//! time and the minimum, median and maximum; the e2e suite proves the rules, never the speed.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use netcm_e2e::{lease_holder, wait_for, Netcm, TestEnv, LEASE_NAME};

const ALLOCATOR: [&str; 2] = [
    "--controllers=subnet-allocator",
    "--cluster-cidr=10.244.0.0/16",
];
const FAST_LEASE: [&str; 3] = [
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One round: a leader and a standby, the leader ended with `signal`; the time until the standby holds
/// the Lease.
async fn round(env: &TestEnv, signal: &str, extra: &[&str]) -> Duration {
    let args: Vec<&str> = ALLOCATOR.iter().chain(extra).copied().collect();
    let a = Netcm::start("leader", &env.cp.kubeconfig, &args);
    a.wait_leading(Duration::from_secs(30)).await;
    let a_id = wait_for(
        "the leader to hold the Lease",
        Duration::from_secs(10),
        || lease_holder(&env.client, LEASE_NAME),
    )
    .await;
    let b = Netcm::start("standby", &env.cp.kubeconfig, &args);
    b.wait_standing_by(&env.client, Duration::from_secs(30))
        .await;
    let t0 = Instant::now();
    a.signal(signal);
    wait_for(
        "the standby to hold the Lease",
        Duration::from_secs(60),
        || async {
            let holder = lease_holder(&env.client, LEASE_NAME).await?;
            (holder != a_id).then_some(())
        },
    )
    .await;
    let took = t0.elapsed();
    drop((a, b));
    env.clean().await;
    took
}

fn summary(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let ms = |d: &Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    let all: Vec<String> = times.iter().map(ms).collect();
    println!(
        "{what}: min {}, median {}, max {} over {} rounds ({})",
        ms(&times[0]),
        ms(&times[times.len() / 2]),
        ms(&times[times.len() - 1]),
        times.len(),
        all.join(", ")
    );
}

#[tokio::main]
async fn main() {
    let rounds = env_usize("ROUNDS", 10).max(1);
    // Holds the e2e cluster lock for the whole run, so no test shares the API server with the benchmark.
    let env = TestEnv::new().await;
    let mut term = Vec::new();
    for _ in 0..rounds {
        term.push(round(&env, "TERM", &[]).await);
    }
    summary("SIGTERM hand-over (default lease 15 s, retry 2 s)", term);
    let mut kill = Vec::new();
    for _ in 0..rounds {
        kill.push(round(&env, "KILL", &FAST_LEASE).await);
    }
    summary("kill -9 takeover (lease 4 s, renew 3 s, retry 1 s)", kill);
}
