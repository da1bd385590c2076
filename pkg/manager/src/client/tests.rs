//! The client's whole tower stack (kube's default stack plus ours), driven against a plain-HTTP stand-in
//! for the API server on 127.0.0.1. What is tested is where our layer sits and what it adds to a write —
//! the answers a real API server gives are tested in e2e/.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use kube::client::Body;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use super::{build_client, ClientMetrics, ClientOptions};
use crate::leader::{LeaderElectionConfig, LeaderGuard};

/// The requests the stand-in has seen, as `METHOD path?query`.
type Seen = Arc<Mutex<Vec<String>>>;

/// The probe the layer sends for a fresh answer before a write after a quiet spell.
const PROBE: &str = "GET /version";

/// Serves `answer(n, request line)` for the n-th request other than a probe (from 0) until the test
/// ends; probes are answered at once. Every request is recorded in order, probes included.
async fn stand_in<F, Fut>(answer: F) -> (String, Seen, CancellationToken)
where
    F: Fn(usize, String) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    stand_in_probed(answer, true).await
}

/// [`stand_in`], with probes left unanswered unless `answer_probes`, as a frozen API server would.
async fn stand_in_probed<F, Fut>(
    answer: F,
    answer_probes: bool,
) -> (String, Seen, CancellationToken)
where
    F: Fn(usize, String) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let cancel = CancellationToken::new();
    let recorded = seen.clone();
    let limits = crate::http::Limits::default();
    tokio::spawn(crate::http::accept_loop(
        listener,
        limits,
        cancel.clone(),
        move |stream| {
            let (answer, recorded) = (answer.clone(), recorded.clone());
            crate::http::serve_connection(
                stream,
                limits.header_read_timeout,
                move |req: Request<Incoming>| {
                    let line = format!("{} {}", req.method(), req.uri());
                    let n = {
                        let mut seen = recorded.lock().expect("seen");
                        seen.push(line.clone());
                        seen.iter()
                            .filter(|l| *l != PROBE)
                            .count()
                            .saturating_sub(1)
                    };
                    let answer = answer.clone();
                    async move {
                        if line != PROBE {
                            return answer(n, line).await;
                        }
                        if !answer_probes {
                            std::future::pending::<()>().await;
                        }
                        status(200)
                    }
                },
            )
        },
    ));
    (format!("http://{addr}"), seen, cancel)
}

fn status(code: u16) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("response")
}

fn election(lease: Duration, renew: Duration) -> LeaderElectionConfig {
    LeaderElectionConfig {
        name: "netcm".into(),
        namespace: "kube-system".into(),
        identity: "me".into(),
        lease_duration: lease,
        renew_deadline: renew,
        retry_period: renew / 4,
    }
}

/// KCM's default election: a 15 s lease renewed within 10 s.
fn default_election() -> LeaderElectionConfig {
    election(Duration::from_secs(15), Duration::from_secs(10))
}

/// The process's client against `base`, fenced by a guard that renewed its lease just now.
fn client(base: &str, cfg: &LeaderElectionConfig) -> (kube::Client, LeaderGuard) {
    let (client, guard, _) = client_and_registry(base, cfg);
    (client, guard)
}

/// [`client`], and the registry its metrics are in.
fn client_and_registry(
    base: &str,
    cfg: &LeaderElectionConfig,
) -> (kube::Client, LeaderGuard, Registry) {
    let registry = Registry::new();
    let guard = LeaderGuard::new(cfg, &registry).expect("guard");
    guard.renewed(Instant::now());
    let opts = ClientOptions {
        kubeconfig: None,
        master: Some(base.to_string()),
        qps: 1000.0,
        burst: 1000,
        user_agent: "netcm-test".into(),
    };
    let config = kube::Config::new(base.parse().expect("uri"));
    let metrics = ClientMetrics::register(&registry).expect("metrics");
    let client = build_client(config, &opts, guard.clone(), metrics).expect("client");
    (client, guard, registry)
}

/// `netcm_api_server_probes_total{result}` in `registry`.
fn probes(registry: &Registry, result: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == "netcm_api_server_probes_total")
        .flat_map(|f| f.get_metric().to_vec())
        .filter(|m| m.get_label().iter().any(|l| l.value() == result))
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

fn patch(path: &str) -> Request<Body> {
    Request::builder()
        .method(Method::PATCH)
        .uri(path)
        .header("content-type", "application/merge-patch+json")
        .body(Body::from(b"{}".to_vec()))
        .expect("request")
}

/// The requests seen other than probes.
fn writes_and_reads(seen: &Seen) -> Vec<String> {
    let seen = seen.lock().expect("seen");
    seen.iter().filter(|l| *l != PROBE).cloned().collect()
}

/// The `timeout` query parameter of a seen request line, in milliseconds.
fn timeout_ms(line: &str) -> Option<u64> {
    let query = line.split_once('?')?.1;
    let value = query.split('&').find_map(|p| p.strip_prefix("timeout="))?;
    value.strip_suffix("ms")?.parse().ok()
}

#[tokio::test]
async fn a_fenced_write_tells_the_api_server_a_deadline_that_ends_before_the_lease_could_pass() {
    let (base, seen, _stop) = stand_in(|_, _| async { status(200) }).await;
    let cfg = default_election();
    let (client, _guard) = client(&base, &cfg);
    client
        .send(patch("/api/v1/nodes/n1?fieldManager=netcm"))
        .await
        .expect("write");
    let line = writes_and_reads(&seen)[0].clone();
    let ms = timeout_ms(&line).unwrap_or_else(|| panic!("no timeout=<n>ms in {line}"));
    assert!(
        ms > 0 && u128::from(ms) < cfg.lease_duration.as_millis(),
        "{line}"
    );
    assert!(line.contains("fieldManager=netcm"), "{line}");
}

#[tokio::test]
async fn a_read_carries_no_deadline_of_ours() {
    let (base, seen, _stop) = stand_in(|_, _| async { status(200) }).await;
    let (client, _guard) = client(&base, &default_election());
    let get = Request::builder()
        .uri("/api/v1/nodes")
        .body(Body::empty())
        .expect("request");
    client.send(get).await.expect("read");
    assert_eq!(seen.lock().expect("seen").clone(), ["GET /api/v1/nodes"]);
}

#[tokio::test]
async fn a_fenced_write_the_api_server_never_answers_is_abandoned_before_the_lease_could_pass() {
    let (base, _seen, _stop) = stand_in(|_, _| async {
        std::future::pending::<()>().await;
        status(200)
    })
    .await;
    let cfg = election(Duration::from_secs(3), Duration::from_secs(1));
    let renewed = Instant::now();
    let (client, _guard) = client(&base, &cfg);
    let result = tokio::time::timeout(
        cfg.lease_duration + Duration::from_secs(2),
        client.send(patch("/api/v1/nodes/n1")),
    )
    .await
    .expect("the write must be abandoned at its deadline, not hang");
    let err = result.expect_err("nobody answered").to_string();
    assert!(
        renewed.elapsed() < cfg.lease_duration,
        "abandoned only {:?} after the renewal",
        renewed.elapsed()
    );
    assert!(err.contains("deadline"), "{err}");
}

#[tokio::test]
async fn a_write_retried_after_a_429_passes_the_fence_again() {
    // The first answer comes after the fence has closed (renew deadline 1 s): the retry must be
    // refused by the fence, not sent by a retry layer below it.
    let (base, seen, _stop) = stand_in(|n, _| async move {
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            status(429)
        } else {
            status(200)
        }
    })
    .await;
    let cfg = election(Duration::from_secs(2), Duration::from_secs(1));
    let (client, _guard) = client(&base, &cfg);
    let result = client.send(patch("/api/v1/nodes/n1")).await;
    let sent = writes_and_reads(&seen).len();
    assert_eq!(sent, 1, "the retry went out without passing the fence");
    let err = result.expect_err("the retry is fenced").to_string();
    assert!(err.contains("fence"), "{err}");
}

#[tokio::test]
async fn a_write_the_api_server_answered_no_longer_keeps_the_lease_from_being_released() {
    let (base, _seen, _stop) = stand_in(|_, _| async { status(409) }).await;
    let (client, guard) = client(&base, &default_election());
    client
        .send(patch("/api/v1/nodes/n1"))
        .await
        .expect("answered");
    assert_eq!(
        guard
            .stop_writes_and_settle(Duration::from_millis(20))
            .await,
        Ok(())
    );
}

#[tokio::test]
async fn a_write_answered_with_a_server_error_may_still_land_so_the_lease_is_kept() {
    let (base, _seen, _stop) = stand_in(|_, _| async { status(500) }).await;
    let (client, guard) = client(&base, &default_election());
    client
        .send(patch("/api/v1/nodes/n1"))
        .await
        .expect("answered");
    let unsettled = guard
        .stop_writes_and_settle(Duration::from_millis(20))
        .await
        .expect_err("an etcd timeout may still commit");
    assert_eq!(unsettled.in_flight, 0);
    assert!(!unsettled.may_land_for.is_zero());
}

#[tokio::test]
async fn a_write_abandoned_by_its_caller_keeps_the_lease_until_its_deadline() {
    let (base, seen, _stop) = stand_in(|_, _| async {
        std::future::pending::<()>().await;
        status(200)
    })
    .await;
    let (client, guard) = client(&base, &default_election());
    // The caller gives up once the request is out, as a drained sync is aborted on shutdown.
    let sending = tokio::spawn(async move { client.send(patch("/api/v1/nodes/n1")).await });
    while writes_and_reads(&seen).is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sending.abort();
    let _ = sending.await;
    let unsettled = guard
        .stop_writes_and_settle(Duration::from_millis(20))
        .await
        .expect_err("the API server may still apply it");
    assert!(
        unsettled.may_land_for > Duration::from_secs(10),
        "{unsettled}"
    );
}

#[tokio::test]
async fn a_write_after_a_quiet_spell_goes_out_only_once_a_probe_of_the_api_server_is_answered() {
    let (base, seen, _stop) = stand_in(|_, _| async { status(200) }).await;
    let (client, _guard, registry) = client_and_registry(&base, &default_election());
    tokio::time::sleep(super::layer::FRESH_ANSWER * 3).await;
    client.send(patch("/api/v1/nodes/n1")).await.expect("write");
    assert_eq!(probes(&registry, "answered"), 1);
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], PROBE);
    assert!(seen[1].starts_with("PATCH /api/v1/nodes/n1"), "{seen:?}");
}

#[tokio::test]
async fn a_write_is_never_sent_to_an_api_server_that_stopped_answering_since_its_last_answer() {
    // A frozen API server holds what is sent to it and applies it when it thaws, after the Lease may
    // have passed; the fence sees no stall yet (nothing has waited 250 ms).
    let (base, seen, _stop) = stand_in_probed(|_, _| async { status(200) }, false).await;
    let cfg = election(Duration::from_secs(3), Duration::from_secs(1));
    let (client, _guard, registry) = client_and_registry(&base, &cfg);
    tokio::time::sleep(super::layer::FRESH_ANSWER * 3).await;
    let result = tokio::time::timeout(
        cfg.lease_duration + Duration::from_secs(2),
        client.send(patch("/api/v1/nodes/n1")),
    )
    .await
    .expect("the write must give up once the fence would close, not hang");
    let err = result
        .expect_err("the probe was never answered")
        .to_string();
    assert_eq!(seen.lock().expect("seen").clone(), [PROBE], "{err}");
    assert_eq!(probes(&registry, "failed"), 1);
}

#[tokio::test]
async fn writes_that_find_the_last_answer_stale_together_wait_for_a_probe_and_do_not_each_send_one()
{
    let (base, seen, _stop) = stand_in(|_, _| async { status(200) }).await;
    let (client, _guard) = client(&base, &default_election());
    tokio::time::sleep(super::layer::FRESH_ANSWER * 3).await;
    let writes = (0..8).map(|i| {
        let client = client.clone();
        async move { client.send(patch(&format!("/api/v1/nodes/n{i}"))).await }
    });
    for result in futures::future::join_all(writes).await {
        result.expect("write");
    }
    let probes = seen
        .lock()
        .expect("seen")
        .iter()
        .filter(|l| *l == PROBE)
        .count();
    assert!(probes >= 1, "a probe went first");
    assert!(probes < 8, "{probes} probes for 8 writes");
}
