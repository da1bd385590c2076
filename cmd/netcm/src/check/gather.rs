//! Reading the cluster for `netcm check`: every call here is a GET/LIST, or a SelfSubjectReview /
//! SelfSubjectAccessReview / SubjectAccessReview (which change nothing). The diagnosis is elsewhere and
//! pure.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use netcm_manager::client::{load_config, ClientOptions};
use netcm_manager::published::EffectiveConfiguration;
use netcm_subnet_allocator::claims::{GROUP, KIND, PLURAL, VERSION};

use super::rbac::{self, Request, Subject};
use super::report::Finding;
use super::snapshot::{
    ClaimRecord, ClaimsState, GivenFlags, LeaseState, ObjectPoolsState, Settings, Snapshot,
};

/// What to read and as whom.
#[derive(Debug, Clone)]
pub struct Target {
    /// `--kubeconfig`.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// `--master`.
    pub master: Option<String>,
    /// `--as`: the user whose RBAC is reviewed (netcm's ServiceAccount).
    pub as_user: Option<String>,
    /// `--as-group`.
    pub as_groups: Vec<String>,
    /// `--daemonset-as`: the route DaemonSet's account, reviewed too.
    pub daemonset_as: Option<String>,
    /// The Lease's namespace.
    pub lease_namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// Flags overriding the leader's configuration.
    pub given: GivenFlags,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// What gathering produced: the API finding, then (when reachable) the snapshot and the RBAC findings.
pub struct Gathered {
    /// Whether and where the API answered.
    pub api: Finding,
    /// The state, when the API answered.
    pub snapshot: Option<Snapshot>,
    /// RBAC findings.
    pub rbac: Vec<Finding>,
}

/// What to do about an API server that does not answer, from the error's text.
pub fn unreachable_fix(server: &str, error: &str) -> String {
    let e = error.to_lowercase();
    if e.contains("401") || e.contains("unauthorized") {
        format!("the API server at {server} refused the credentials: renew them in the kubeconfig (or pass another with --kubeconfig)")
    } else if e.contains("certificate") || e.contains("tls") || e.contains("x509") {
        format!("the TLS handshake with {server} failed: check the kubeconfig's certificate-authority for this server")
    } else {
        format!("start kube-apiserver at {server} (or restore the network to it), or point --kubeconfig/--master/KUBECONFIG at a reachable API server; then: kubectl --request-timeout=5s get --raw /readyz")
    }
}

fn user_agent() -> String {
    format!("netcm-check/{}", netcm_manager::metrics::VERSION)
}

/// Reads everything the checks need.
pub async fn gather(t: &Target) -> Gathered {
    let (config, client, api) = match connect(t).await {
        Ok(connected) => connected,
        Err(api) => return Gathered::unreachable(api),
    };
    let server = config.cluster_url.to_string();
    let snapshot = match read_snapshot(t, &client, &server).await {
        Ok(s) => s,
        Err(api) => return Gathered::unreachable(api),
    };
    let mut rbac = review_rbac(t, &client, config, &snapshot).await;
    if let Some(who) = &t.daemonset_as {
        rbac.extend(review_daemonset(&client, who, &snapshot).await);
    }
    Gathered {
        api,
        snapshot: Some(snapshot),
        rbac,
    }
}

impl Gathered {
    /// Only the API finding: the failure that stopped the reading.
    fn unreachable(api: Finding) -> Self {
        Self {
            api,
            snapshot: None,
            rbac: Vec::new(),
        }
    }
}

/// A client with `t`'s timeouts, its configuration, and the API finding of a server that answered its
/// version; `Err` is the failing API finding.
async fn connect(t: &Target) -> Result<(kube::Config, kube::Client, Finding), Finding> {
    let opts = ClientOptions {
        kubeconfig: t.kubeconfig.clone(),
        master: t.master.clone(),
        qps: 50.0,
        burst: 100,
        user_agent: user_agent(),
    };
    let mut config = load_config(&opts).await.map_err(|e| {
        Finding::fail(
            "api",
            format!("no usable client configuration: {e}"),
            "pass --kubeconfig=<file> or --master=<url>, or set KUBECONFIG",
        )
    })?;
    config.connect_timeout = Some(t.timeout);
    config.read_timeout = Some(t.timeout);
    config.write_timeout = Some(t.timeout);
    let server = config.cluster_url.to_string();
    let client = client_for(config.clone()).map_err(|e| {
        Finding::fail(
            "api",
            format!("cannot build a client for {server}: {e}"),
            unreachable_fix(&server, &e.to_string()),
        )
    })?;
    let version = client.apiserver_version().await.map_err(|e| {
        let msg = error_text(&e);
        Finding::fail(
            "api",
            format!("API server {server} unreachable: {msg}"),
            unreachable_fix(&server, &msg),
        )
    })?;
    let api = Finding::ok(
        "api",
        format!("API server {server} reachable ({})", version.git_version),
    );
    Ok((config, client, api))
}

/// The state the checks diagnose; `Err` is the failing API finding when the Nodes cannot be listed,
/// without which no check can say anything.
async fn read_snapshot(
    t: &Target,
    client: &kube::Client,
    server: &str,
) -> Result<Snapshot, Finding> {
    let lease = read_lease(t, client).await;
    let published = match &lease {
        LeaseState::Found(l) => EffectiveConfiguration::from_lease(l),
        _ => None,
    };
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| {
            let msg = error_text(&e);
            Finding::fail(
                "api",
                format!("cannot list Nodes on {server}: {msg}"),
                "run netcm check as a user who may list nodes (kubectl auth can-i list nodes)",
            )
        })?;
    let claims = read_claims(client).await;
    let (object_pools, pools_without_conditions) = read_object_pools(client).await;
    let events = read_events(client).await;
    let migrations = read_migrations(client).await;
    let settings = Settings::resolve(&t.given, published.as_ref());
    Ok(Snapshot {
        now: jiff::Timestamp::now(),
        lease_namespace: t.lease_namespace.clone(),
        lease_name: t.lease_name.clone(),
        lease,
        nodes,
        claims,
        object_pools,
        pools_without_conditions,
        events,
        migrations,
        settings,
    })
}

/// The leader election Lease.
async fn read_lease(t: &Target, client: &kube::Client) -> LeaseState {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &t.lease_namespace);
    match leases.get_opt(&t.lease_name).await {
        Ok(Some(l)) => LeaseState::Found(Box::new(l)),
        Ok(None) => LeaseState::NotFound,
        Err(e) => LeaseState::Unreadable(error_text(&e)),
    }
}

/// netcm's Events in `default` (where Node Events go); none when they cannot be listed.
async fn read_events(client: &kube::Client) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.reporting_controller.as_deref() == Some("netcm"))
                .collect()
        })
        .unwrap_or_default()
}

fn client_for(config: kube::Config) -> Result<kube::Client, kube::Error> {
    let mut config = config;
    if let Ok(ua) = http::HeaderValue::from_str(&user_agent()) {
        config.headers.push((http::header::USER_AGENT, ua));
    }
    kube::Client::try_from(config)
}

/// An error's message with its sources (kube's top-level text alone often says only "ServiceError").
fn error_text(e: &kube::Error) -> String {
    if let kube::Error::Api(s) = e {
        return format!("{} ({} {})", s.message, s.code, s.reason);
    }
    let mut text = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(s) = cur {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cur = s.source();
    }
    text
}

async fn read_claims(client: &kube::Client) -> ClaimsState {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, PLURAL),
    );
    match api.list(&ListParams::default()).await {
        Ok(list) => ClaimsState::Listed(
            list.items
                .iter()
                .map(|o| {
                    let spec = &o.data["spec"];
                    let field = |f: &str| spec[f].as_str().unwrap_or_default().to_string();
                    ClaimRecord {
                        name: o.metadata.name.clone().unwrap_or_default(),
                        cidr: field("cidr"),
                    }
                })
                .collect(),
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => ClaimsState::NotInstalled,
        Err(e) => ClaimsState::Unreadable(error_text(&e)),
    }
}

/// The ClusterCIDR objects as the allocator's pools, oldest first (then by name), as it ranks them, and
/// the names of those whose status has no conditions.
async fn read_object_pools(client: &kube::Client) -> (ObjectPoolsState, Vec<String>) {
    let resource = netcm_subnet_allocator::cluster_cidrs::api_resource();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let mut objects = list.items;
            netcm_subnet_allocator::cluster_cidrs::sort_oldest_first(&mut objects);
            let without_conditions = objects
                .iter()
                .filter(|o| super::pools::lacks_conditions(o.data.get("status")))
                .map(|o| o.metadata.name.clone().unwrap_or_default())
                .collect();
            let pools = objects
                .iter()
                .map(netcm_subnet_allocator::cluster_cidrs::object_pool)
                .collect();
            (ObjectPoolsState::Listed(pools), without_conditions)
        }
        Err(kube::Error::Api(s)) if s.code == 404 => (ObjectPoolsState::NotInstalled, Vec::new()),
        Err(e) => (ObjectPoolsState::Unreadable(error_text(&e)), Vec::new()),
    }
}

/// The PodCIDRMigrations, in the order they run; none where the CRD is not installed.
async fn read_migrations(
    client: &kube::Client,
) -> Result<Vec<netcm_api::pod_cidr_migration::Migration>, String> {
    use netcm_api::pod_cidr_migration::{api_resource, in_run_order, Migration};
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let mut migrations: Vec<Migration> = list.iter().map(Migration::from_object).collect();
            in_run_order(&mut migrations);
            Ok(migrations)
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(error_text(&e)),
    }
}

/// Whose RBAC to review: `--as`, else this user if it is a ServiceAccount, else the leader pod's
/// ServiceAccount (impersonated), else nobody.
async fn subject(
    t: &Target,
    client: &kube::Client,
    s: &Snapshot,
) -> Result<(String, bool), String> {
    if let Some(user) = &t.as_user {
        return Ok((user.clone(), true));
    }
    let me = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()
        .and_then(|r| r.status)
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    if let Some(me) = &me {
        if me.starts_with("system:serviceaccount:") {
            return Ok((me.clone(), false));
        }
    }
    let ns = &s.lease_namespace;
    let hint = format!(
        "run as netcm's ServiceAccount, or: netcm check --as=system:serviceaccount:{ns}:netcm"
    );
    let Some(holder) = s.holder() else {
        return Err(format!("RBAC not reviewed: you are {}, not a ServiceAccount, and no leader pod names netcm's; {hint}", me.unwrap_or_else(|| "unknown".into())));
    };
    let pod = super::leader::holder_pod(holder);
    match Api::<Pod>::namespaced(client.clone(), ns).get_opt(pod).await {
        Ok(Some(p)) => {
            let sa = p.spec.and_then(|s| s.service_account_name).unwrap_or_else(|| "default".into());
            Ok((format!("system:serviceaccount:{ns}:{sa}"), true))
        }
        _ => Err(format!("RBAC not reviewed: you are {}, and the leader {holder} is not a pod in {ns} to take the ServiceAccount from; {hint}", me.unwrap_or_else(|| "unknown".into()))),
    }
}

async fn review_rbac(
    t: &Target,
    client: &kube::Client,
    config: kube::Config,
    s: &Snapshot,
) -> Vec<Finding> {
    let (who, impersonate) = match subject(t, client, s).await {
        Ok(x) => x,
        Err(why) => return rbac::check(&Subject::NotReviewed(why), &[], &s.lease_namespace),
    };
    let reviewer = if impersonate {
        let mut c = config;
        c.auth_info.impersonate = Some(who.clone());
        if !t.as_groups.is_empty() {
            c.auth_info.impersonate_groups = Some(t.as_groups.clone());
        }
        match client_for(c) {
            Ok(c) => c,
            Err(e) => {
                return rbac::check(
                    &Subject::NotReviewed(format!("cannot impersonate {who}: {e}")),
                    &[],
                    &s.lease_namespace,
                )
            }
        }
    } else {
        client.clone()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(reviewer);
    let mut answers: Vec<(Request, Result<bool, String>)> = Vec::new();
    for req in rbac::requests(&s.settings, &s.lease_namespace, &s.lease_name) {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(attributes(&req)),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map(|r| r.status.is_some_and(|s| s.allowed))
            .map_err(|e| error_text(&e));
        if let (Err(e), true) = (&answer, impersonate) {
            if e.contains("impersonate") {
                let why = format!("RBAC not reviewed: you may not impersonate {who} ({e}); run as netcm's ServiceAccount");
                return rbac::check(&Subject::NotReviewed(why), &[], &s.lease_namespace);
            }
        }
        answers.push((req, answer));
    }
    rbac::check(&Subject::Reviewed(who), &answers, &s.lease_namespace)
}

/// What a review asks about `req`, for either kind of review.
fn attributes(req: &Request) -> ResourceAttributes {
    ResourceAttributes {
        verb: Some(req.verb.into()),
        group: Some(req.group.into()),
        resource: Some(req.resource.into()),
        subresource: (!req.subresource.is_empty()).then(|| req.subresource.into()),
        namespace: req.namespace.clone(),
        name: req.name.clone(),
        ..Default::default()
    }
}

/// The groups the API server gives a ServiceAccount's token (`system:serviceaccount:NS:NAME`), which
/// RBAC may bind too; any other user: only `system:authenticated`.
fn groups_of(user: &str) -> Vec<String> {
    let mut groups = vec!["system:authenticated".to_string()];
    if let Some(rest) = user.strip_prefix("system:serviceaccount:") {
        if let Some((ns, _)) = rest.split_once(':') {
            groups.push("system:serviceaccounts".into());
            groups.push(format!("system:serviceaccounts:{ns}"));
        }
    }
    groups
}

/// The route DaemonSet's account `who`, reviewed by SubjectAccessReview: it is not the user running the
/// check (inside the chart's test pod, the controller's account, which may create them for secure
/// metrics), and impersonating it would need a right the check's users seldom have.
async fn review_daemonset(client: &kube::Client, who: &str, s: &Snapshot) -> Vec<Finding> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let mut answers = Vec::new();
    for review in rbac::daemonset_requests(&s.lease_namespace, &s.lease_name) {
        let req = &review.request;
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.to_string()),
                groups: Some(groups_of(who)),
                resource_attributes: Some(attributes(req)),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &sar)
            .await
            .map(|r| r.status.is_some_and(|s| s.allowed))
            .map_err(|e| error_text(&e));
        let failed = answer.is_err();
        answers.push((review, answer));
        // The same refusal for every review: the first says it.
        if failed {
            break;
        }
    }
    rbac::check_daemonset(who, &answers, &s.lease_namespace)
}
