//! The startup sweep: a leader-elected process that is not leading (yet) still removes the routes it
//! left in its table, during an earlier term, for Nodes that no longer exist. Without it a host that
//! stopped leading would keep routing pod CIDRs of deleted Nodes (which may be handed to new Nodes)
//! until it happened to lead again.
//!
//! The sweep lists every Node once (its own "cache sync", before the manager's informer exists), then
//! runs the leader's own reconcile on a private [`RouteSyncer`] (with the ClusterCIDR objects' ranges read
//! once, as the leader's watch keeps them): the same rule decides what no Node wants
//! and what is netcm's to delete, a route to a pod CIDR that overlaps an earlier Node's included (the
//! listing carries every Node's creation time, so it reads none). It needs no lease: the routes are this host's, not the cluster's. If
//! the process starts leading first, the controller stops the sweep ([`StartupSweep::finish`]) and its
//! first reconcile does the same work.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_manager::client::{load_config, ClientError, ClientOptions};
use netcm_manager::LeaderGuard;
use netcm_node::CachedNode;
use tokio_util::sync::CancellationToken;

use crate::backend::BackendError;
use crate::flags::Config;
use crate::metrics::RouteMetrics;
use crate::netlink::{NetlinkRoutes, OpenError};
use crate::ownership::Ownership;
use crate::seniority::Listed;
use crate::table::{Parts, RouteSyncer};
use crate::NAME;

/// Nodes per page of the sweep's list.
const PAGE: u32 = 500;
/// The longest wait between two attempts to list the Nodes.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(10);

/// Why one attempt of the sweep failed.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// No client configuration.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The API call failed.
    #[error("listing from the API server: {0}")]
    List(#[from] kube::Error),
    /// No route backend (no CAP_NET_ADMIN, no netlink).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The table could not be listed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A metric of the private registry (a programming error).
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

#[derive(Default)]
struct Inner {
    stop: CancellationToken,
    /// Held while the sweep changes the table.
    busy: tokio::sync::Mutex<()>,
}

/// One sweep per process, shared by `main` (which starts it) and the controller (which stops it).
#[derive(Clone, Default)]
pub struct StartupSweep {
    inner: Arc<Inner>,
}

impl StartupSweep {
    /// A sweep not started yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops a sweep still waiting for the Nodes and waits for one that is deleting to finish.
    pub async fn finish(&self) {
        self.inner.stop.cancel();
        drop(self.inner.busy.lock().await);
    }

    /// Lists the Nodes (retrying until the API server answers) and, with `pools`, the ClusterCIDR
    /// objects' ranges, then deletes this host's routes that no Node wants. `own_node` is the Node this
    /// process runs on, if known.
    pub async fn run(
        self,
        client: ClientOptions,
        config: Config,
        own_node: Option<String>,
        pools: bool,
    ) {
        let stop = self.inner.stop.clone();
        let (nodes, births) = tokio::select! {
            _ = stop.cancelled() => return,
            listed = list_nodes_until_done(&client) => listed,
        };
        let pool_ranges = if pools {
            list_pool_ranges(&client).await
        } else {
            Vec::new()
        };
        let _busy = self.inner.busy.lock().await;
        if stop.is_cancelled() {
            return;
        }
        match sweep(&nodes, births, &config, own_node, pool_ranges).await {
            Ok(deleted) => tracing::info!(
                controller = NAME,
                nodes = nodes.len(),
                deleted,
                "startup sweep: removed this host's routes to Nodes that no longer exist, before leading"
            ),
            Err(e) => tracing::warn!(
                controller = NAME,
                error = %e,
                "startup sweep failed; the first reconcile as leader removes stale routes"
            ),
        }
    }
}

async fn list_nodes_until_done(client: &ClientOptions) -> (Vec<Arc<CachedNode>>, Listed) {
    let mut delay = Duration::from_millis(200);
    loop {
        match list_nodes(client).await {
            Ok(nodes) => return nodes,
            Err(e) => {
                tracing::debug!(controller = NAME, error = %e, "startup sweep: cannot list Nodes yet")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}

/// Every Node, page by page: the complete list is what "the cache has synced" means here. Each page's
/// full Nodes are dropped once cached, their creation times kept.
async fn list_nodes(client: &ClientOptions) -> Result<(Vec<Arc<CachedNode>>, Listed), SweepError> {
    let config = load_config(client).await?;
    let api: Api<Node> = Api::all(kube::Client::try_from(config)?);
    let mut params = ListParams::default().limit(PAGE);
    let mut nodes = Vec::new();
    let mut births = Listed::default();
    loop {
        let page = api.list(&params).await?;
        for n in &page.items {
            births.add(n);
            nodes.push(Arc::new(CachedNode::from(n)));
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok((nodes, births)),
        }
    }
}

/// The ClusterCIDR objects' ranges, read once. Any failure reads as none: the sweep then leaves the
/// routes in them alone (its rule only narrows), and the first reconcile as leader judges them.
async fn list_pool_ranges(client: &ClientOptions) -> Vec<ipnet::IpNet> {
    let listed = async {
        let config = load_config(client).await?;
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            kube::Client::try_from(config)?,
            &crate::pools::api_resource(),
        );
        Ok::<_, SweepError>(api.list(&ListParams::default()).await?)
    };
    match listed.await {
        Ok(list) => list.items.iter().flat_map(crate::pools::ranges).collect(),
        Err(e) => {
            tracing::debug!(controller = NAME, error = %e, "startup sweep: no ClusterCIDR ranges; leaving routes in them alone");
            Vec::new()
        }
    }
}

/// The leader's reconcile on a private syncer; the number of routes deleted.
async fn sweep(
    nodes: &[Arc<CachedNode>],
    births: Listed,
    config: &Config,
    own_node: Option<String>,
    pool_ranges: Vec<ipnet::IpNet>,
) -> Result<usize, SweepError> {
    let (backend, connection) = NetlinkRoutes::open(config.table, config.protocol)?;
    let connection = tokio::spawn(connection);
    // Its own registry: these counts are not the controller's.
    let registry = prometheus::Registry::new();
    let known: Vec<_> = births.named(nodes).collect();
    let ownership = Ownership::new(config.cluster_cidrs.clone());
    ownership.set_pool_ranges(pool_ranges);
    let syncer = RouteSyncer::new(Parts {
        backend: Arc::new(backend),
        keys: config.keys.clone(),
        own_node,
        ownership,
        guard: LeaderGuard::disabled(&registry)?,
        metrics: RouteMetrics::register(&registry)?,
        births: Arc::new(births),
    });
    syncer.remember_births(known);
    let report = syncer.reconcile(nodes).await;
    connection.abort();
    Ok(report?.deleted.len())
}
