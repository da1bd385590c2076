//! The API client: config precedence as KCM's (`--kubeconfig`/`--master`, then `KUBECONFIG`, then
//! in-cluster, then `~/.kube/config`), a user agent naming netcm and its leader identity, and one tower
//! layer that every request passes: the client-side token bucket (`--kube-api-qps`/`--kube-api-burst`),
//! the leader fence for writes, and the `rest_client_*` metrics.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use tower::{Layer, Service};

use crate::leader::LeaderGuard;

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

/// The `rest_client_*` metric families (client-go's names).
#[derive(Clone)]
pub struct ClientMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
}

impl ClientMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new(
                "rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code, method, and host.",
            ),
            &["code", "method"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "rest_client_request_duration_seconds",
                "Request latency in seconds. Broken down by verb.",
            )
            .buckets(vec![
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ]),
            &["verb"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(Self { requests, duration })
    }
}

/// A token bucket shared by every request of the process (client-go's `flowcontrol` QPS/burst limiter).
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `qps` per second.
    pub fn new(qps: f32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: f64::from(qps).max(0.001),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Reserves one token and returns how long to wait before using it.
    pub fn reserve(&self) -> Duration {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(st.1).as_secs_f64();
        st.0 = (st.0 + elapsed * self.qps).min(self.burst) - 1.0;
        st.1 = now;
        if st.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-st.0 / self.qps)
        }
    }
}

/// The tower layer that rate-limits, fences and meters every request.
#[derive(Clone)]
pub struct NetcmLayer {
    bucket: Arc<TokenBucket>,
    guard: LeaderGuard,
    metrics: ClientMetrics,
}

/// The service [`NetcmLayer`] produces.
#[derive(Clone)]
pub struct NetcmService<S> {
    inner: S,
    layer: NetcmLayer,
}

impl<S> Layer<S> for NetcmLayer {
    type Service = NetcmService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        NetcmService {
            inner,
            layer: self.clone(),
        }
    }
}

/// API groups whose "writes" the leader fence does not cover: the Lease itself (renewal is how the fence
/// is kept), and TokenReviews / SubjectAccessReviews, which change nothing and which a standby needs to
/// serve its secure metrics.
const UNFENCED_GROUPS: [&str; 3] = [
    "/apis/coordination.k8s.io/",
    "/apis/authentication.k8s.io/",
    "/apis/authorization.k8s.io/",
];

fn is_fenced_write(req: &Request<Body>) -> bool {
    let mutating = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    mutating
        && !UNFENCED_GROUPS
            .iter()
            .any(|g| req.uri().path().starts_with(g))
}

fn verb(req: &Request<Body>) -> &'static str {
    let watch = req
        .uri()
        .query()
        .map(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
        .unwrap_or(false);
    match *req.method() {
        Method::GET if watch => "WATCH",
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> Service<Request<Body>> for NetcmService<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let layer = self.layer.clone();
        let fenced = is_fenced_write(&req);
        let verb = verb(&req);
        let method = req.method().to_string();
        let wait = layer.bucket.reserve();
        // The inner future is lazy (hyper sends nothing until polled), so the wait and the fence below
        // happen before any byte leaves the process.
        let fut = self.inner.call(req);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if fenced {
                layer
                    .guard
                    .ensure_leader()
                    .map_err(|e| Box::new(e) as BoxError)?;
            }
            let started = Instant::now();
            let result = fut.await.map_err(Into::into);
            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            layer
                .metrics
                .requests
                .with_label_values(&[code.as_str(), method.as_str()])
                .inc();
            layer
                .metrics
                .duration
                .with_label_values(&[verb])
                .observe(started.elapsed().as_secs_f64());
            result
        })
    }
}

/// Builds the process's client from a loaded config.
pub fn build_client(
    mut config: kube::Config,
    opts: &ClientOptions,
    guard: LeaderGuard,
    metrics: ClientMetrics,
) -> Result<kube::Client, ClientError> {
    let ua = http::HeaderValue::from_str(&opts.user_agent)
        .map_err(|_| ClientError::BadUserAgent(opts.user_agent.clone()))?;
    config.headers.push((http::header::USER_AGENT, ua));
    let layer = NetcmLayer {
        bucket: Arc::new(TokenBucket::new(opts.qps, opts.burst)),
        guard,
        metrics,
    };
    let client = ClientBuilder::try_from(config)?.with_layer(&layer).build();
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_bucket_allows_a_burst_then_spaces_requests_at_the_qps() {
        let b = TokenBucket::new(10.0, 3);
        assert!(b.reserve().is_zero());
        assert!(b.reserve().is_zero());
        assert!(b.reserve().is_zero());
        let wait = b.reserve();
        assert!(
            wait > Duration::from_millis(80) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        let wait2 = b.reserve();
        assert!(
            wait2 > Duration::from_millis(180) && wait2 <= Duration::from_millis(200),
            "{wait2:?}"
        );
    }

    #[test]
    fn lease_writes_bypass_the_fence_and_node_writes_do_not() {
        let req = |m: Method, p: &str| {
            Request::builder()
                .method(m)
                .uri(p)
                .body(Body::empty())
                .expect("request")
        };
        assert!(is_fenced_write(&req(Method::PATCH, "/api/v1/nodes/n1")));
        assert!(is_fenced_write(&req(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events"
        )));
        assert!(!is_fenced_write(&req(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/netcm"
        )));
        assert!(!is_fenced_write(&req(Method::GET, "/api/v1/nodes")));
        assert!(!is_fenced_write(&req(
            Method::POST,
            "/apis/authentication.k8s.io/v1/tokenreviews"
        )));
    }

    #[test]
    fn watches_are_metered_as_watch_not_get() {
        let r = Request::builder()
            .uri("/api/v1/nodes?watch=true&resourceVersion=1")
            .body(Body::empty())
            .expect("request");
        assert_eq!(verb(&r), "WATCH");
    }
}
