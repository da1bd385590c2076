//! The main sequence's dealings with its process and surroundings: the termination signal, this
//! process's own Node, binding the HTTP listeners and waiting for the API server.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::http;

/// A future that resolves on SIGTERM or SIGINT.
pub(super) async fn termination_signal() {
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
pub(super) async fn own_node_name(client: &kube::Client) -> Option<String> {
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

/// Binds a listener (so a taken port fails at startup) and returns the address it got.
pub(super) async fn bind(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), RunError> {
    http::bind(addr)
        .await
        .map_err(|source| RunError::Bind { addr, source })
}

/// Asks the API server for its version, backing off from 200 ms to 10 s, until it answers (true) or
/// shutdown is requested (false).
pub(super) async fn wait_for_apiserver(
    client: &kube::Client,
    shutdown: &CancellationToken,
) -> bool {
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
