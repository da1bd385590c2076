//! The tower layer every request of a netcm client passes, in this order: the client-side token bucket
//! (client-go's `flowcontrol` QPS/burst limiter, the workqueue's [`TokenBucket`]),
//! then — for a fenced client's writes — a fresh answer from the API server (a probe when none came
//! within [`FRESH_ANSWER`]), the leader fence and the write's deadline (sent to the API server as
//! `timeout=` and enforced here with a timer), then the `rest_client_*` metrics.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request, Response, Uri};
use kube::client::Body;
use netcm_workqueue::TokenBucket;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use tower::{Layer, Service, ServiceExt};

use crate::duration::parse_duration;
use crate::leader::{Fenced, LeaderGuard};

/// The `rest_client_*` metric families (client-go's names).
#[derive(Clone)]
pub struct ClientMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    /// `netcm_api_server_probes_total`: probes for a fresh answer before a write ([`FRESH_ANSWER`]).
    probes: IntCounterVec,
}

impl ClientMetrics {
    /// Registers the families in `registry`; clone the result for every client of the process.
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
        let probes = IntCounterVec::new(
            Opts::new(
                "netcm_api_server_probes_total",
                "Probes of the API server sent because a write found no answer of it in the last 20 ms, by result (answered, failed).",
            ),
            &["result"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(probes.clone()))?;
        Ok(Self {
            requests,
            duration,
            probes,
        })
    }
}

/// A fenced write the API server did not answer by its deadline; abandoned before the lease could pass.
#[derive(Debug, Clone, thiserror::Error)]
#[error("write abandoned at its leader-fence deadline, {budget:?} after it was sent, before the lease could pass to another replica")]
pub struct WriteDeadlineExceeded {
    /// The time the write was given.
    pub budget: Duration,
}

/// How old the API server's last answer may be when a fenced write is sent; older, the layer first
/// probes it (`GET /version`). Why: an API server frozen (a stopped process, a stalled VM) keeps the
/// requests sent to it in its socket and applies them when it thaws, whatever their `timeout=`, which
/// counts from arrival; the fence sees that only once a request has waited its stall time
/// ([`crate::leader`]'s path rule, ≥ 250 ms). Writes sent blind in that window land late, after another
/// replica may lead (`hack/chaos.sh`: a PATCH of a PodCIDRClaim, 1.9 s after its writer's term).
/// With a fresh answer, a freeze can catch a write only if it began in the last `FRESH_ANSWER`. A busy
/// leader's answers are always this fresh, so only a write after a quiet spell pays the probe's round
/// trip.
pub const FRESH_ANSWER: Duration = Duration::from_millis(20);

/// The tower layer that rate-limits, fences and meters every request.
#[derive(Clone)]
pub struct NetcmLayer {
    bucket: Arc<TokenBucket>,
    /// `None` for a client that writes nothing the fence protects (leader election's own client).
    guard: Option<LeaderGuard>,
    metrics: ClientMetrics,
    /// Held while a probe is on its way, so writes that find the last answer stale at once share one.
    probing: Arc<tokio::sync::Mutex<()>>,
}

impl NetcmLayer {
    /// A layer with its own token bucket; writes are fenced when a guard is given.
    pub fn new(qps: f32, burst: u32, guard: Option<LeaderGuard>, metrics: ClientMetrics) -> Self {
        Self {
            bucket: Arc::new(TokenBucket::new(f64::from(qps), burst)),
            guard,
            metrics,
            probing: Arc::default(),
        }
    }
}

/// A fenced write that found no fresh answer from the API server and could not get one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("write not sent: the API server answered nothing in the last {FRESH_ANSWER:?} and its probe failed ({0}); a frozen server could apply the write after another replica may lead")]
pub struct NoFreshAnswer(pub String);

/// For a write that found no answer of the API server within [`FRESH_ANSWER`]: probes it (`GET
/// /version`, bounded by the time a write starting now would have). One probe at a time: writes that
/// waited for another's find the answer fresh and send none.
async fn fresh_answer<S, B>(
    inner: S,
    guard: &LeaderGuard,
    probing: &tokio::sync::Mutex<()>,
    probes: &IntCounterVec,
) -> Result<(), BoxError>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    let _one = probing.lock().await;
    if guard.answered_within(FRESH_ANSWER) {
        return Ok(());
    }
    let budget = guard.write_budget()?;
    let probe = Request::get("/version").body(Body::empty())?;
    let svc = inner
        .ready_oneshot()
        .await
        .map_err(Into::<BoxError>::into)?;
    let in_flight = guard.probe_sent();
    let failed = match tokio::time::timeout(budget, svc.oneshot(probe)).await {
        Ok(Ok(_)) => {
            in_flight.answered();
            probes.with_label_values(&["answered"]).inc();
            return Ok(());
        }
        Ok(Err(e)) => NoFreshAnswer(e.into().to_string()),
        Err(_) => NoFreshAnswer(format!("no answer within {budget:?}")),
    };
    probes.with_label_values(&["failed"]).inc();
    Err(Box::new(failed))
}

/// The service [`NetcmLayer`] produces. The inner service must be cheap to clone (a buffer): the request
/// is handed to it only after the bucket's wait and the fence, because the deadline is known only then.
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

/// API groups whose writes the leader fence does not cover: TokenReviews and SubjectAccessReviews change
/// nothing, and a standby needs them to serve its secure metrics. Everything else a fenced client
/// changes — Lease objects included — passes the fence; leader election has a client of its own.
const UNFENCED_GROUPS: [&str; 2] = [
    "/apis/authentication.k8s.io/",
    "/apis/authorization.k8s.io/",
];

pub(super) fn is_fenced_write(req: &Request<Body>) -> bool {
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

/// `uri` with the API server's `timeout` query parameter set to `budget` in whole milliseconds, rounded
/// down (a Go duration, which is what the server parses). A shorter timeout already present is kept.
fn with_timeout(uri: &Uri, budget: Duration) -> Result<Uri, http::Error> {
    let mut ms = budget.as_millis();
    let mut params: Vec<String> = Vec::new();
    for p in uri.query().unwrap_or_default().split('&') {
        match p.strip_prefix("timeout=") {
            Some(v) => {
                if let Ok(d) = parse_duration(v) {
                    if !d.is_zero() {
                        ms = ms.min(d.as_millis());
                    }
                }
            }
            None if !p.is_empty() => params.push(p.to_string()),
            None => {}
        }
    }
    params.push(format!("timeout={ms}ms"));
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(format!("{}?{}", uri.path(), params.join("&")).parse()?);
    Ok(Uri::from_parts(parts)?)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> Service<Request<Body>> for NetcmService<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness of the inner buffer is awaited per request, after the bucket's wait.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let layer = self.layer.clone();
        let inner = self.inner.clone();
        let fenced = layer.guard.is_some() && is_fenced_write(&req);
        let verb = verb(&req);
        let method = req.method().to_string();
        let wait = layer.bucket.reserve();
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if let (Some(guard), true) = (&layer.guard, fenced) {
                if !guard.answered_within(FRESH_ANSWER) {
                    fresh_answer(inner.clone(), guard, &layer.probing, &layer.metrics.probes)
                        .await?;
                }
            }
            let svc = inner
                .ready_oneshot()
                .await
                .map_err(Into::<BoxError>::into)?;
            // The fence is passed after every wait and immediately before the request is handed on (the
            // inner future is lazy: nothing is sent until it is polled below, within the deadline).
            let ticket = match (&layer.guard, fenced) {
                (Some(guard), true) => Some(guard.begin_write()?),
                _ => None,
            };
            let deadline = ticket.as_ref().and_then(|t| t.deadline());
            let budget = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if let Some(server_timeout) = ticket.as_ref().and_then(|t| t.server_timeout()) {
                if server_timeout.as_millis() == 0 {
                    // `timeout=0ms` would mean "no timeout" to the API server.
                    return Err(Box::new(Fenced(
                        "no time is left before the lease could pass to another replica",
                    )) as BoxError);
                }
                *req.uri_mut() = with_timeout(req.uri(), server_timeout)?;
            }
            let started = Instant::now();
            let mut svc = svc;
            let response = svc.call(req);
            let result = match (deadline, budget) {
                (Some(deadline), Some(budget)) => {
                    match tokio::time::timeout_at(deadline.into(), response).await {
                        Ok(r) => r.map_err(Into::into),
                        Err(_) => Err(Box::new(WriteDeadlineExceeded { budget }) as BoxError),
                    }
                }
                _ => response.await.map_err(Into::into),
            };
            // A definite answer settles the write. No answer, or a server error (an etcd timeout, say,
            // after which the write may still commit), leaves it possibly landing until its deadline.
            if let (Some(ticket), Ok(resp)) = (ticket, &result) {
                if !resp.status().is_server_error() {
                    ticket.answered();
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn req(m: Method, p: &str) -> Request<Body> {
        Request::builder()
            .method(m)
            .uri(p)
            .body(Body::empty())
            .expect("request")
    }

    #[test]
    fn every_write_is_fenced_lease_writes_included_but_reviews_and_reads_are_not() {
        assert!(is_fenced_write(&req(Method::PATCH, "/api/v1/nodes/n1")));
        assert!(is_fenced_write(&req(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events"
        )));
        assert!(is_fenced_write(&req(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/netcm"
        )));
        assert!(is_fenced_write(&req(
            Method::DELETE,
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/claim-10-244-1-0-24"
        )));
        assert!(!is_fenced_write(&req(Method::GET, "/api/v1/nodes")));
        assert!(!is_fenced_write(&req(
            Method::POST,
            "/apis/authentication.k8s.io/v1/tokenreviews"
        )));
        assert!(!is_fenced_write(&req(
            Method::POST,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        )));
    }

    #[test]
    fn watches_are_metered_as_watch_not_get() {
        assert_eq!(
            verb(&req(
                Method::GET,
                "/api/v1/nodes?watch=true&resourceVersion=1"
            )),
            "WATCH"
        );
    }

    #[test]
    fn the_timeout_parameter_is_whole_milliseconds_rounded_down_beside_the_other_parameters() {
        let uri: Uri = "/api/v1/nodes/n1?fieldManager=netcm".parse().expect("uri");
        assert_eq!(
            with_timeout(&uri, Duration::from_micros(9_500_999))
                .expect("uri")
                .to_string(),
            "/api/v1/nodes/n1?fieldManager=netcm&timeout=9500ms"
        );
        let bare: Uri = "/api/v1/nodes/n1".parse().expect("uri");
        assert_eq!(
            with_timeout(&bare, Duration::from_secs(2))
                .expect("uri")
                .to_string(),
            "/api/v1/nodes/n1?timeout=2000ms"
        );
    }

    #[test]
    fn a_shorter_timeout_already_asked_for_is_kept_and_a_longer_one_is_cut() {
        let short: Uri = "/api/v1/nodes/n1?timeout=1s".parse().expect("uri");
        assert_eq!(
            with_timeout(&short, Duration::from_secs(5))
                .expect("uri")
                .to_string(),
            "/api/v1/nodes/n1?timeout=1000ms"
        );
        let long: Uri = "/api/v1/nodes/n1?timeout=1m&dryRun=All"
            .parse()
            .expect("uri");
        assert_eq!(
            with_timeout(&long, Duration::from_secs(5))
                .expect("uri")
                .to_string(),
            "/api/v1/nodes/n1?dryRun=All&timeout=5000ms"
        );
    }
}
