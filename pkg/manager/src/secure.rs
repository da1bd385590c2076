//! The secure listener (`--secure-port`), as kube-controller-manager serves its metrics: TLS (the given
//! certificate, else a self-signed one made in memory), bearer tokens authenticated with a TokenReview and
//! requests authorized with a SubjectAccessReview for the non-resource path, both answered by the API
//! server and cached briefly. `/healthz`, `/livez` and `/readyz` are always allowed (KCM's
//! `AlwaysAllowPaths`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::http::{accept_loop, route, serve_connection, Endpoints, Limits};

/// How long an authentication or authorization answer is reused.
const CACHE_TTL: Duration = Duration::from_secs(10);

/// Paths anyone may read, as KCM's delegated authorization allows.
fn always_allowed(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

/// The secure listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SecureError {
    /// Reading the certificate or key failed.
    #[error("--tls-cert-file/--tls-private-key-file: {0}")]
    Pem(String),
    /// Making the self-signed certificate failed.
    #[error("generating a self-signed serving certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    /// The TLS configuration was rejected.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// Builds the TLS acceptor from files, or from a self-signed certificate for localhost and the host name.
pub fn tls_acceptor(cert: Option<&Path>, key: Option<&Path>) -> Result<TlsAcceptor, SecureError> {
    let (chain, key) = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| SecureError::Pem(format!("{}: {e}", cert.display())))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| SecureError::Pem(format!("{}: {e}", key.display())))?;
            (chain, key)
        }
        _ => {
            let host = hostname::get()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "netcm".into());
            let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), host])?;
            let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())
                .map_err(|e| SecureError::Pem(e.to_string()))?;
            (vec![cert.cert.der().clone()], key)
        }
    };
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Answers kept for [`CACHE_TTL`], bounded: expired entries are dropped when it grows large.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: std::hash::Hash + Eq, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(v, _)| v.clone())
    }

    fn insert(&self, key: K, value: V) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() > 1000 {
            entries.retain(|_, (_, at)| at.elapsed() < CACHE_TTL);
        }
        entries.insert(key, (value, Instant::now()));
    }
}

/// Delegated authentication and authorization against the API server, with a short cache.
#[derive(Clone)]
pub struct Delegation {
    client: kube::Client,
    users: Arc<TtlCache<String, Option<UserInfo>>>,
    decisions: Arc<TtlCache<(String, String), bool>>,
}

/// Why a request was refused.
enum Refusal {
    Unauthorized(String),
    Forbidden(String),
}

impl Delegation {
    /// Uses `client` for TokenReviews and SubjectAccessReviews.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            users: Arc::new(TtlCache::new()),
            decisions: Arc::new(TtlCache::new()),
        }
    }

    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, kube::Error> {
        if let Some(user) = self.users.get(&token.to_string()) {
            return Ok(user);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user);
        self.users.insert(token.to_string(), user.clone());
        Ok(user)
    }

    async fn authorize(&self, user: &UserInfo, path: &str) -> Result<bool, kube::Error> {
        let name = user.username.clone().unwrap_or_default();
        let key = (name.clone(), path.to_string());
        if let Some(allowed) = self.decisions.get(&key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(name),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        self.decisions.insert(key, allowed);
        Ok(allowed)
    }

    async fn check(&self, req: &Request<Incoming>) -> Result<(), Refusal> {
        let path = req.uri().path();
        if always_allowed(path) {
            return Ok(());
        }
        let token = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Refusal::Unauthorized("a bearer token is required".into()))?;
        let user = self
            .authenticate(token)
            .await
            .map_err(|e| {
                tracing::warn!(path, error = %e, "secure metrics: token review failed");
                Refusal::Unauthorized(format!("token review failed: {e}"))
            })?
            .ok_or_else(|| Refusal::Unauthorized("the token is not valid".into()))?;
        let name = user.username.clone().unwrap_or_default();
        match self.authorize(&user, path).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Refusal::Forbidden(format!(
                "user {name:?} cannot get path {path:?}"
            ))),
            Err(e) => {
                tracing::warn!(path, user = %name, error = %e, "secure metrics: subject access review failed");
                Err(Refusal::Forbidden(format!(
                    "subject access review failed: {e}"
                )))
            }
        }
    }
}

fn refusal(status: StatusCode, why: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{why}\n"))));
    *resp.status_mut() = status;
    resp
}

/// Binds the secure listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves TLS with delegated auth until `cancel` fires.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    delegation: Delegation,
    endpoints: Endpoints,
    cancel: CancellationToken,
) {
    let limits = Limits::default();
    accept_loop(listener, limits, cancel, move |stream| {
        let (acceptor, delegation, endpoints) =
            (acceptor.clone(), delegation.clone(), endpoints.clone());
        async move {
            // Bounded like the headers that follow it (Go's net/http does the same with its
            // ReadHeaderTimeout): a client that never finishes the handshake must not keep its slot.
            let handshake =
                tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await;
            let tls = match handshake {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake timed out");
                    return;
                }
            };
            serve_connection(tls, limits.header_read_timeout, move |req| {
                let (delegation, endpoints) = (delegation.clone(), endpoints.clone());
                async move {
                    match delegation.check(&req).await {
                        Ok(()) => route(&endpoints, &req),
                        Err(Refusal::Unauthorized(why)) => refusal(StatusCode::UNAUTHORIZED, why),
                        Err(Refusal::Forbidden(why)) => refusal(StatusCode::FORBIDDEN, why),
                    }
                }
            })
            .await;
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_paths_are_always_allowed_and_metrics_is_not() {
        assert!(always_allowed("/healthz"));
        assert!(always_allowed("/healthz/leaderElection"));
        assert!(always_allowed("/readyz"));
        assert!(always_allowed("/livez"));
        assert!(!always_allowed("/metrics"));
        assert!(!always_allowed("/healthzzz"));
    }

    #[test]
    fn a_self_signed_certificate_is_made_when_no_files_are_given() {
        assert!(tls_acceptor(None, None).is_ok());
    }

    #[test]
    fn a_missing_certificate_file_is_an_error_naming_the_flag() {
        let err = tls_acceptor(
            Some(Path::new("/nonexistent.crt")),
            Some(Path::new("/nonexistent.key")),
        )
        .err()
        .expect("missing files");
        assert!(err.to_string().contains("--tls-cert-file"), "{err}");
    }
}
