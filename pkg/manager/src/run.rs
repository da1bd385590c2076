//! The manager's main sequence, in KCM's shape, as the phases of a [`Manager`] that read top to bottom:
//! **serve** HTTP; wait for the API server; **init** the enabled controllers (they subscribe to the
//! informer, which holds their events until they run, and build queues); **elect**: win the lease — a
//! warm standby lists and watches Nodes meanwhile; **sync**: wait for the informer's cache (a warm one
//! must also be proven fresh, [`catch_up`]); **run** the controllers until the term ends (SIGTERM, or
//! the lease is lost); **drain**: stop the controllers while the lease is still renewed, then release it
//! — or, once it is lost, stop writing and exit non-zero.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use netcm_node::CachedNode;
use netcm_workqueue::WorkqueueMetrics;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::client::ClientError;
use crate::controller::Controller;
use crate::duration::format_duration;
use crate::flags::GenericFlags;
use crate::http;
use crate::informer::SharedInformer;
use crate::leader::{default_identity, LeaderElectionConfig, LeaderElector, LeaderGuard, TermEnd};
use crate::metrics::{ManagerMetrics, VERSION};
use crate::node_fields::NodeFields;
use crate::registry::{Registry as ControllerRegistry, RegistryError};
use crate::supervision::{ControllerHealth, Failure, Supervisor};

mod catch_up;
mod clients;
mod health;
mod init;
mod process;
mod tasks;

use clients::Clients;
use health::Health;
use process::{bind, termination_signal, wait_for_apiserver};
use tasks::{Informer, Running, Term};

/// How long in-flight syncs may take to finish on shutdown or lost leadership.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the manager stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The lease was lost; the process must exit non-zero and restart as a standby.
    #[error("leaderelection lost")]
    LeadershipLost,
    /// A controller's init function failed.
    #[error("initializing controller {name}: {source}")]
    Init {
        /// The controller.
        name: &'static str,
        /// Why.
        source: crate::controller::InitError,
    },
    /// The client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A `--controllers` entry is unknown.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The metrics/health listener could not bind.
    #[error("--bind-address/--port {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A metric could not be registered (a programming error).
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The secure listener could not be configured.
    #[error(transparent)]
    Secure(#[from] crate::secure::SecureError),
    /// An informer subscription came too late (a programming error).
    #[error(transparent)]
    Informer(#[from] crate::informer::AlreadyStarted),
    /// The replica could not work (a panic, a worker loop that ended, a stalled queue): it drained,
    /// released the lease and must exit non-zero so a standby takes over and it is restarted.
    #[error("stopped because this replica cannot work: {0}")]
    Failed(String),
}

/// Everything `run` needs besides the registry.
pub struct ManagerOptions {
    /// The generic flags, already validated.
    pub flags: GenericFlags,
    /// A line per controller-specific setting, logged at startup as the effective config.
    pub effective_config: Vec<(String, String)>,
}

/// Runs netcm until SIGTERM (Ok) or lost leadership (Err(LeadershipLost)).
pub async fn run(opts: ManagerOptions, controllers: ControllerRegistry) -> Result<(), RunError> {
    let manager = Manager::new(opts, controllers).await?;
    let serving = manager.serve().await?;
    let result = manager.lead().await;
    serving.cancel();
    match manager.failure.reason() {
        Some(reason) if result.is_ok() => Err(RunError::Failed(reason)),
        _ => result,
    }
}

/// What every phase shares, built before the first: flags, metrics, the fence, the clients, the
/// shutdown signal and the health checks.
struct Manager {
    opts: ManagerOptions,
    controllers: ControllerRegistry,
    enabled: Vec<&'static str>,
    lease: LeaderElectionConfig,
    registry: Registry,
    metrics: ManagerMetrics,
    workqueue_metrics: WorkqueueMetrics,
    guard: LeaderGuard,
    /// What builds each controller's client ([`Manager::init`]) and the secure port's.
    clients: Clients,
    /// The process's own client (Events, the effective configuration, finding its Node): token bucket,
    /// fence and deadline for writes, metrics.
    client: kube::Client,
    /// Leader election's own client: its own token bucket, no fence.
    election_client: kube::Client,
    /// Cancelled on SIGTERM or SIGINT, or when the replica fails.
    shutdown: CancellationToken,
    /// Raised by a panic, a worker loop that ended or a stalled queue: the replica stops as on SIGTERM,
    /// then exits non-zero.
    failure: Failure,
    health: Health,
    /// The shared Node informer: held until the controllers run.
    nodes: SharedInformer<CachedNode>,
}

/// The controllers an init phase built, by name, not yet running.
type Initialized = Vec<(&'static str, Controller)>;

impl Manager {
    /// Logs the effective configuration and builds what the phases share; no API call yet.
    async fn new(opts: ManagerOptions, controllers: ControllerRegistry) -> Result<Self, RunError> {
        let flags = &opts.flags;
        let enabled: Vec<&'static str> = controllers
            .enabled(&flags.controllers)?
            .iter()
            .map(|d| d.name)
            .collect();
        let identity = default_identity();
        let lease = LeaderElectionConfig {
            name: flags.leader_elect_resource_name.clone(),
            namespace: flags.lease_namespace(),
            identity: identity.clone(),
            lease_duration: flags.leader_elect_lease_duration,
            renew_deadline: flags.leader_elect_renew_deadline,
            retry_period: flags.leader_elect_retry_period,
        };
        tracing::info!(version = VERSION, identity = %identity, "starting netcm");
        let test_faults = std::env::var(crate::supervision::faults::VARIABLE).ok();
        if let Some(warning) = crate::supervision::faults::startup_warning(test_faults.as_deref()) {
            tracing::warn!("{warning}");
        }
        tracing::info!(
            controllers = %enabled.join(","),
            leader_elect = flags.leader_elect,
            warm_standby = flags.warm_standby,
            lease = %format!("{}/{}", lease.namespace, lease.name),
            lease_duration = %format_duration(lease.lease_duration),
            renew_deadline = %format_duration(lease.renew_deadline),
            retry_period = %format_duration(lease.retry_period),
            kube_api_qps = flags.kube_api_qps,
            kube_api_burst = flags.kube_api_burst,
            kube_api_content_type = flags.kube_api_content_type.as_str(),
            listen = %format!("{}:{}", flags.bind_address, flags.port),
            "effective configuration"
        );
        for (k, v) in &opts.effective_config {
            tracing::info!(flag = %k, value = %v, "effective configuration");
        }

        let failure = Failure::default();
        failure.install_panic_hook();
        let registry = Registry::new();
        crate::logging::register_metrics(&registry)?;
        // Held: the controllers' handlers hear nothing until they run, so a standby's queues stay empty.
        let nodes: SharedInformer<CachedNode> = SharedInformer::closed();
        let metrics = ManagerMetrics::register(&registry, &nodes)?;
        crate::sync_metrics::register(&registry)?;
        let workqueue_metrics = WorkqueueMetrics::register(&registry).map_err(|e| {
            RunError::Metrics(prometheus::Error::Msg(format!("workqueue metrics: {e}")))
        })?;
        let guard = if flags.leader_elect {
            LeaderGuard::new(&lease, &registry)?
        } else {
            LeaderGuard::disabled(&registry)?
        };
        let clients = Clients::load(flags, &identity, &guard, &registry).await?;
        let election_client = clients.election()?;
        let client = clients.fenced()?;

        let shutdown = CancellationToken::new();
        tokio::spawn({
            let (shutdown, failure) = (shutdown.clone(), failure.clone());
            async move {
                tokio::select! {
                    () = termination_signal() => {}
                    () = failure.failed() => {}
                }
                shutdown.cancel();
            }
        });
        let health = Health::new(&guard, flags.leader_elect);
        Ok(Self {
            enabled,
            lease,
            registry,
            metrics,
            workqueue_metrics,
            guard,
            clients,
            client,
            election_client,
            shutdown,
            failure,
            health,
            nodes,
            opts,
            controllers,
        })
    }

    /// Serve: `/metrics`, `/healthz`, `/livez`, `/readyz` on `--port`, and over TLS with delegated
    /// authentication and authorization on `--secure-port`, until the returned token is cancelled.
    async fn serve(&self) -> Result<CancellationToken, RunError> {
        let flags = &self.opts.flags;
        let cancel = CancellationToken::new();
        let endpoints = self.health.endpoints(&self.registry);
        if flags.port != 0 {
            let (listener, local) = bind(SocketAddr::new(flags.bind_address, flags.port)).await?;
            tracing::info!(address = %local, "serving /metrics, /healthz, /livez, /readyz");
            tokio::spawn(http::serve(listener, endpoints.clone(), cancel.clone()));
        }
        if flags.secure_port != 0 {
            let acceptor = crate::secure::tls_acceptor(
                flags.tls_cert_file.as_deref(),
                flags.tls_private_key_file.as_deref(),
            )?;
            let addr = SocketAddr::new(flags.bind_address, flags.secure_port);
            let (listener, local) = bind(addr).await?;
            tracing::info!(address = %local, "serving /metrics over HTTPS with delegated authentication and authorization");
            let delegation = crate::secure::Delegation::new(
                self.clients.config.clone(),
                self.clients.user_agent(),
                &self.registry,
            )?;
            tokio::spawn(crate::secure::serve(
                listener,
                acceptor,
                delegation,
                endpoints,
                cancel.clone(),
            ));
        }
        Ok(cancel)
    }

    /// The phases after serving: init → elect → sync → run → drain. A warm standby (`--warm-standby`)
    /// starts its informer before it elects and proves the cache fresh in sync; else the informer starts
    /// once the Lease is won.
    async fn lead(&self) -> Result<(), RunError> {
        if !wait_for_apiserver(&self.client, &self.shutdown).await {
            return Ok(());
        }
        self.health.api_reachable.store(true, Ordering::SeqCst);
        let nodes = &self.nodes;
        let initialized = self.init(nodes).await?;
        // The cache keeps only what the initialized controllers' reconcilers declared they read.
        let fields = initialized
            .iter()
            .fold(NodeFields::none(), |all, (_, c)| all.union(c.node_fields()));
        let warm = self.opts.flags.leader_elect && self.opts.flags.warm_standby;
        let start_informer = |fields: NodeFields| {
            Informer::start(
                nodes,
                &self.client,
                self.opts.flags.kube_api_content_type,
                fields,
                &self.failure,
            )
        };
        let standing_by = warm.then(|| start_informer(fields.clone()));
        let Some(mut term) = self.elect().await? else {
            if let Some(informer) = standing_by {
                informer.stop().await;
            }
            return Ok(());
        };
        let mut informer = standing_by.unwrap_or_else(|| start_informer(fields));
        let mut running = Running::none();
        let end = match self.sync(nodes, &mut informer, warm, &mut term).await {
            Some(end) => end,
            None => {
                running = self.run_controllers(initialized, nodes);
                self.term_end(&mut term).await
            }
        };
        self.drain(running, informer, term, end).await
    }

    /// Elect: under leader election, acquire the Lease (a standby waits here, ready), publish the
    /// effective configuration on it and start the renew loop. `None`: shut down before leading.
    async fn elect(&self) -> Result<Option<Term>, RunError> {
        if !self.opts.flags.leader_elect {
            return Ok(Some(Term::unelected()));
        }
        let mut elector = LeaderElector::new(
            self.election_client.clone(),
            self.lease.clone(),
            self.guard.clone(),
            &self.registry,
        )?;
        if !elector.acquire(&self.shutdown).await {
            tracing::info!("shut down while standing by");
            return Ok(None);
        }
        self.publish_effective_config().await;
        Ok(Some(Term::start(elector)))
    }

    /// Sync: wait for the informer's first full list and, when it started before the Lease was won
    /// (`warm`), for the proof that it holds every write made before ([`catch_up`]). `None` once synced;
    /// the term's end if it came first.
    async fn sync(
        &self,
        nodes: &SharedInformer<CachedNode>,
        informer: &mut Informer,
        warm: bool,
        term: &mut Term,
    ) -> Option<TermEnd> {
        let synced = async {
            nodes.wait_synced().await;
            if warm {
                self.catch_up(nodes, informer).await;
            }
        };
        tokio::select! {
            () = synced => None,
            end = self.term_end(term) => Some(end),
        }
    }

    /// Run: start every initialized controller (`Controller::run`); the renew loop keeps the lease.
    fn run_controllers(
        &self,
        initialized: Initialized,
        nodes: &SharedInformer<CachedNode>,
    ) -> Running {
        self.health.cache_synced.store(true, Ordering::SeqCst);
        nodes.open();
        tracing::info!(
            nodes = nodes.list().len(),
            "caches are synced; starting controllers"
        );
        let mut running = Running::none();
        for (name, c) in initialized {
            let supervisor = self.supervisor();
            // Per-controller checks by name, as KCM's: ok until the controller cannot work. Added before
            // the controller counts as running, so whoever sees it running finds its check.
            for checks in [&self.health.healthz, &self.health.livez] {
                let health = supervisor.health.clone();
                checks.add(name, Arc::new(move || health.check()));
            }
            self.metrics
                .running_controllers
                .with_label_values(&[name, "netcm"])
                .set(1);
            tracing::info!(controller = name, "started controller");
            running.spawn(name, c, supervisor);
        }
        running
    }

    /// What a controller reports to: this process's failure, a health check of its own, the stall timeout.
    fn supervisor(&self) -> Supervisor {
        let stall = self.opts.flags.controller_stall_timeout;
        Supervisor {
            failure: self.failure.clone(),
            health: ControllerHealth::default(),
            stall_timeout: (!stall.is_zero()).then_some(stall),
        }
    }

    /// How the term ends: SIGTERM (or a failure of the replica), or the renew loop's end (the lease was lost).
    async fn term_end(&self, term: &mut Term) -> TermEnd {
        tokio::select! {
            _ = self.shutdown.cancelled() => TermEnd::Cancelled,
            end = term.renewal_ended() => end,
        }
    }

    /// Drain: stop the controllers first (in-flight syncs finish, bounded) while the renew loop keeps
    /// the lease, so the fence holds; stop the informer; then stop renewing and release the lease — only
    /// if it was not lost meanwhile, and only once no write of ours can still land
    /// ([`LeaderElector::release`]). A lost lease is an error: the process exits non-zero.
    async fn drain(
        &self,
        running: Running,
        informer: Informer,
        term: Term,
        end: TermEnd,
    ) -> Result<(), RunError> {
        running.stop().await;
        for name in &self.enabled {
            self.metrics
                .running_controllers
                .with_label_values(&[name, "netcm"])
                .set(0);
        }
        informer.stop().await;
        let (elector, last) = term.stop().await;
        if end == TermEnd::Lost || last == Some(TermEnd::Lost) {
            return Err(RunError::LeadershipLost);
        }
        if let Some(mut e) = elector {
            e.release().await;
        }
        tracing::info!("netcm stopped");
        Ok(())
    }

    /// Puts the effective configuration on the Lease just won, before the renew loop starts (so the two
    /// never race), for `netcm check`.
    async fn publish_effective_config(&self) {
        let config = crate::published::EffectiveConfiguration {
            identity: self.lease.identity.clone(),
            version: VERSION.to_string(),
            controllers: self.enabled.iter().map(|s| s.to_string()).collect(),
            flags: self.opts.effective_config.iter().cloned().collect(),
        };
        let api = Api::namespaced(self.client.clone(), &self.lease.namespace);
        // The first renewal waits for this, then a retry period: both must fit in the renew deadline.
        let budget = self
            .lease
            .renew_deadline
            .saturating_sub(self.lease.retry_period)
            / 2;
        crate::published::publish(&api, &self.lease.name, &config, budget).await;
    }
}

#[cfg(test)]
mod tests;
