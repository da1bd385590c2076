//! The secure listener (`--secure-port`), as kube-controller-manager serves its metrics: TLS (the given
//! certificate, else a self-signed one made in memory), bearer tokens authenticated with a TokenReview and
//! requests authorized with a SubjectAccessReview for the non-resource path, both answered by the API
//! server and cached briefly. `/healthz`, `/livez` and `/readyz` are always allowed (KCM's
//! `AlwaysAllowPaths`). The reviews go through their own client and limits ([`review`]), never the
//! shared one; the caches are keyed by SHA-256 digests, so no token is kept.

mod review;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use prometheus::Registry;
use ring::digest::{Context, SHA256};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::http::{accept_loop, route, serve_connection, Endpoints, Limits};
use crate::ttl_cache::TtlCache;
use review::{ReviewSlot, Reviewer};

/// How long an authentication or authorization answer is reused, a refusal as much as an approval
/// (KCM's delegated authentication and authorization cache both for 10 s). Failed reviews are not cached.
const CACHE_TTL: Duration = Duration::from_secs(10);
/// Answers kept per cache at most; a flood of distinct tokens must not grow memory without bound.
const CACHE_CAPACITY: usize = 4096;

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
    #[error("--tls-cert-file/--tls-private-key-file: {path}: {source}")]
    Pem {
        /// The file.
        path: String,
        /// Why.
        source: rustls::pki_types::pem::Error,
    },
    /// The self-signed certificate's key could not be used.
    #[error("generating a self-signed serving certificate: {0}")]
    SelfSignedKey(&'static str),
    /// Making the self-signed certificate failed.
    #[error("generating a self-signed serving certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    /// The TLS configuration was rejected.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The client for TokenReviews and SubjectAccessReviews could not be built.
    #[error("building the client for token and access reviews: {0}")]
    Client(#[source] kube::Error),
    /// The user agent has characters a header cannot carry.
    #[error("user agent {0:?} is not a valid header value")]
    UserAgent(String),
    /// A metric could not be registered (a programming error).
    #[error("registering secure-port metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Builds the TLS acceptor from files, or from a self-signed certificate for localhost and the host name.
pub fn tls_acceptor(cert: Option<&Path>, key: Option<&Path>) -> Result<TlsAcceptor, SecureError> {
    let (chain, key) = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|source| SecureError::Pem {
                    path: cert.display().to_string(),
                    source,
                })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|source| SecureError::Pem {
                path: key.display().to_string(),
                source,
            })?;
            (chain, key)
        }
        _ => {
            let host = hostname::get()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "netcm".into());
            let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), host])?;
            let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())
                .map_err(SecureError::SelfSignedKey)?;
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

/// A SHA-256 digest: what the caches are keyed by.
type Digest = [u8; 32];

/// The digest of length-prefixed `fields` (so no two different lists share an encoding).
fn digest(fields: &[&[u8]]) -> Digest {
    let mut ctx = Context::new(&SHA256);
    for f in fields {
        ctx.update(&(f.len() as u64).to_be_bytes());
        ctx.update(f);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The cache key of a bearer token: its digest, so a cached token cannot be read back from memory.
fn token_key(token: &str) -> Digest {
    digest(&[token.as_bytes()])
}

/// The cache key of an authorization decision: the user as the review names it, and the path.
fn decision_key(user: &UserInfo, path: &str) -> Digest {
    let mut fields: Vec<&[u8]> = vec![
        user.username.as_deref().unwrap_or_default().as_bytes(),
        user.uid.as_deref().unwrap_or_default().as_bytes(),
        path.as_bytes(),
    ];
    fields.extend(user.groups.iter().flatten().map(|g| g.as_bytes()));
    digest(&fields)
}

/// Delegated authentication and authorization against the API server, with a short cache.
#[derive(Clone)]
pub struct Delegation {
    reviewer: Reviewer,
    users: Arc<TtlCache<Digest, Option<UserInfo>>>,
    decisions: Arc<TtlCache<Digest, bool>>,
}

/// Why a request was refused.
enum Refusal {
    Unauthorized(String),
    Forbidden(String),
    /// Too many requests already wait for reviews.
    TooManyRequests,
}

const TOKEN_REVIEW: &str = "TokenReview";
const ACCESS_REVIEW: &str = "SubjectAccessReview";

/// A slot for this request's reviews: the one already held, else a new one, else a 429.
fn slot<'a>(
    held: &'a mut Option<ReviewSlot>,
    reviewer: &Reviewer,
    review: &str,
) -> Result<&'a ReviewSlot, Refusal> {
    if held.is_none() {
        *held = Some(reviewer.try_slot(review).ok_or(Refusal::TooManyRequests)?);
    }
    held.as_ref().ok_or(Refusal::TooManyRequests)
}

impl Delegation {
    /// Sends TokenReviews and SubjectAccessReviews with a client of its own built from `config` (the
    /// process's shared client and its token bucket are never used), and registers its metric.
    pub fn new(
        config: kube::Config,
        user_agent: &str,
        registry: &Registry,
    ) -> Result<Self, SecureError> {
        Ok(Self {
            reviewer: Reviewer::new(config, user_agent, registry)?,
            users: Arc::new(TtlCache::new(CACHE_TTL).bounded(CACHE_CAPACITY)),
            decisions: Arc::new(TtlCache::new(CACHE_TTL).bounded(CACHE_CAPACITY)),
        })
    }

    /// The user a token belongs to (`None`: not authenticated), from the cache or a TokenReview.
    async fn authenticate(
        &self,
        token: &str,
        held: &mut Option<ReviewSlot>,
    ) -> Result<Option<UserInfo>, Refusal> {
        let key = token_key(token);
        if let Some(user) = self.users.get(&key) {
            return Ok(user);
        }
        let slot = slot(held, &self.reviewer, TOKEN_REVIEW)?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = self.reviewer.create(slot, &review).await.map_err(|e| {
            tracing::warn!(error = %e, "secure metrics: token review failed");
            Refusal::Unauthorized(format!("token review failed: {e}"))
        })?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user);
        let result = if user.is_some() { "allowed" } else { "denied" };
        self.reviewer.count(TOKEN_REVIEW, result);
        self.users.insert(key, user.clone());
        Ok(user)
    }

    /// Whether `user` may get `path`, from the cache or a SubjectAccessReview.
    async fn authorize(
        &self,
        user: &UserInfo,
        path: &str,
        held: &mut Option<ReviewSlot>,
    ) -> Result<bool, Refusal> {
        let name = user.username.clone().unwrap_or_default();
        let key = decision_key(user, path);
        if let Some(allowed) = self.decisions.get(&key) {
            return Ok(allowed);
        }
        let slot = slot(held, &self.reviewer, ACCESS_REVIEW)?;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(name.clone()),
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
        let answer = self
            .reviewer
            .create(slot, &review)
            .await
            .map_err(|e| {
                tracing::warn!(path, user = %name, error = %e, "secure metrics: subject access review failed");
                Refusal::Forbidden(format!("subject access review failed: {e}"))
            })?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let result = if allowed { "allowed" } else { "denied" };
        self.reviewer.count(ACCESS_REVIEW, result);
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
        // Taken at the first review this request needs, held until it is decided.
        let mut held = None;
        let user = self
            .authenticate(token, &mut held)
            .await?
            .ok_or_else(|| Refusal::Unauthorized("the token is not valid".into()))?;
        if self.authorize(&user, path, &mut held).await? {
            Ok(())
        } else {
            let name = user.username.clone().unwrap_or_default();
            Err(Refusal::Forbidden(format!(
                "user {name:?} cannot get path {path:?}"
            )))
        }
    }
}

fn refusal(status: StatusCode, why: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{why}\n"))));
    *resp.status_mut() = status;
    resp
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
                        Err(Refusal::TooManyRequests) => {
                            let mut resp = refusal(
                                StatusCode::TOO_MANY_REQUESTS,
                                "too many requests are waiting for authentication; retry".into(),
                            );
                            resp.headers_mut().insert(
                                http::header::RETRY_AFTER,
                                http::HeaderValue::from_static("1"),
                            );
                            resp
                        }
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
    fn a_flood_of_distinct_fresh_answers_keeps_the_cache_at_its_capacity_and_keeps_the_newest() {
        let cache = TtlCache::new(CACHE_TTL).bounded(8);
        for i in 0..1000u32 {
            cache.insert(token_key(&format!("bogus-{i}")), None::<UserInfo>);
        }
        assert_eq!(cache.len(), 8);
        assert_eq!(cache.get(&token_key("bogus-999")), Some(None));
    }

    #[test]
    fn a_refused_token_is_remembered_like_an_accepted_one() {
        let cache = TtlCache::new(CACHE_TTL).bounded(8);
        cache.insert(token_key("bogus"), None::<UserInfo>);
        assert_eq!(cache.get(&token_key("bogus")), Some(None));
        assert_eq!(cache.get(&token_key("other")), None);
    }

    #[test]
    fn tokens_are_keyed_by_their_sha256_digest() {
        // SHA-256 of the 8-byte big-endian length 3 followed by "abc".
        let mut expected = Context::new(&SHA256);
        expected.update(&3u64.to_be_bytes());
        expected.update(b"abc");
        assert_eq!(token_key("abc").as_slice(), expected.finish().as_ref());
        assert_ne!(token_key("abc"), token_key("abd"));
    }

    #[test]
    fn decisions_for_the_same_name_in_other_groups_are_not_shared() {
        let user = |groups: &[&str]| UserInfo {
            username: Some("system:serviceaccount:monitoring:prometheus".into()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            ..Default::default()
        };
        let a = decision_key(&user(&["system:authenticated"]), "/metrics");
        let b = decision_key(&user(&["system:authenticated", "admins"]), "/metrics");
        assert_ne!(a, b);
        assert_ne!(a, decision_key(&user(&["system:authenticated"]), "/other"));
        // Length prefixes: moving a byte between fields changes the key.
        assert_ne!(digest(&[b"ab", b"c"]), digest(&[b"a", b"bc"]));
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
