//! The plain-HTTP listener: `/metrics` (Prometheus text format), `/healthz` (+ `/healthz/<check>`),
//! `/livez` and `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
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

/// Accepts connections until `cancel` fires, handing each to `handle` on its own task.
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, cancel: CancellationToken, handle: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a metrics/health connection failed");
                    continue;
                }
            },
        };
        tokio::spawn(handle(stream));
    }
}

/// Serves HTTP/1 or HTTP/2 on one connection with `route`-style responses.
pub(crate) async fn serve_connection<I, S, Fut>(io: I, svc: S)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let svc = std::sync::Arc::new(svc);
    let service = service_fn(move |req: Request<Incoming>| {
        let svc = svc.clone();
        async move { Ok::<_, Infallible>(svc(req).await) }
    });
    let conn = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = conn.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "metrics/health connection ended with an error");
    }
}

/// Serves until `cancel` fires.
pub async fn serve(listener: TcpListener, endpoints: Endpoints, cancel: CancellationToken) {
    accept_loop(listener, cancel, move |stream| {
        let endpoints = endpoints.clone();
        serve_connection(stream, move |req| {
            let resp = route(&endpoints, &req);
            async move { resp }
        })
    })
    .await;
}
