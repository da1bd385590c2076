//! The bench's own watches of Nodes: a slim view of each Node (name, pod CIDRs, whether it holds its
//! lease), and when each was first seen, first seen with a CIDR and first seen with a lease.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};

use crate::fixtures::SET_LABEL;

/// A Node as the bench's watches see it: its name, pod CIDRs and whether it holds its lease, nothing
/// else kept, so watching 50,000 Nodes of ~8 KB costs the bench (which shares the cores with the
/// contender) little.
#[derive(Clone, Debug, Deserialize)]
pub struct SlimNode {
    #[serde(deserialize_with = "slim_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: SlimSpec,
}

impl SlimNode {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn pod_cidrs(&self) -> &[String] {
        &self.spec.pod_cidrs
    }

    /// Whether the Node carries the lease the node-annotation-syncer publishes.
    pub fn leased(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(LEASE_ANNOTATION))
    }
}

/// The annotation the node-annotation-syncer writes on every Node it published a lease for.
pub const LEASE_ANNOTATION: &str = "flannel.alpha.coreos.com/kube-subnet-manager";

#[derive(Clone, Debug, Default, Deserialize)]
struct SlimSpec {
    #[serde(default, rename = "podCIDRs")]
    pod_cidrs: Vec<String>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        resource_version: Option<String>,
        #[serde(default)]
        annotations: BTreeMap<String, serde::de::IgnoredAny>,
    }
    let m = Meta::deserialize(d)?;
    // Of the annotations only the lease's key is kept, with an empty value.
    let annotations = m
        .annotations
        .contains_key(LEASE_ANNOTATION)
        .then(|| BTreeMap::from([(LEASE_ANNOTATION.to_string(), String::new())]));
    Ok(ObjectMeta {
        name: m.name,
        resource_version: m.resource_version,
        annotations,
        ..Default::default()
    })
}

impl k8s_openapi::Resource for SlimNode {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for SlimNode {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// When the bench's watch first saw each Node of a set, first saw it with a pod CIDR and first saw it
/// with its lease, on the bench's own monotonic clock.
#[derive(Default)]
pub struct Seen {
    /// First event of any kind for the Node (normally its ADDED).
    pub added: HashMap<String, Instant>,
    /// First event showing `spec.podCIDRs`.
    pub allocated: HashMap<String, Instant>,
    /// First event showing the node-annotation-syncer's lease.
    pub leased: HashMap<String, Instant>,
}

/// A running watch over one set of Nodes.
pub struct SetWatch {
    /// What the watch has seen so far.
    pub seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl SetWatch {
    /// Starts watching the Nodes labelled with `set` and returns once the initial list is through, so
    /// the bench's own list does not overlap the contender's start.
    pub async fn start(client: &kube::Client, set: &str) -> SetWatch {
        Self::with_config(
            client,
            watcher::Config::default().labels(&format!("{SET_LABEL}={set}")),
        )
        .await
    }

    /// A watch of every Node, as an informer-based controller holds one.
    pub async fn every_node(client: &kube::Client) -> SetWatch {
        Self::with_config(client, watcher::Config::default()).await
    }

    /// A watch of every Node whose initial list streams, as netcm's informer asks for it.
    pub async fn every_node_streaming(client: &kube::Client) -> SetWatch {
        Self::with_config(client, watcher::Config::default().streaming_lists()).await
    }

    /// The watch asks for protobuf, as netcm's and KCM's informers do: the API server then encodes each
    /// event once for both (it caches an event's encoding per content type), and a JSON watch here would
    /// add an encoding the contender does not cause. `WATCH_JSON=1` watches in JSON (the runs before).
    async fn with_config(client: &kube::Client, config: watcher::Config) -> SetWatch {
        let client = if std::env::var("WATCH_JSON").is_ok_and(|v| v == "1") {
            client.clone()
        } else {
            netcm_manager::client::protobuf::node_informer_client(client.clone())
        };
        let api: Api<SlimNode> = Api::all(client);
        let seen: Arc<Mutex<Seen>> = Default::default();
        let recorder = seen.clone();
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut synced_tx = Some(synced_tx);
            let mut stream = std::pin::pin!(watcher(api, config));
            while let Some(ev) = stream.next().await {
                let node = match ev {
                    Ok(watcher::Event::Apply(n)) | Ok(watcher::Event::InitApply(n)) => n,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = synced_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let now = Instant::now();
                let leased = node.leased();
                let name = node.metadata.name.unwrap_or_default();
                let mut seen = recorder.lock().unwrap();
                if !node.spec.pod_cidrs.is_empty() && !seen.allocated.contains_key(&name) {
                    seen.allocated.insert(name.clone(), now);
                }
                if leased && !seen.leased.contains_key(&name) {
                    seen.leased.insert(name.clone(), now);
                }
                seen.added.entry(name).or_insert(now);
            }
        });
        synced_rx.await.expect("the set's watch lists its Nodes");
        SetWatch { seen, task }
    }

    /// How many Nodes of the set have been seen with a pod CIDR.
    pub fn allocated(&self) -> usize {
        self.seen.lock().unwrap().allocated.len()
    }

    /// Waits until `n` Nodes have a pod CIDR, polling every 20 ms; returns when the watch saw the last
    /// one, or None after `timeout`.
    pub async fn wait_allocated(&self, n: usize, timeout: Duration) -> Option<Instant> {
        self.wait_for(n, timeout, |seen| &seen.allocated).await
    }

    /// [`SetWatch::wait_allocated`] for the node-annotation-syncer's lease.
    pub async fn wait_leased(&self, n: usize, timeout: Duration) -> Option<Instant> {
        self.wait_for(n, timeout, |seen| &seen.leased).await
    }

    async fn wait_for(
        &self,
        n: usize,
        timeout: Duration,
        of: fn(&Seen) -> &HashMap<String, Instant>,
    ) -> Option<Instant> {
        let start = Instant::now();
        loop {
            {
                let seen = self.seen.lock().unwrap();
                if of(&seen).len() >= n {
                    return of(&seen).values().max().copied();
                }
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How evenly the CIDRs came: Nodes seen allocated in each whole second from the first to the last,
    /// as p10 / median / p90 and the number of seconds; a server that stalls now and then shows as a low p10.
    pub fn allocation_pace(&self) -> String {
        let seen = self.seen.lock().unwrap();
        let Some(first) = seen.allocated.values().min().copied() else {
            return "no CIDR seen".to_string();
        };
        pace(seen.allocated.values().map(|t| t.duration_since(first)))
    }
}

/// Counts per whole second of `offsets`, as "p10 / median / p90 per second over N s".
fn pace(offsets: impl Iterator<Item = Duration>) -> String {
    let mut per_second: Vec<usize> = Vec::new();
    for offset in offsets {
        let second = offset.as_secs() as usize;
        if per_second.len() <= second {
            per_second.resize(second + 1, 0);
        }
        per_second[second] += 1;
    }
    // The last second is partial: the backlog ran out in it.
    if per_second.len() > 1 {
        per_second.pop();
    }
    let seconds = per_second.len();
    if seconds == 0 {
        return "no CIDR seen".to_string();
    }
    per_second.sort_unstable();
    let at = |q: f64| per_second[((seconds - 1) as f64 * q).round() as usize];
    format!(
        "{} / {} / {} per second (p10 / median / p90) over {seconds} s",
        at(0.1),
        at(0.5),
        at(0.9)
    )
}

impl Drop for SetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::pace;
    use std::time::Duration;

    #[test]
    fn pace_counts_each_whole_second_and_leaves_out_the_partial_last_one() {
        let ms = |v: u64| Duration::from_millis(v);
        // 3 in second 0, 1 in second 1, 5 in second 2, 1 in the partial second 3.
        let offsets = [0, 10, 900, 1500, 2000, 2100, 2200, 2300, 2999, 3001].map(ms);
        assert_eq!(
            pace(offsets.into_iter()),
            "1 / 3 / 5 per second (p10 / median / p90) over 3 s"
        );
    }
}
