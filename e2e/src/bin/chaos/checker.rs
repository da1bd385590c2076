//! The checker: what the cluster looks like while the campaign runs.
//!
//! - Overlaps: every second a list of the Nodes through each API server, and a Node watch through each
//!   (every change checked against the watch's current view), so two Nodes holding overlapping pod CIDRs
//!   at once are seen even between two lists. Each pair is reported once, with the time first seen.
//! - The Lease: read through both API servers every 250 ms (the newer answer wins); its holder now (the
//!   faults' "leader"), every holder change, and the latest `renewTime` seen for each holder — with the
//!   audit logs, what the report derives term ends from.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::{watcher, WatchStreamExt};
use netcm_e2e::{LEASE_NAME, LEASE_NAMESPACE};
use tokio::sync::watch;

/// A Node as the checker keeps it.
#[derive(Debug, Clone)]
pub struct NodeCidrs {
    pub name: String,
    pub uid: String,
    pub cidrs: Vec<IpNet>,
    /// Pod CIDRs that do not parse. Dropping them would hide a range from the overlap sweep, so each
    /// is kept and reported as a finding instead.
    pub unparsable: Vec<String>,
}

impl NodeCidrs {
    fn of(node: &Node) -> NodeCidrs {
        let (cidrs, unparsable) = parse_cidrs(&netcm_e2e::nodes::pod_cidrs(node));
        NodeCidrs {
            name: node.metadata.name.clone().unwrap_or_default(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            cidrs,
            unparsable,
        }
    }
}

/// (the CIDRs that parse, the texts that do not).
pub fn parse_cidrs(texts: &[String]) -> (Vec<IpNet>, Vec<String>) {
    let mut cidrs = Vec::new();
    let mut unparsable = Vec::new();
    for text in texts {
        match text.parse::<IpNet>() {
            Ok(c) => cidrs.push(c),
            Err(_) => unparsable.push(text.clone()),
        }
    }
    (cidrs, unparsable)
}

/// A pod CIDR on a Node that does not parse as a CIDR: the checker cannot tell what it overlaps.
#[derive(Debug, Clone)]
pub struct Unparsable {
    pub first_seen: jiff::Timestamp,
    pub node: String,
    pub text: String,
    pub seen_by: String,
}

/// Two Nodes seen holding overlapping pod CIDRs at once.
#[derive(Debug, Clone)]
pub struct Overlap {
    pub first_seen: jiff::Timestamp,
    pub a: (String, IpNet),
    pub b: (String, IpNet),
    /// Which view saw it first (`list via kube-apiserver 1`, `watch via kube-apiserver 2`).
    pub seen_by: String,
}

/// A change of the Lease's holder, in the order of the versions seen (`to` None: a release).
#[derive(Debug, Clone)]
pub struct HolderChange {
    pub from: Option<String>,
    pub to: Option<String>,
}

/// What the checker saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Keyed by the two Nodes' UIDs, sorted.
    pub overlaps: BTreeMap<(String, String), Overlap>,
    /// Keyed by the Node's UID and the text, so a Node that keeps a bad CIDR counts once.
    pub unparsable: BTreeMap<(String, String), Unparsable>,
    /// The holder of the newest version seen.
    pub holder: Option<String>,
    /// The holder of every version of the Lease seen, by resourceVersion.
    pub versions: BTreeMap<u64, Option<String>>,
    /// The latest `renewTime` seen per holder identity.
    pub renewals: HashMap<String, jiff::Timestamp>,
    pub lists: u64,
    pub failed_lists: u64,
    pub most_nodes: usize,
    /// When a Node (by name; the workload never reuses one) was first seen with pod CIDRs by either
    /// Node watch: when the write that gave them landed, give or take the watch's delay.
    pub cidrs_seen: HashMap<String, jiff::Timestamp>,
}

/// The running checker.
pub struct Checker {
    seen: Arc<Mutex<Seen>>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const SERVERS: [&str; 2] = ["kube-apiserver 1", "kube-apiserver 2"];

impl Checker {
    /// Starts the list sampler, the Node watches and the Lease sampler through both servers.
    pub fn start(clients: &[kube::Client; 2]) -> Checker {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        for (client, server) in clients.iter().zip(SERVERS) {
            tasks.push(tokio::spawn(lists(
                client.clone(),
                server,
                seen.clone(),
                stopped.clone(),
            )));
            tasks.push(tokio::spawn(watch_nodes(
                client.clone(),
                server,
                seen.clone(),
                stopped.clone(),
            )));
        }
        for client in clients {
            tasks.push(tokio::spawn(watch_lease(
                client.clone(),
                seen.clone(),
                stopped.clone(),
            )));
        }
        tasks.push(tokio::spawn(lease(clients.clone(), seen.clone(), stopped)));
        Checker { seen, stop, tasks }
    }

    /// What has been seen so far.
    pub fn seen(&self) -> MutexGuard<'_, Seen> {
        lock(&self.seen)
    }

    /// Stops every task; what was seen.
    pub async fn stop(self) -> Seen {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        std::mem::take(&mut *lock(&self.seen))
    }
}

impl Seen {
    /// Every change of holder, in resourceVersion order.
    pub fn changes(&self) -> Vec<HolderChange> {
        let mut out = Vec::new();
        let mut current: Option<&Option<String>> = None;
        for holder in self.versions.values() {
            if current.is_some_and(|c| c != holder) || (current.is_none() && holder.is_some()) {
                out.push(HolderChange {
                    from: current.cloned().flatten(),
                    to: holder.clone(),
                });
            }
            current = Some(holder);
        }
        out
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records each pod CIDR of `n` that does not parse, if not seen before.
fn record_unparsable(seen: &Mutex<Seen>, n: &NodeCidrs, by: &str) {
    if n.unparsable.is_empty() {
        return;
    }
    let mut seen = lock(seen);
    for text in &n.unparsable {
        seen.unparsable
            .entry((n.uid.clone(), text.clone()))
            .or_insert_with(|| {
                eprintln!(
                    "[chaos] UNPARSABLE pod CIDR {text:?} on {} (seen by {by})",
                    n.name
                );
                Unparsable {
                    first_seen: jiff::Timestamp::now(),
                    node: n.name.clone(),
                    text: text.clone(),
                    seen_by: by.to_string(),
                }
            });
    }
}

/// Records each overlapping pair of `nodes` not seen before.
fn record(seen: &Mutex<Seen>, nodes: &[NodeCidrs], by: &str) {
    let found = overlapping_pairs(nodes);
    if found.is_empty() {
        return;
    }
    let mut seen = lock(seen);
    for (i, ci, j, cj) in found {
        let (a, b) = (&nodes[i], &nodes[j]);
        let key = if a.uid < b.uid {
            (a.uid.clone(), b.uid.clone())
        } else {
            (b.uid.clone(), a.uid.clone())
        };
        seen.overlaps.entry(key).or_insert_with(|| {
            let o = Overlap {
                first_seen: jiff::Timestamp::now(),
                a: (a.name.clone(), ci),
                b: (b.name.clone(), cj),
                seen_by: by.to_string(),
            };
            eprintln!(
                "[chaos] OVERLAP {} holds {} and {} holds {} (seen by {by})",
                o.a.0, o.a.1, o.b.0, o.b.1
            );
            o
        });
    }
}

/// Every pair of different Nodes holding overlapping CIDRs: (node index, CIDR, node index, CIDR).
pub fn overlapping_pairs(nodes: &[NodeCidrs]) -> Vec<(usize, IpNet, usize, IpNet)> {
    netcm_e2e::overlaps::overlapping_pairs(
        nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.cidrs.iter().map(move |c| (*c, i))),
    )
    .into_iter()
    .map(|((a, an), (b, bn))| (a, an, b, bn))
    .collect()
}

/// Lists the Nodes through one server every second.
async fn lists(
    client: kube::Client,
    server: &'static str,
    seen: Arc<Mutex<Seen>>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Node> = Api::all(client);
    let by = format!("list via {server}");
    while !*stop.borrow() {
        let listed =
            tokio::time::timeout(Duration::from_secs(3), api.list(&ListParams::default())).await;
        match listed {
            Ok(Ok(list)) => {
                let nodes: Vec<NodeCidrs> = list.items.iter().map(NodeCidrs::of).collect();
                for n in &nodes {
                    record_unparsable(&seen, n, &by);
                }
                record(&seen, &nodes, &by);
                let mut s = lock(&seen);
                s.lists += 1;
                s.most_nodes = s.most_nodes.max(nodes.len());
            }
            _ => lock(&seen).failed_lists += 1,
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Notes when `n` was first seen with pod CIDRs.
fn first_cidrs(seen: &Mutex<Seen>, n: &NodeCidrs) {
    if !n.cidrs.is_empty() {
        lock(seen)
            .cidrs_seen
            .entry(n.name.clone())
            .or_insert_with(jiff::Timestamp::now);
    }
}

/// Watches the Nodes through one server, checking each change against the watch's current view.
async fn watch_nodes(
    client: kube::Client,
    server: &'static str,
    seen: Arc<Mutex<Seen>>,
    mut stop: watch::Receiver<bool>,
) {
    let by = format!("watch via {server}");
    let stream = watcher(Api::<Node>::all(client), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut view: HashMap<String, NodeCidrs> = HashMap::new();
    let mut relist: Option<HashMap<String, NodeCidrs>> = None;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = stop.changed() => return,
        };
        let Some(event) = event else { return };
        match event {
            Ok(watcher::Event::Init) => relist = Some(HashMap::new()),
            Ok(watcher::Event::InitApply(n)) => {
                let n = NodeCidrs::of(&n);
                record_unparsable(&seen, &n, &by);
                first_cidrs(&seen, &n);
                relist
                    .get_or_insert_with(HashMap::new)
                    .insert(n.name.clone(), n);
            }
            Ok(watcher::Event::InitDone) => {
                view = relist.take().unwrap_or_default();
                let all: Vec<NodeCidrs> = view.values().cloned().collect();
                record(&seen, &all, &by);
            }
            Ok(watcher::Event::Apply(n)) => {
                let n = NodeCidrs::of(&n);
                record_unparsable(&seen, &n, &by);
                first_cidrs(&seen, &n);
                let has_cidrs = !n.cidrs.is_empty();
                view.insert(n.name.clone(), n.clone());
                if has_cidrs {
                    let touching: Vec<NodeCidrs> = view
                        .values()
                        .filter(|o| {
                            o.name == n.name
                                || o.cidrs.iter().any(|c| {
                                    n.cidrs.iter().any(|d| {
                                        c.contains(&d.network()) || d.contains(&c.network())
                                    })
                                })
                        })
                        .cloned()
                        .collect();
                    record(&seen, &touching, &by);
                }
            }
            Ok(watcher::Event::Delete(n)) => {
                view.remove(n.metadata.name.as_deref().unwrap_or_default());
            }
            Err(_) => {}
        }
    }
}

/// Records one version of the Lease: its holder, and its holder's latest `renewTime`.
fn observe(seen: &Mutex<Seen>, lease: Lease) {
    let rv: u64 = lease
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let spec = lease.spec.unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let mut s = lock(seen);
    if let (Some(h), Some(t)) = (&holder, spec.renew_time) {
        let latest = s.renewals.entry(h.clone()).or_insert(t.0);
        *latest = (*latest).max(t.0);
    }
    if rv > s.versions.keys().next_back().copied().unwrap_or(0) {
        s.holder = holder.clone();
    }
    s.versions.insert(rv, holder);
}

/// Reads the Lease through both servers every 250 ms.
async fn lease(
    clients: [kube::Client; 2],
    seen: Arc<Mutex<Seen>>,
    mut stop: watch::Receiver<bool>,
) {
    let apis: Vec<Api<Lease>> = clients
        .iter()
        .map(|c| Api::namespaced(c.clone(), LEASE_NAMESPACE))
        .collect();
    while !*stop.borrow() {
        let reads = futures::future::join_all(apis.iter().map(|api| async move {
            tokio::time::timeout(Duration::from_secs(1), api.get_opt(LEASE_NAME))
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        }))
        .await;
        for lease in reads.into_iter().flatten() {
            observe(&seen, lease);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Watches the Lease through one server: every version, a release (no holder) included, which a read
/// every 250 ms can miss when a standby takes the Lease at once.
async fn watch_lease(
    client: kube::Client,
    seen: Arc<Mutex<Seen>>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={LEASE_NAME}"));
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = stop.changed() => return,
        };
        match event {
            None => return,
            Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))) => observe(&seen, l),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_cidrs;

    #[test]
    fn a_pod_cidr_that_does_not_parse_is_kept_as_unparsable_not_dropped() {
        let texts = ["10.0.1.0/24", "10.0.2.0/33", "fd00::/64", "not-a-cidr"].map(String::from);
        let (cidrs, unparsable) = parse_cidrs(&texts);
        let parsed: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(parsed, ["10.0.1.0/24", "fd00::/64"]);
        assert_eq!(unparsable, ["10.0.2.0/33", "not-a-cidr"]);
    }
}
