//! The API client: config precedence as KCM's (`--kubeconfig`/`--master`, then `KUBECONFIG`, then
//! in-cluster, then `~/.kube/config`), a user agent naming netcm and its leader identity, and the tower
//! stack every request passes (`layer`): kube's retry policy on top, so each attempt passes the client's
//! own token bucket, then the leader fence and deadline for writes, then the `rest_client_*` metrics.
//!
//! The process has a client per controller and one for its own requests (each its own
//! `--kube-api-qps`/`--kube-api-burst` bucket, as KCM's per-controller clientsets; writes fenced), and
//! leader election's own ([`build_unfenced_client`]), so renewals never queue behind a backlog.

mod layer;
pub mod protobuf;
pub mod unread;

use std::path::PathBuf;

use kube::client::retry::RetryPolicy;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

use crate::leader::LeaderGuard;
pub use layer::{ClientMetrics, NetcmLayer, NetcmService, WriteDeadlineExceeded};

/// Where the client's configuration comes from and how fast it may talk.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--master`: overrides the server in the kubeconfig.
    pub master: Option<String>,
    /// `--kube-api-qps`.
    pub qps: f32,
    /// `--kube-api-burst`.
    pub burst: u32,
    /// The User-Agent header.
    pub user_agent: String,
}

/// A client that could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig could not be read or used.
    #[error("--kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        source: kube::config::KubeconfigError,
    },
    /// No configuration was found anywhere.
    #[error("no client configuration: set --kubeconfig or --master, KUBECONFIG, run in a cluster, or create ~/.kube/config ({0})")]
    NotFound(String),
    /// `--master` is not a URL.
    #[error("--master {0:?} is not a valid URL")]
    BadMaster(String),
    /// The client stack could not be built.
    #[error("building the API client: {0}")]
    Build(#[from] kube::Error),
    /// The user agent has characters a header cannot carry.
    #[error("user agent {0:?} is not a valid header value")]
    BadUserAgent(String),
    /// Registering metrics failed.
    #[error("registering client metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Loads the kube config by KCM's precedence.
pub async fn load_config(opts: &ClientOptions) -> Result<kube::Config, ClientError> {
    let mut config = if let Some(path) = &opts.kubeconfig {
        let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
            path: path.display().to_string(),
            source,
        })?;
        kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?
    } else if let Some(master) = &opts.master {
        let uri = master
            .parse()
            .map_err(|_| ClientError::BadMaster(master.clone()))?;
        kube::Config::new(uri)
    } else if std::env::var_os("KUBECONFIG").is_some() {
        kube::Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .map_err(|source| ClientError::Kubeconfig {
                path: std::env::var("KUBECONFIG").unwrap_or_default(),
                source,
            })?
    } else {
        match kube::Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(|e| {
                    ClientError::NotFound(format!("in-cluster: {in_cluster}; ~/.kube/config: {e}"))
                })?,
        }
    };
    if let (Some(master), Some(_)) = (&opts.master, &opts.kubeconfig) {
        config.cluster_url = master
            .parse()
            .map_err(|_| ClientError::BadMaster(master.clone()))?;
    }
    Ok(config)
}

/// How many requests may wait for our layer's inner service; as kube's own client buffer.
const BUFFER: usize = 1024;

/// Builds the process's shared client from a loaded config: its own token bucket
/// (`--kube-api-qps`/`--kube-api-burst`), every write except TokenReviews and SubjectAccessReviews fenced
/// by `guard` and bounded by its deadline, metered in `metrics`. Call it inside the tokio runtime.
pub fn build_client(
    config: kube::Config,
    opts: &ClientOptions,
    guard: LeaderGuard,
    metrics: ClientMetrics,
) -> Result<kube::Client, ClientError> {
    let layer = NetcmLayer::new(opts.qps, opts.burst, Some(guard), metrics);
    stack(config, &opts.user_agent, layer)
}

/// Builds a client with a token bucket of its own and no leader fence, for what must not wait behind the
/// controllers' requests nor be refused by the fence — leader election above all (KCM gives it a client
/// of its own too). Same config, user agent and `rest_client_*` metrics as the shared client. Call it
/// inside the tokio runtime.
pub fn build_unfenced_client(
    config: kube::Config,
    user_agent: &str,
    qps: f32,
    burst: u32,
    metrics: ClientMetrics,
) -> Result<kube::Client, ClientError> {
    stack(
        config,
        user_agent,
        NetcmLayer::new(qps, burst, None, metrics),
    )
}

/// kube's default stack, then a buffer, our layer, and kube's retry policy on top. kube would retry
/// 429/503/504 *below* any layer added to its stack, so a retried write would skip the bucket, the
/// fence and its deadline; with the retry moved above our layer, every attempt passes all three.
fn stack(
    mut config: kube::Config,
    user_agent: &str,
    layer: NetcmLayer,
) -> Result<kube::Client, ClientError> {
    let ua = http::HeaderValue::from_str(user_agent)
        .map_err(|_| ClientError::BadUserAgent(user_agent.to_string()))?;
    config.headers.push((http::header::USER_AGENT, ua));
    config.default_retry = false;
    let client = ClientBuilder::try_from(config)?
        .with_layer(&BufferLayer::new(BUFFER))
        .with_layer(&layer)
        .with_layer(&RetryLayer::new(RetryPolicy::server_retry()))
        .build();
    Ok(client)
}

#[cfg(test)]
mod tests;
