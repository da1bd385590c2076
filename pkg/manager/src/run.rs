//! The manager's main sequence, in KCM's shape: serve HTTP, wait for the API server, win the lease, init
//! the enabled controllers (they subscribe to the informer), start the informer, wait for its cache, run
//! the controllers — and stop writing the moment the lease is lost.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use netcm_workqueue::WorkqueueMetrics;
use prometheus::Registry;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::client::{
    build_client, build_unfenced_client, load_config, ClientError, ClientMetrics, ClientOptions,
};
use crate::controller::{Controller, InitContext};
use crate::duration::format_duration;
use crate::events::EventRecorder;
use crate::flags::GenericFlags;
use crate::health::HealthChecks;
use crate::http::{self, Endpoints};
use crate::informer::SharedInformer;
use crate::leader::{default_identity, LeaderElectionConfig, LeaderElector, LeaderGuard, TermEnd};
use crate::metrics::{ManagerMetrics, VERSION};
use crate::node_fields::NodeFields;
use crate::registry::{Registry as ControllerRegistry, RegistryError};

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
}

/// Everything `run` needs besides the registry.
pub struct ManagerOptions {
    /// The generic flags, already validated.
    pub flags: GenericFlags,
    /// A line per controller-specific setting, logged at startup as the effective config.
    pub effective_config: Vec<(String, String)>,
}

/// A future that resolves on SIGTERM or SIGINT.
async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("received SIGTERM; shutting down"),
                    _ = int.recv() => tracing::info!("received SIGINT; shutting down"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The Node this process runs on: `NODE_NAME`, else looked up from `POD_NAME` + `POD_NAMESPACE`.
async fn own_node_name(client: &kube::Client) -> Option<String> {
    if let Ok(n) = std::env::var("NODE_NAME") {
        if !n.is_empty() {
            return Some(n);
        }
    }
    let (pod, ns) = (
        std::env::var("POD_NAME").ok()?,
        std::env::var("POD_NAMESPACE").ok()?,
    );
    match Api::<Pod>::namespaced(client.clone(), &ns).get(&pod).await {
        Ok(p) => p.spec.and_then(|s| s.node_name),
        Err(e) => {
            tracing::warn!(pod = %pod, namespace = %ns, error = %e, "could not look up this pod's node");
            None
        }
    }
}

/// Runs netcm until SIGTERM (Ok) or lost leadership (Err(LeadershipLost)).
pub async fn run(opts: ManagerOptions, controllers: ControllerRegistry) -> Result<(), RunError> {
    let flags = &opts.flags;
    let enabled: Vec<&'static str> = controllers
        .enabled(&flags.controllers)?
        .iter()
        .map(|d| d.name)
        .collect();
    let identity = default_identity();
    let lease_cfg = LeaderElectionConfig {
        name: flags.leader_elect_resource_name.clone(),
        namespace: flags.lease_namespace(),
        identity: identity.clone(),
        lease_duration: flags.leader_elect_lease_duration,
        renew_deadline: flags.leader_elect_renew_deadline,
        retry_period: flags.leader_elect_retry_period,
    };
    tracing::info!(version = VERSION, identity = %identity, "starting netcm");
    tracing::info!(
        controllers = %enabled.join(","),
        leader_elect = flags.leader_elect,
        lease = %format!("{}/{}", lease_cfg.namespace, lease_cfg.name),
        lease_duration = %format_duration(lease_cfg.lease_duration),
        renew_deadline = %format_duration(lease_cfg.renew_deadline),
        retry_period = %format_duration(lease_cfg.retry_period),
        kube_api_qps = flags.kube_api_qps,
        kube_api_burst = flags.kube_api_burst,
        listen = %format!("{}:{}", flags.bind_address, flags.port),
        "effective configuration"
    );
    for (k, v) in &opts.effective_config {
        tracing::info!(flag = %k, value = %v, "effective configuration");
    }

    let registry = Registry::new();
    let manager_metrics = ManagerMetrics::register(&registry)?;
    crate::sync_metrics::register(&registry)?;
    let workqueue_metrics = WorkqueueMetrics::register(&registry).map_err(|e| {
        RunError::Metrics(prometheus::Error::Msg(format!("workqueue metrics: {e}")))
    })?;
    let guard = if flags.leader_elect {
        LeaderGuard::new(&lease_cfg, &registry)?
    } else {
        LeaderGuard::disabled(&registry)?
    };
    let client_opts = ClientOptions {
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
    let config = load_config(&client_opts).await?;
    tracing::info!(server = %config.cluster_url, "API client configured");
    let client_metrics = ClientMetrics::register(&registry)?;
    // Leader election gets a client of its own, as in KCM: its own token bucket (a backlog on the shared
    // one must not delay renewals) and no fence (renewals are how the fence is kept).
    let election_client = build_unfenced_client(
        config.clone(),
        &client_opts.user_agent,
        client_opts.qps,
        client_opts.burst,
        client_metrics.clone(),
    )?;
    // The secure port's reviews build their own client from `config` too.
    let client = build_client(config.clone(), &client_opts, guard.clone(), client_metrics)?;

    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            termination_signal().await;
            shutdown.cancel();
        });
    }

    // Health: a standby is ready; the leader is ready once its cache has synced.
    let healthz = HealthChecks::default();
    let livez = HealthChecks::default();
    let readyz = HealthChecks::default();
    let api_reachable = Arc::new(AtomicBool::new(false));
    let cache_synced = Arc::new(AtomicBool::new(!flags.leader_elect));
    healthz.add("ping", Arc::new(|| Ok(())));
    livez.add("ping", Arc::new(|| Ok(())));
    for checks in [&healthz, &livez] {
        let g = guard.clone();
        checks.add("leaderElection", Arc::new(move || g.watchdog()));
    }
    {
        let reach = api_reachable.clone();
        readyz.add(
            "apiserver",
            Arc::new(move || {
                reach
                    .load(Ordering::SeqCst)
                    .then_some(())
                    .ok_or_else(|| "the API server has not been reached yet".to_string())
            }),
        );
        let (g, synced) = (guard.clone(), cache_synced.clone());
        readyz.add(
            "informer-sync",
            Arc::new(move || {
                if !g.is_leader() || synced.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("leading, but the Node cache has not synced yet".into())
                }
            }),
        );
    }
    let http_cancel = CancellationToken::new();
    if flags.port != 0 {
        let addr = SocketAddr::new(flags.bind_address, flags.port);
        let (listener, local) = http::bind(addr)
            .await
            .map_err(|source| RunError::Bind { addr, source })?;
        tracing::info!(address = %local, "serving /metrics, /healthz, /livez, /readyz");
        tokio::spawn(http::serve(
            listener,
            Endpoints {
                registry: registry.clone(),
                healthz: healthz.clone(),
                livez: livez.clone(),
                readyz: readyz.clone(),
            },
            http_cancel.clone(),
        ));
    }
    if flags.secure_port != 0 {
        let addr = SocketAddr::new(flags.bind_address, flags.secure_port);
        let acceptor = crate::secure::tls_acceptor(
            flags.tls_cert_file.as_deref(),
            flags.tls_private_key_file.as_deref(),
        )?;
        let (listener, local) = crate::secure::bind(addr)
            .await
            .map_err(|source| RunError::Bind { addr, source })?;
        tracing::info!(address = %local, "serving /metrics over HTTPS with delegated authentication and authorization");
        tokio::spawn(crate::secure::serve(
            listener,
            acceptor,
            crate::secure::Delegation::new(config, &client_opts.user_agent, &registry)?,
            Endpoints {
                registry: registry.clone(),
                healthz: healthz.clone(),
                livez: livez.clone(),
                readyz: readyz.clone(),
            },
            http_cancel.clone(),
        ));
    }
    let result = lead_and_run(LeadArgs {
        opts: &opts,
        controllers: &controllers,
        enabled: &enabled,
        client,
        election_client,
        registry,
        workqueue_metrics,
        manager_metrics,
        guard,
        lease_cfg,
        shutdown,
        healthz,
        api_reachable,
        cache_synced,
    })
    .await;
    http_cancel.cancel();
    result
}

struct LeadArgs<'a> {
    opts: &'a ManagerOptions,
    controllers: &'a ControllerRegistry,
    enabled: &'a [&'static str],
    client: kube::Client,
    election_client: kube::Client,
    registry: Registry,
    workqueue_metrics: WorkqueueMetrics,
    manager_metrics: ManagerMetrics,
    guard: LeaderGuard,
    lease_cfg: LeaderElectionConfig,
    shutdown: CancellationToken,
    healthz: HealthChecks,
    api_reachable: Arc<AtomicBool>,
    cache_synced: Arc<AtomicBool>,
}

async fn wait_for_apiserver(client: &kube::Client, shutdown: &CancellationToken) -> bool {
    let mut delay = Duration::from_millis(200);
    loop {
        match client.apiserver_version().await {
            Ok(v) => {
                tracing::info!(version = %v.git_version, "API server reachable");
                return true;
            }
            Err(e) => tracing::warn!(error = %e, "waiting for the API server"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

async fn lead_and_run(a: LeadArgs<'_>) -> Result<(), RunError> {
    let flags = &a.opts.flags;
    if !wait_for_apiserver(&a.client, &a.shutdown).await {
        return Ok(());
    }
    a.api_reachable.store(true, Ordering::SeqCst);

    // Leader election: a standby waits here; the renew loop then runs beside the controllers.
    let stop_renewing = CancellationToken::new();
    let mut elector = None;
    let renew_task = if flags.leader_elect {
        let mut e = LeaderElector::new(
            a.election_client.clone(),
            a.lease_cfg.clone(),
            a.guard.clone(),
            &a.registry,
        )?;
        if !e.acquire(&a.shutdown).await {
            tracing::info!("shut down while standing by");
            return Ok(());
        }
        publish_effective_config(&a).await;
        let stop = stop_renewing.clone();
        Some(tokio::spawn(async move {
            let end = e.renew_until_lost(&stop).await;
            (e, end)
        }))
    } else {
        None
    };
    let lost = CancellationToken::new();
    let mut renew_task = renew_task;

    let node_name = own_node_name(&a.client).await;
    let nodes: SharedInformer<Node> = SharedInformer::new();
    let ctx = InitContext {
        client: a.client.clone(),
        nodes: nodes.clone(),
        registry: a.registry.clone(),
        workqueue_metrics: a.workqueue_metrics.clone(),
        recorder: EventRecorder::new(a.client.clone(), "netcm", &a.lease_cfg.identity),
        leader: a.guard.clone(),
        node_name,
        leader_elected: flags.leader_elect,
        workers: 1,
    };
    let mut started: Vec<(&'static str, Controller)> = Vec::new();
    for d in a.controllers.descriptors() {
        if !a.enabled.contains(&d.name) {
            tracing::info!(
                controller = d.name,
                "skipping controller: disabled by --controllers"
            );
            continue;
        }
        if !flags.controller_start_interval.is_zero() {
            let jitter = rand::rng().random_range(0.0..1.0);
            tokio::time::sleep(flags.controller_start_interval.mul_f64(1.0 + jitter)).await;
        }
        let ctx = InitContext {
            workers: d.workers(),
            ..ctx.clone()
        };
        match d.init(&ctx).map_err(|source| RunError::Init {
            name: d.name,
            source,
        })? {
            Some(c) => started.push((d.name, c)),
            None => tracing::info!(
                controller = d.name,
                "skipping controller: disabled by its configuration"
            ),
        }
    }

    // The cache keeps only what the started controllers' reconcilers declared they read.
    let fields = started
        .iter()
        .fold(NodeFields::none(), |all, (_, c)| all.union(c.node_fields()));
    let informer_cancel = CancellationToken::new();
    let informer_task = tokio::spawn(nodes.clone().run(
        Api::<Node>::all(a.client.clone()),
        Arc::new(move |node: &mut Node| fields.trim(node)),
        informer_cancel.clone(),
    ));

    // Wait for the cache, unless the term ends first.
    let term_end = tokio::select! {
        _ = nodes.wait_synced() => None,
        _ = a.shutdown.cancelled() => Some(TermEnd::Cancelled),
        r = async { match renew_task.as_mut() { Some(t) => t.await.ok(), None => std::future::pending().await } } => {
            renew_task = None;
            Some(r.map(|(_, end)| end).unwrap_or(TermEnd::Lost))
        }
    };
    let controllers_cancel = CancellationToken::new();
    let mut running = tokio::task::JoinSet::new();
    if term_end.is_none() {
        a.cache_synced.store(true, Ordering::SeqCst);
        tracing::info!(
            nodes = nodes.list().len(),
            "caches are synced; starting controllers"
        );
        for (name, c) in started {
            a.manager_metrics
                .running_controllers
                .with_label_values(&[name, "netcm"])
                .set(1);
            a.healthz.add(name, Arc::new(|| Ok(())));
            tracing::info!(controller = name, "started controller");
            running.spawn(c.run(controllers_cancel.child_token(), DRAIN_TIMEOUT));
        }
    }

    let end = match term_end {
        Some(end) => end,
        None => tokio::select! {
            _ = a.shutdown.cancelled() => TermEnd::Cancelled,
            r = async { match renew_task.as_mut() { Some(t) => t.await.ok(), None => std::future::pending().await } } => {
                renew_task = None;
                r.map(|(_, end)| end).unwrap_or(TermEnd::Lost)
            }
        },
    };
    if end == TermEnd::Lost {
        lost.cancel();
    }

    // Stop controllers first (in-flight syncs finish, bounded), keep renewing meanwhile so the fence
    // holds, then release the lease — if no write of ours can still land (`LeaderElector::release`).
    controllers_cancel.cancel();
    let drained = tokio::time::timeout(DRAIN_TIMEOUT * 2, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("controllers did not stop in time");
        running.abort_all();
    }
    for name in a.enabled {
        a.manager_metrics
            .running_controllers
            .with_label_values(&[name, "netcm"])
            .set(0);
    }
    informer_cancel.cancel();
    let _ = informer_task.await;
    stop_renewing.cancel();
    if let Some(task) = renew_task.take() {
        if let Ok((e, end)) = task.await {
            elector = Some(e);
            if end == TermEnd::Lost {
                lost.cancel();
            }
        }
    }
    if lost.is_cancelled() {
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
async fn publish_effective_config(a: &LeadArgs<'_>) {
    let config = crate::published::EffectiveConfiguration {
        identity: a.lease_cfg.identity.clone(),
        version: VERSION.to_string(),
        controllers: a.enabled.iter().map(|s| s.to_string()).collect(),
        flags: a.opts.effective_config.iter().cloned().collect(),
    };
    let api = Api::namespaced(a.client.clone(), &a.lease_cfg.namespace);
    // The first renewal waits for this, then a retry period: both must fit in the renew deadline.
    let budget = a
        .lease_cfg
        .renew_deadline
        .saturating_sub(a.lease_cfg.retry_period)
        / 2;
    crate::published::publish(&api, &a.lease_cfg.name, &config, budget).await;
}
