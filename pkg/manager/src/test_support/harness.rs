//! A controller under test, in-process: a scripted API server ([`ScriptedApi`]) and the
//! [`InitContext`] the manager would hand the controller's init, built around it
//! ([`ScriptedApi::context`]). A test says, in order, which requests it expects and how each is answered,
//! builds the controller with its own init, runs its prepare step ([`crate::Controller::prepare_now`])
//! and calls its reconciler's syncs itself — in milliseconds, under tokio's paused clock. The shape of
//! kube-rs's controller-rs tests (`tower_test::mock::pair` behind `kube::Client::new`), with the
//! conversation written down before it happens instead of served from a second task, so a test reads
//! as the requests it expects.
//!
//! Left out on purpose: the client's own layer (token bucket, leader fence, deadlines, probes before a
//! write: `client/layer.rs`, tested against a stand-in server in `client/tests.rs`). The fence reads the
//! monotonic clock, which a paused tokio clock does not move, and whether the layer probes before a
//! write depends on how fast the test runs, so a script that passes it would not be deterministic. A
//! write the layer abandons at its deadline is scripted as the error the layer gives
//! ([`Step::deadline_exceeded`]).
//!
//! Events go to a log of their own ([`ScriptedApi::events`]), answered at once and outside the script:
//! they are what a controller tells people, and where they fall among its requests is not what its tests
//! are about.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use netcm_node::CachedNode;
use netcm_workqueue::WorkqueueMetrics;
use parking_lot::Mutex;
use prometheus::Registry;
use serde_json::Value;
use tokio::time::Instant;

use crate::client::WriteDeadlineExceeded;
use crate::events::EventRecorder;
use crate::informer::SharedInformer;
use crate::leader::{LeaderGuard, Takeover};
use crate::supervision::ControllerHealth;
use crate::{AllocationBacklog, InitContext};

/// The Lease identity a test's controller leads under unless it says otherwise.
pub const IDENTITY: &str = "netcm-test";

/// Where Events are sent: never part of a script.
const EVENTS: &str = "/apis/events.k8s.io/";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A check of a request's JSON body that panics, with its own message, when the body is not as expected.
type BodyCheck = Box<dyn Fn(&Value) + Send>;

/// One request a test expects, and how it is answered: `200 {}` at once unless it says otherwise.
pub struct Step {
    method: Method,
    path: String,
    query: Vec<String>,
    content_type: Option<String>,
    body: Option<Value>,
    check: Option<BodyCheck>,
    reply: Reply,
    after: Duration,
}

/// How a step is answered.
enum Reply {
    Answer(StatusCode, Value),
    Hang,
    DeadlineExceeded,
}

impl Step {
    fn new(method: Method, path: &str) -> Self {
        Self {
            method,
            path: path.to_string(),
            query: Vec::new(),
            content_type: None,
            body: None,
            check: None,
            reply: Reply::Answer(StatusCode::OK, Value::Object(Default::default())),
            after: Duration::ZERO,
        }
    }

    /// A GET of `path` (without the query).
    pub fn get(path: &str) -> Self {
        Self::new(Method::GET, path)
    }

    /// A POST to `path`.
    pub fn post(path: &str) -> Self {
        Self::new(Method::POST, path)
    }

    /// A PATCH of `path`.
    pub fn patch(path: &str) -> Self {
        Self::new(Method::PATCH, path)
    }

    /// A PUT of `path`.
    pub fn put(path: &str) -> Self {
        Self::new(Method::PUT, path)
    }

    /// A DELETE of `path`.
    pub fn delete(path: &str) -> Self {
        Self::new(Method::DELETE, path)
    }

    /// The query must carry `param` (`limit=500`), among any others.
    pub fn query(mut self, param: &str) -> Self {
        self.query.push(param.to_string());
        self
    }

    /// The request's `Content-Type` must start with `content_type` (which kind of PATCH it is).
    pub fn content_type(mut self, content_type: &str) -> Self {
        self.content_type = Some(content_type.to_string());
        self
    }

    /// The body must be this JSON, exactly.
    pub fn json(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    /// `check` is called with the JSON body (`null` when there is none) and panics when it is wrong:
    /// for a body with a part the test cannot know in advance, such as a timestamp.
    pub fn check(mut self, check: impl Fn(&Value) + Send + 'static) -> Self {
        self.check = Some(Box::new(check));
        self
    }

    /// Answered with `status` and the JSON `body`.
    pub fn reply(mut self, status: u16, body: Value) -> Self {
        let status = StatusCode::from_u16(status)
            .unwrap_or_else(|_| panic!("{self}: {status} is not an HTTP status"));
        self.reply = Reply::Answer(status, body);
        self
    }

    /// Answered with a `Status` of `code`, `reason` and `message`, as the API server refuses a request.
    pub fn reply_status(self, code: u16, reason: &str, message: &str) -> Self {
        self.reply(code, status(code, reason, message))
    }

    /// The answer (or the error) comes `delay` after the request, on tokio's clock.
    pub fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }

    /// Never answered: the request stays on its way until its caller gives up or the test ends.
    pub fn hang(mut self) -> Self {
        self.reply = Reply::Hang;
        self
    }

    /// Not answered by the write's deadline: the caller gets the error the client's layer gives a fenced
    /// write it abandons then (after [`Step::after`]'s delay, the write's budget).
    pub fn deadline_exceeded(mut self) -> Self {
        self.reply = Reply::DeadlineExceeded;
        self
    }

    fn matches(&self, seen: &Seen) -> bool {
        let params: Vec<&str> = seen.query.split('&').collect();
        self.method == seen.method
            && self.path == seen.path
            && self.query.iter().all(|q| params.contains(&q.as_str()))
            && self.content_type.as_deref().is_none_or(|want| {
                seen.content_type
                    .as_deref()
                    .is_some_and(|ct| ct.starts_with(want))
            })
    }

    /// Checks the body the request carried; panics naming the request when it is not as expected.
    fn check_body(&self, seen: &Seen) {
        let body = seen.body.clone().unwrap_or(Value::Null);
        if let Some(want) = &self.body {
            assert!(
                *want == body,
                "{seen}: the body is not the one expected\n  expected: {want}\n  got:      {body}"
            );
        }
        if let Some(check) = &self.check {
            check(&body);
        }
    }

    async fn answer(self) -> Result<Response<Body>, BoxError> {
        if !self.after.is_zero() {
            tokio::time::sleep(self.after).await;
        }
        match self.reply {
            Reply::Answer(status, body) => json_response(status, &body),
            Reply::Hang => std::future::pending().await,
            Reply::DeadlineExceeded => Err(Box::new(WriteDeadlineExceeded { budget: self.after })),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query.join("&"))?;
        }
        Ok(())
    }
}

/// A `Status` as the API server answers a refused request with.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// A request as the scripted API received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its method.
    pub method: Method,
    /// Its path, without the query.
    pub path: String,
    /// Its query, without the `?` (empty without one).
    pub query: String,
    /// Its `Content-Type`, if it has one.
    pub content_type: Option<String>,
    /// Its body as JSON (`None`: empty or not JSON).
    pub body: Option<Value>,
    /// When it came, on tokio's clock.
    pub at: Instant,
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query)?;
        }
        Ok(())
    }
}

/// An Event a controller sent, as the scripted API recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    /// `Normal` or `Warning`.
    pub type_: String,
    /// Its reason (`CIDRNotAvailable`).
    pub reason: String,
    /// Its action.
    pub action: String,
    /// Its note.
    pub note: String,
    /// The name of the object it is about.
    pub regarding: String,
}

impl RecordedEvent {
    fn from_json(event: &Value) -> Self {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        Self {
            type_: text(&event["type"]),
            reason: text(&event["reason"]),
            action: text(&event["action"]),
            note: text(&event["note"]),
            regarding: text(&event["regarding"]["name"]),
        }
    }
}

/// What the scripted API holds: the steps still to come, each a group whose requests may come in any
/// order (concurrent ones), and what it has seen.
#[derive(Default)]
struct Script {
    next: VecDeque<Vec<Step>>,
    seen: Vec<Seen>,
    events: Vec<RecordedEvent>,
    failures: Vec<String>,
}

impl Script {
    /// The step `seen` is, if it is one of the next group's.
    fn take(&mut self, seen: &Seen) -> Result<Step, String> {
        let failure = match self.next.front_mut() {
            None => format!("unexpected request {seen}: the script has no more steps"),
            Some(group) => match group.iter().position(|s| s.matches(seen)) {
                Some(i) => {
                    let step = group.remove(i);
                    if group.is_empty() {
                        self.next.pop_front();
                    }
                    return Ok(step);
                }
                None => format!(
                    "unexpected request {seen}: the script expects {} next",
                    describe(group)
                ),
            },
        };
        self.failures.push(failure.clone());
        Err(failure)
    }

    fn pending(&self) -> Vec<String> {
        self.next.iter().map(|g| describe(g)).collect()
    }
}

fn describe(group: &[Step]) -> String {
    let steps: Vec<String> = group.iter().map(ToString::to_string).collect();
    match steps.len() {
        1 => steps.concat(),
        _ => format!("[{}] (in any order)", steps.join(", ")),
    }
}

/// The API server of a test: answers each request with the next step of its script, and fails the test
/// with the request's name when it is not the one expected. Dropped, it fails the test if a request was
/// unexpected or a step never came (unless the test is failing already).
pub struct ScriptedApi {
    script: Arc<Mutex<Script>>,
}

impl Default for ScriptedApi {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedApi {
    /// An API server with an empty script: every request is unexpected until steps are added.
    pub fn new() -> Self {
        Self {
            script: Arc::default(),
        }
    }

    /// A client of this API server (call inside the tokio runtime: the client's buffer is a task).
    pub fn client(&self) -> kube::Client {
        kube::Client::new(
            Scripted {
                script: self.script.clone(),
            },
            "default",
        )
    }

    /// The next request expected, after every step added before.
    pub fn expect(&self, step: Step) {
        self.script.lock().next.push_back(vec![step]);
    }

    /// Requests expected next in any order among themselves (sent concurrently), after every step
    /// added before.
    pub fn expect_in_any_order(&self, steps: impl IntoIterator<Item = Step>) {
        let group: Vec<Step> = steps.into_iter().collect();
        if !group.is_empty() {
            self.script.lock().next.push_back(group);
        }
    }

    /// Every request received so far, Events aside, in the order they came.
    pub fn requests(&self) -> Vec<Seen> {
        self.script.lock().seen.clone()
    }

    /// Every Event received so far, in the order they came.
    pub fn events(&self) -> Vec<RecordedEvent> {
        self.script.lock().events.clone()
    }

    /// The steps that have not come yet, one line per group.
    pub fn pending(&self) -> Vec<String> {
        self.script.lock().pending()
    }

    /// Panics unless every request so far was expected and every step has come.
    pub fn verify(&self) {
        let script = self.script.lock();
        let pending = script.pending();
        assert!(
            script.failures.is_empty() && pending.is_empty(),
            "the scripted API saw unexpected requests: {:?}; steps that never came: {pending:?}; requests seen: {:?}",
            script.failures,
            script.seen.iter().map(ToString::to_string).collect::<Vec<_>>(),
        );
    }

    /// An [`InitContext`] whose client is this API's; leading as [`IDENTITY`], with no Node cached,
    /// unless the builder says otherwise.
    pub fn context(&self) -> ContextBuilder<'_> {
        ContextBuilder {
            api: self,
            nodes: Vec::new(),
            leader: Leader::Elected {
                identity: IDENTITY.to_string(),
                takeover: None,
            },
            workers: 1,
        }
    }
}

impl Drop for ScriptedApi {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.verify();
        }
    }
}

/// The tower service behind [`ScriptedApi::client`]. Steps are matched when a request is handed to it,
/// in the order the client hands them on; the body is read and checked, and the answer given, in the
/// future the caller awaits, so a failed check panics in the caller's task, where the test sees it.
#[derive(Clone)]
struct Scripted {
    script: Arc<Mutex<Script>>,
}

impl tower::Service<Request<Body>> for Scripted {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let script = self.script.clone();
        if parts.uri.path().starts_with(EVENTS) {
            return Box::pin(async move {
                let event = read_json(body).await?.unwrap_or(Value::Null);
                script.lock().events.push(RecordedEvent::from_json(&event));
                json_response(StatusCode::CREATED, &event)
            });
        }
        let mut seen = Seen {
            method: parts.method.clone(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: parts
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: None,
            at: Instant::now(),
        };
        let (index, step) = {
            let mut script = script.lock();
            let step = script.take(&seen);
            script.seen.push(seen.clone());
            (script.seen.len() - 1, step)
        };
        Box::pin(async move {
            seen.body = read_json(body).await?;
            if let Some(recorded) = script.lock().seen.get_mut(index) {
                recorded.body = seen.body.clone();
            }
            let step = match step {
                Ok(step) => step,
                Err(failure) => panic!("{failure}"),
            };
            step.check_body(&seen);
            step.answer().await
        })
    }
}

/// The body as JSON; `None` when empty or not JSON.
async fn read_json(body: Body) -> Result<Option<Value>, BoxError> {
    let bytes = body.collect().await?.to_bytes();
    Ok(serde_json::from_slice(&bytes).ok())
}

fn json_response(status: StatusCode, body: &Value) -> Result<Response<Body>, BoxError> {
    Ok(Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body)?))?)
}

/// Who the test's controller runs as.
enum Leader {
    Elected {
        identity: String,
        takeover: Option<Takeover>,
    },
    NotElected,
}

/// Builds the [`InitContext`] of [`ScriptedApi::context`].
pub struct ContextBuilder<'a> {
    api: &'a ScriptedApi,
    nodes: Vec<CachedNode>,
    leader: Leader,
    workers: usize,
}

/// A context that could not be built: its metrics could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    /// The leader fence's metric.
    #[error("registering the fence's metric: {0}")]
    Fence(#[from] prometheus::Error),
    /// The workqueue metrics.
    #[error("registering the workqueue metrics: {0}")]
    Workqueue(#[from] netcm_workqueue::Error),
}

impl ContextBuilder<'_> {
    /// The Node cache holds these, as after its first list; its handlers hear of them only once the
    /// test opens it ([`SharedInformer::listed`]).
    pub fn nodes(mut self, nodes: impl IntoIterator<Item = CachedNode>) -> Self {
        self.nodes.extend(nodes);
        self
    }

    /// Leads as `identity`, having taken the Lease over from `takeover` (`None`: a first start).
    pub fn leading(mut self, identity: &str, takeover: Option<Takeover>) -> Self {
        self.leader = Leader::Elected {
            identity: identity.to_string(),
            takeover,
        };
        self
    }

    /// Runs without leader election (`--leader-elect=false`): every write passes the fence.
    pub fn without_leader_election(mut self) -> Self {
        self.leader = Leader::NotElected;
        self
    }

    /// The controller's `--concurrent-*` flag.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// The context, with a registry of its own (call inside the tokio runtime).
    pub fn build(self) -> Result<InitContext, ContextError> {
        let registry = Registry::new();
        let workqueue_metrics = WorkqueueMetrics::register(&registry)?;
        let (leader, identity, leader_elected) = match self.leader {
            Leader::Elected { identity, takeover } => (
                LeaderGuard::leading(&identity, takeover, &registry)?,
                identity,
                true,
            ),
            Leader::NotElected => (
                LeaderGuard::disabled(&registry)?,
                IDENTITY.to_string(),
                false,
            ),
        };
        let client = self.api.client();
        Ok(InitContext {
            recorder: EventRecorder::new(client.clone(), "netcm", &identity),
            client,
            nodes: SharedInformer::listed(self.nodes),
            registry,
            workqueue_metrics,
            leader,
            node_name: None,
            leader_elected,
            workers: self.workers,
            readiness: ControllerHealth::default(),
            allocation_backlog: AllocationBacklog::default(),
        })
    }
}

#[cfg(test)]
mod tests;
