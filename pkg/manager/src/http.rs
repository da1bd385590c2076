//! The plain-HTTP listener: `/metrics` (Prometheus text format), `/healthz` (+ `/healthz/<check>`),
//! `/livez` and `/readyz`; and the accept loop both listeners share, with its [`Limits`] (header-read
//! timeout, connection cap) and its backoff on accept errors.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::health::HealthChecks;

/// What the server serves.
#[derive(Clone)]
pub struct Endpoints {
    /// Served on /metrics.
    pub registry: Registry,
    /// /healthz and /healthz/<check>.
    pub healthz: HealthChecks,
    /// /livez.
    pub livez: HealthChecks,
    /// /readyz.
    pub readyz: HealthChecks,
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn health(checks: &HealthChecks, only: Option<&str>, verbose: bool) -> Response<Full<Bytes>> {
    match checks.run(only) {
        None => text(StatusCode::NOT_FOUND, "no such health check\n".into()),
        Some((true, report)) if verbose => {
            text(StatusCode::OK, format!("{report}healthz check passed\n"))
        }
        Some((true, _)) => text(StatusCode::OK, "ok".into()),
        Some((false, report)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{report}healthz check failed\n"),
        ),
    }
}

/// Routes one request.
pub fn route(endpoints: &Endpoints, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/');
    let verbose = req.uri().query().is_some_and(|q| q.contains("verbose"));
    match path {
        "/metrics" => {
            let mut buf = Vec::new();
            match TextEncoder::new().encode(&endpoints.registry.gather(), &mut buf) {
                Ok(()) => {
                    let mut resp = text(StatusCode::OK, String::from_utf8_lossy(&buf).into_owned());
                    resp.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    resp
                }
                Err(e) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("encoding metrics: {e}\n"),
                ),
            }
        }
        "/healthz" => health(&endpoints.healthz, None, verbose),
        "/livez" => health(&endpoints.livez, None, verbose),
        "/readyz" => health(&endpoints.readyz, None, verbose),
        p => match p.strip_prefix("/healthz/") {
            Some(check) => health(&endpoints.healthz, Some(check), verbose),
            None => text(StatusCode::NOT_FOUND, "not found\n".into()),
        },
    }
}

/// Binds the listener (so a taken port fails at startup) and returns the address it got.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// What keeps a slow, idle or hostile client from exhausting a listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a client may take to send a request's headers, counted from when the connection is
    /// ready for a request (so it also closes idle keep-alive connections); on the secure port, also the
    /// bound on the TLS handshake. Probes and scrapes send their request at once.
    pub header_read_timeout: Duration,
    /// Connections served at once. Beyond it the listener stops accepting, and new connections wait in
    /// the kernel's accept queue until a slot frees (at the latest after `header_read_timeout`).
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            // Far more than the few scrapers and probes that use the port, and far below the usual
            // descriptor limit (1024), which the API client needs too.
            max_connections: 128,
        }
    }
}

/// The delay before retrying a failed accept, as Go's net/http: 5 ms, doubling to 1 s, reset by a
/// successful accept. Accept fails persistently when the process is out of descriptors (EMFILE): the
/// pending connection stays queued, so retrying at once would spin.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    delay: Option<Duration>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);

    /// An accept failed: how long to wait before the next.
    pub(crate) fn failed(&mut self) -> Duration {
        let next = self.delay.map_or(Self::FIRST, |d| (d * 2).min(Self::MAX));
        self.delay = Some(next);
        next
    }

    /// An accept succeeded: the next failure starts over at the first step.
    pub(crate) fn succeeded(&mut self) {
        self.delay = None;
    }
}

/// Accepts connections until `cancel` fires, handing each to `handle` on its own task, at most
/// `max_connections` at a time.
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    limits: Limits,
    cancel: CancellationToken,
    handle: F,
) where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    // Waiting for a slot rather than accepting and closing: a probe over the cap is then served as soon
    // as a slot frees (slow clients free theirs within the header timeout) instead of failing at once,
    // and an over-cap connection costs no descriptor and no syscalls.
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut backoff = AcceptBackoff::default();
    loop {
        let slot = tokio::select! {
            _ = cancel.cancelled() => return,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => return, // never closed
            },
        };
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    stream
                }
                Err(e) => {
                    // One line per wait: at most one a second once the delay is at its maximum.
                    let delay = backoff.failed();
                    tracing::warn!(error = %e, retry_in = ?delay, "accepting a metrics/health connection failed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
            },
        };
        let served = handle(stream);
        tokio::spawn(async move {
            served.await;
            drop(slot);
        });
    }
}

/// Serves HTTP/1 on one connection with `route`-style responses, closing it when a request's headers
/// take longer than `header_read_timeout`.
pub(crate) async fn serve_connection<I, S, Fut>(io: I, header_read_timeout: Duration, svc: S)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let svc = Arc::new(svc);
    let service = service_fn(move |req: Request<Incoming>| {
        let svc = svc.clone();
        async move { Ok::<_, Infallible>(svc(req).await) }
    });
    // HTTP/1 only (HTTP/2 is not built in): hyper_util's auto builder would first wait for the HTTP/2
    // preface with no timeout at all, so a client that sends nothing would hold its slot forever.
    let mut conn = http1::Builder::new();
    conn.timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    if let Err(e) = conn.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "metrics/health connection ended with an error");
    }
}

/// Serves until `cancel` fires.
pub async fn serve(listener: TcpListener, endpoints: Endpoints, cancel: CancellationToken) {
    let limits = Limits::default();
    accept_loop(listener, limits, cancel, move |stream| {
        let endpoints = endpoints.clone();
        serve_connection(stream, limits.header_read_timeout, move |req| {
            let resp = route(&endpoints, &req);
            async move { resp }
        })
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_from_5ms_doubling_to_1s_and_a_success_starts_over() {
        let mut b = AcceptBackoff::default();
        let steps: Vec<u64> = (0..10).map(|_| b.failed().as_millis() as u64).collect();
        assert_eq!(steps, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(), Duration::from_millis(5));
    }
}
