//! A slow validating admission webhook served by the test process: the real kube-apiserver calls it for
//! every UPDATE of a Node labelled [`SLOW_WRITES_LABEL`] and it answers only after holding the request,
//! so a test can keep one of netcm's writes in flight for as long as it needs.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Nodes with this label set to "true" have their UPDATEs (PATCHes) held by the webhook.
pub const SLOW_WRITES_LABEL: &str = "netcm-e2e/slow-writes";
/// Every webhook configuration the harness creates carries this label; [`crate::TestEnv::clean`]
/// deletes them, so a failed test cannot leave Node writes blocked for the next one.
pub const HARNESS_LABEL: &str = "netcm-e2e/harness";

/// One request the webhook saw.
#[derive(Debug, Clone)]
pub struct HeldRequest {
    /// The Node's name.
    pub name: String,
    /// When it arrived (test process clock).
    pub at: Instant,
}

/// The running webhook and its configuration in the cluster. Stops serving on drop.
pub struct SlowWebhook {
    name: String,
    seen: Arc<Mutex<Vec<HeldRequest>>>,
    server: tokio::task::JoinHandle<()>,
}

impl SlowWebhook {
    /// Serves the webhook on a loopback port and registers it: each held UPDATE is answered "allowed"
    /// after `hold` (the API server gives up on it after its 30 s webhook timeout or the request's
    /// own deadline, whichever comes first).
    pub async fn start(client: &kube::Client, name: &str, hold: Duration) -> SlowWebhook {
        Self::start_sparing(client, name, hold, None).await
    }

    /// Like [`SlowWebhook::start`], but a PATCH made as `spared_field_manager` is allowed at once and not
    /// recorded: a test's own write can overtake the held writes of netcm.
    pub async fn start_sparing(
        client: &kube::Client,
        name: &str,
        hold: Duration,
        spared_field_manager: Option<&str>,
    ) -> SlowWebhook {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
            .expect("self-signed webhook certificate");
        let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der()).expect("webhook key");
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![CertificateDer::from(cert.cert.der().to_vec())], key)
        .expect("webhook TLS config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind webhook");
        let port = listener.local_addr().expect("webhook address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let spared = spared_field_manager.map(str::to_string);
        let server = tokio::spawn(serve(listener, acceptor, seen.clone(), hold, spared));

        let config = ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some([(HARNESS_LABEL.to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            webhooks: Some(vec![ValidatingWebhook {
                name: "slow-writes.netcm-e2e.test".into(),
                admission_review_versions: vec!["v1".into()],
                side_effects: "None".into(),
                failure_policy: Some("Fail".into()),
                timeout_seconds: Some(30),
                client_config: WebhookClientConfig {
                    url: Some(format!("https://127.0.0.1:{port}/validate")),
                    ca_bundle: Some(ByteString(cert.cert.pem().into_bytes())),
                    ..Default::default()
                },
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec!["".into()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["UPDATE".into()]),
                    resources: Some(vec!["nodes".into()]),
                    scope: Some("Cluster".into()),
                }]),
                object_selector: Some(LabelSelector {
                    match_labels: Some(
                        [(SLOW_WRITES_LABEL.to_string(), "true".to_string())].into(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
        };
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        api.create(&PostParams::default(), &config)
            .await
            .unwrap_or_else(|e| panic!("create webhook configuration {name}: {e}"));
        SlowWebhook {
            name: name.to_string(),
            seen,
            server,
        }
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<HeldRequest> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until the webhook has seen an UPDATE of `node`; returns when it arrived.
    pub async fn wait_request(&self, node: &str, timeout: Duration) -> Instant {
        crate::wait_for(
            &format!("the webhook to receive an update of {node}"),
            timeout,
            || async { self.seen().iter().find(|r| r.name == node).map(|r| r.at) },
        )
        .await
    }

    /// Deletes the webhook configuration (the server stops when this value is dropped).
    pub async fn remove(&self, client: &kube::Client) {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        match api.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("delete webhook configuration {}: {e}", self.name),
        }
    }
}

impl Drop for SlowWebhook {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: Arc<Mutex<Vec<HeldRequest>>>,
    hold: Duration,
    spared: Option<String>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, seen, spared) = (acceptor.clone(), seen.clone(), spared.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (seen, spared) = (seen.clone(), spared.clone());
                async move { Ok::<_, Infallible>(review(req, seen, hold, spared.as_deref()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// Records the AdmissionReview, holds it, then allows it; one made as the `spared` field manager is
/// allowed at once.
async fn review(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<HeldRequest>>>,
    hold: Duration,
    spared: Option<&str>,
) -> Response<Full<Bytes>> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let request = &review["request"];
    let field_manager = request["options"]["fieldManager"].as_str();
    if spared.is_none() || field_manager != spared {
        seen.lock().unwrap().push(HeldRequest {
            name: request["name"].as_str().unwrap_or_default().to_string(),
            at: Instant::now(),
        });
        tokio::time::sleep(hold).await;
    }
    let answer = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": { "uid": request["uid"], "allowed": true },
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .expect("webhook response")
}
