//! Leader election on a coordination.k8s.io/v1 Lease with client-go's algorithm and defaults, plus what
//! client-go lacks: a fence ([`LeaderGuard`], in `guard`) that every write passes and whose deadline every
//! write carries, a watch on the Lease so a standby takes over as soon as the leader releases it, release
//! on shutdown only once no write of ours can still land, and a deleted Lease that is not recreated during
//! another holder's term. The decisions themselves are pure functions in `decision`.
//!
//! Why the fence is safe: a renewal counts from the moment its request was *sent*. Other replicas measure
//! expiry from when they *observed* that renewal, which is later. A write may start only while the last
//! successful renewal is younger than the renew deadline (10 s) and must end by that renewal + lease
//! duration (15 s) − a safety margin — enforced by the client and by the API server (`timeout=`) — so
//! none of this process's writes can be applied once anyone else may lead. Also after a SIGSTOP: the
//! guard reads the monotonic clock, which keeps running while the process is frozen.

pub mod decision;
mod guard;
mod path;
pub mod takeover;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use prometheus::{IntGaugeVec, Opts, Registry};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use decision::{Decision, Observation};
pub use guard::{Fenced, LeaderGuard, RequestInFlight, Unsettled, WriteTicket};
pub use takeover::Takeover;

/// client-go's jitter factor for the acquire loop.
const JITTER_FACTOR: f64 = 1.2;

/// Leader-election settings (KCM's `--leader-elect-*` flags).
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This process's identity, `hostname_uuid`.
    pub identity: String,
    /// How long a lease is valid after its last observed renewal (whole seconds: the Lease stores seconds).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

/// Why a leadership term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEnd {
    /// Renewal failed within the renew deadline, or another holder took the lease.
    Lost,
    /// Shutdown was requested while leading.
    Cancelled,
}

/// Runs client-go's acquire / renew / release cycle for one process.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaderElectionConfig,
    guard: LeaderGuard,
    master_status: IntGaugeVec,
    /// The last lease record seen and when it was observed locally (client-go's observedTime).
    observed: Option<Observation>,
    /// When the request of the last successful acquire or renewal was sent.
    last_renewal_sent: Option<Instant>,
}

/// A Lease operation that failed; retried by the loops.
#[derive(Debug, thiserror::Error)]
enum LeaseError {
    #[error("lease held by {holder} for up to {wait:?} more")]
    HeldByOther {
        holder: String,
        wait: Duration,
        /// The Lease is gone, but its last holder's term is not over.
        deleted: bool,
    },
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("lease request timed out")]
    Timeout,
}

fn now_micro() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

impl LeaderElector {
    /// Creates an elector; registers `leader_election_master_status`. `client` should be the election's
    /// own client ([`crate::client::build_unfenced_client`]): renewals must neither queue behind the
    /// controllers' requests nor pass the fence they keep.
    pub fn new(
        client: kube::Client,
        cfg: LeaderElectionConfig,
        guard: LeaderGuard,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let master_status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(master_status.clone()))?;
        master_status.with_label_values(&[&cfg.name]).set(0);
        Ok(Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            guard,
            master_status,
            observed: None,
            last_renewal_sent: None,
        })
    }

    /// This process's identity.
    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    fn jittered_retry(&self) -> Duration {
        let extra = rand::rng().random_range(0.0..JITTER_FACTOR);
        self.cfg.retry_period.mul_f64(1.0 + extra)
    }

    /// Blocks until this process holds the lease (true) or `cancel` fires (false). Wakes early whenever
    /// the Lease changes, so a released lease is taken over at once rather than at the next retry.
    pub async fn acquire(&mut self, cancel: &CancellationToken) -> bool {
        let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
        let lease_watch = watcher(
            self.api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.name)),
        );
        let watch_task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(lease_watch);
            while let Some(ev) = stream.next().await {
                if ev.is_err() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                let _ = wake_tx.try_send(());
            }
        });
        let mut logged_holder = String::new();
        let acquired = loop {
            let timeout = decision::attempt_timeout(self.cfg.renew_deadline);
            match self.try_acquire_or_renew(timeout).await {
                Ok(()) => break true,
                Err(LeaseError::HeldByOther {
                    holder,
                    wait,
                    deleted: true,
                }) => {
                    tracing::info!(lease = %self.cfg.name, last_holder = %holder, wait = ?wait, "the lease was deleted during another replica's term; waiting out that term before creating it");
                }
                Err(LeaseError::HeldByOther { holder, .. }) => {
                    if holder != logged_holder {
                        tracing::info!(lease = %self.cfg.name, holder = %holder, "standing by: the lease is held by another replica");
                        logged_holder = holder;
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.cfg.name, error = %e, "failed to acquire the lease; retrying")
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => break false,
                _ = tokio::time::sleep(self.jittered_retry()) => {}
                Some(()) = wake_rx.recv() => {}
            }
        };
        watch_task.abort();
        if acquired {
            self.master_status
                .with_label_values(&[&self.cfg.name])
                .set(1);
            tracing::info!(lease = %format!("{}/{}", self.cfg.namespace, self.cfg.name), identity = %self.cfg.identity, "successfully acquired lease; this replica now leads");
            if let Some(t) = self.guard.takeover() {
                tracing::info!(lease = %self.cfg.name, previous_holder = %t.previous_holder, previous_configuration_known = t.previous_configuration.is_some(), writes_may_land_for = ?t.writes_may_land_until.saturating_duration_since(Instant::now()), "took the lease over from an earlier leader");
            }
        }
        acquired
    }

    /// Renews every retry period until renewal fails for the renew deadline (Lost) or `cancel` fires.
    /// No attempt runs past the renew deadline, so the loss is declared on time even when requests hang.
    pub async fn renew_until_lost(&mut self, cancel: &CancellationToken) -> TermEnd {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return TermEnd::Cancelled,
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
            loop {
                let since = self
                    .last_renewal_sent
                    .map(|at| at.elapsed())
                    .unwrap_or(Duration::MAX);
                // A process that was frozen past its deadline must not renew: another replica may lead now.
                let Some(timeout) =
                    decision::renewal_attempt_timeout(self.cfg.renew_deadline, since)
                else {
                    return self.lost("the renew deadline passed without a successful renewal");
                };
                match self.try_acquire_or_renew(timeout).await {
                    Ok(()) => break,
                    Err(LeaseError::HeldByOther { holder, .. }) => {
                        return self.lost(&format!("the lease is now held by {holder}"));
                    }
                    Err(e) => {
                        tracing::warn!(lease = %self.cfg.name, error = %e, "failed to renew the lease; retrying");
                        let left = self.cfg.renew_deadline.saturating_sub(
                            self.last_renewal_sent
                                .map(|at| at.elapsed())
                                .unwrap_or(Duration::MAX),
                        );
                        tokio::select! {
                            _ = cancel.cancelled() => return TermEnd::Cancelled,
                            _ = tokio::time::sleep(self.cfg.retry_period.min(left)) => {}
                        }
                    }
                }
            }
        }
    }

    fn lost(&mut self, why: &str) -> TermEnd {
        self.guard.step_down();
        self.master_status
            .with_label_values(&[&self.cfg.name])
            .set(0);
        tracing::error!(lease = %self.cfg.name, reason = why, "leaderelection lost");
        TermEnd::Lost
    }

    /// Gives the lease up (holder cleared, duration 1 s) so a standby takes over at once — but only once
    /// no write of ours is in flight or can still land; otherwise the lease is left to expire.
    pub async fn release(&mut self) {
        self.master_status
            .with_label_values(&[&self.cfg.name])
            .set(0);
        if let Err(unsettled) = self
            .guard
            .stop_writes_and_settle(self.cfg.retry_period)
            .await
        {
            tracing::warn!(lease = %self.cfg.name, reason = %unsettled, "not releasing the lease: leaving the lease to expire, so no other replica leads while one of our writes may still be applied");
            return;
        }
        let deadline = self.cfg.renew_deadline;
        let result = tokio::time::timeout(deadline, async {
            loop {
                let mut lease = self.api.get(&self.cfg.name).await?;
                let spec = lease.spec.get_or_insert_with(Default::default);
                if holder(spec) != self.cfg.identity {
                    return Ok::<(), kube::Error>(());
                }
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(now_micro());
                match self
                    .api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        match result {
            Ok(Ok(())) => tracing::info!(lease = %self.cfg.name, "released the lease"),
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.name, error = %e, "failed to release the lease")
            }
            Err(_) => tracing::warn!(lease = %self.cfg.name, "timed out releasing the lease"),
        }
    }

    async fn try_acquire_or_renew(&mut self, timeout: Duration) -> Result<(), LeaseError> {
        let sent = Instant::now();
        let _in_flight = self.guard.renewal_sent(sent);
        tokio::time::timeout(timeout, self.try_acquire_or_renew_once(sent))
            .await
            .map_err(|_| LeaseError::Timeout)?
    }

    async fn try_acquire_or_renew_once(&mut self, sent: Instant) -> Result<(), LeaseError> {
        let existing = self.api.get_opt(&self.cfg.name).await?;
        let now = Instant::now();
        let current = existing
            .as_ref()
            .map(|l| l.spec.clone().unwrap_or_default());
        self.observed = decision::observe(self.observed.take(), current.as_ref(), now);
        let decision = decision::decide(
            self.observed.as_ref(),
            current.as_ref(),
            &self.cfg.identity,
            now,
        );
        if let Decision::HeldByOther { holder, wait } = decision {
            return Err(LeaseError::HeldByOther {
                holder,
                wait,
                deleted: existing.is_none(),
            });
        }
        // Validated to be whole seconds that fit (flags.rs).
        let duration_secs = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let record = decision::next_record(
            current.as_ref(),
            &decision,
            &self.cfg.identity,
            duration_secs,
            now_micro(),
        );
        // The record this write replaces, kept only when leadership changes hands.
        let replaced = (decision != Decision::Renew)
            .then(|| existing.clone())
            .flatten();
        let written = match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(record),
                };
                self.api.create(&PostParams::default(), &lease).await?
            }
            Some(mut lease) => {
                lease.spec = Some(record);
                // The resourceVersion in `lease` makes this an optimistic update: a racing writer gets a 409.
                self.api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await?
            }
        };
        if decision != Decision::Renew {
            // Read before `observed` moves on to this process's own record.
            self.guard.took_over(takeover::after_winning(
                &decision,
                replaced.as_ref(),
                self.observed.as_ref().map(|o| &o.spec),
                self.cfg.lease_duration,
                self.guard.safety_margin(),
                Instant::now(),
            ));
        }
        self.observed = Some(Observation {
            spec: written.spec.unwrap_or_default(),
            at: Instant::now(),
        });
        self.last_renewal_sent = Some(sent);
        self.guard.renewed(sent);
        Ok(())
    }
}

/// KCM's identity: `hostname_uuid`.
pub fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".to_string());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_hostname_underscore_uuid_and_unique() {
        let a = default_identity();
        assert!(a.contains('_'));
        assert_ne!(a, default_identity());
    }
}
