//! The process's API clients: one configuration, loaded once, and a client per owner — the process's
//! own, leader election's, one per controller — each with its own token bucket, as KCM gives each
//! controller its own clientset at `--kube-api-qps`.

use prometheus::Registry;

use crate::client::{
    build_client, build_unfenced_client, load_config, ClientError, ClientMetrics, ClientOptions,
};
use crate::flags::GenericFlags;
use crate::leader::LeaderGuard;
use crate::metrics::VERSION;

/// What builds every client of the process: the loaded configuration, options, the fence, metrics.
pub(super) struct Clients {
    /// The loaded configuration; the secure port's reviews build their own client from it.
    pub(super) config: kube::Config,
    opts: ClientOptions,
    guard: LeaderGuard,
    metrics: ClientMetrics,
}

impl Clients {
    /// Loads the configuration (kubeconfig, in-cluster or `--master`) and registers `rest_client_*`.
    pub(super) async fn load(
        flags: &GenericFlags,
        identity: &str,
        guard: &LeaderGuard,
        registry: &Registry,
    ) -> Result<Self, super::RunError> {
        let opts = ClientOptions {
            kubeconfig: flags.kubeconfig.clone(),
            master: flags.master.clone(),
            qps: flags.kube_api_qps,
            burst: flags.kube_api_burst,
            user_agent: format!(
                "netcm/{VERSION} ({}/{}) {identity}",
                std::env::consts::OS,
                std::env::consts::ARCH
            ),
        };
        let config = load_config(&opts).await?;
        tracing::info!(server = %config.cluster_url, "API client configured");
        Ok(Self {
            config,
            opts,
            guard: guard.clone(),
            metrics: ClientMetrics::register(registry)?,
        })
    }

    /// Every request's User-Agent: version, platform and this replica's identity.
    pub(super) fn user_agent(&self) -> &str {
        &self.opts.user_agent
    }

    /// A fenced client with a token bucket of its own: the process's (Events, the effective
    /// configuration, finding its Node), or one controller's, so one controller's backlog (the
    /// annotation syncer's, say) does not halve another's allocation rate.
    pub(super) fn fenced(&self) -> Result<kube::Client, ClientError> {
        build_client(
            self.config.clone(),
            &self.opts,
            self.guard.clone(),
            self.metrics.clone(),
        )
    }

    /// Leader election's client, as in KCM: its own token bucket (a backlog elsewhere must not delay
    /// renewals) and no fence (renewals are how the fence is kept).
    pub(super) fn election(&self) -> Result<kube::Client, ClientError> {
        build_unfenced_client(
            self.config.clone(),
            &self.opts.user_agent,
            self.opts.qps,
            self.opts.burst,
            self.metrics.clone(),
        )
    }
}
