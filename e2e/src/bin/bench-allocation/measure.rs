//! What a run reads off the machine: a process's memory and CPU from /proc (`netcm_e2e::proc_stats`),
//! and the writes a contender made from the API server's audit log.

use std::collections::HashMap;
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::time::Duration;

use netcm_e2e::audit::AuditEvent;

pub use netcm_e2e::proc_stats::{proc_stats, MachineCpu, ProcStats};

/// A place in the audit log: what a contender wrote is read from there on, not the whole log again
/// (at 50,000 Nodes a set adds ~150 MB to it).
pub struct AuditMark {
    path: PathBuf,
    offset: u64,
}

/// Writes seen in the audit log after a mark.
#[derive(Debug, Clone, Copy, Default)]
pub struct Writes {
    /// create/update/patch of nodes and nodes/status.
    pub node: usize,
    /// create/update/patch/delete of podcidrclaims.
    pub claim: usize,
    /// Of those, the ones refused (not 2xx).
    pub failed: usize,
}

impl AuditMark {
    /// The end of the audit log now.
    pub fn now(path: &Path) -> AuditMark {
        AuditMark {
            path: path.to_path_buf(),
            offset: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        }
    }

    /// The writes since the mark whose user agent contains `ua` and whose object's name starts with
    /// `name_prefix` (claims are named by CIDR: use "" for them).
    pub fn writes(&self, ua: &str, name_prefix: &str) -> Writes {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Writes::default();
        };
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return Writes::default();
        }
        let mut w = Writes::default();
        for line in std::io::BufReader::new(file).lines() {
            let Ok(line) = line else { break };
            let Ok(e) = serde_json::from_str::<AuditEvent>(&line) else {
                continue;
            };
            if e.stage != "ResponseComplete" || !e.user_agent.contains(ua) {
                continue;
            }
            let name_ok = e
                .object_ref
                .as_ref()
                .is_some_and(|o| o.name.starts_with(name_prefix));
            let write = matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete");
            match e.resource().as_str() {
                "nodes" | "nodes/status" if write && e.verb != "delete" && name_ok => w.node += 1,
                "podcidrclaims" if write => w.claim += 1,
                _ => continue,
            }
            if !e.succeeded() {
                w.failed += 1;
            }
        }
        w
    }
}

impl AuditMark {
    /// For each Node of `set` created since the mark, on the API server's clock (audit timestamps are in
    /// microseconds), so neither the bench's watch nor its client enters: from receiving its create to
    /// the contender's (`ua`) first successful Node write completing, and that span's three parts.
    pub fn create_to_write(&self, set: &str, ua: &str) -> ServerSpans {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return ServerSpans::default();
        };
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return ServerSpans::default();
        }
        // Per Node: its create (received, done) and the contender's first write (received, done).
        let mut created: HashMap<String, (jiff::Timestamp, jiff::Timestamp)> = HashMap::new();
        let mut written: HashMap<String, (jiff::Timestamp, jiff::Timestamp)> = HashMap::new();
        for line in std::io::BufReader::new(file).lines() {
            let Ok(line) = line else { break };
            let Ok(e) = serde_json::from_str::<AuditEvent>(&line) else {
                continue;
            };
            let Some(name) = e.object_ref.as_ref().map(|o| o.name.clone()) else {
                continue;
            };
            if e.stage != "ResponseComplete" || !e.succeeded() || !name.starts_with(set) {
                continue;
            }
            let (Some(received), Ok(done)) = (e.received(), e.stage_timestamp.parse()) else {
                continue;
            };
            match (e.verb.as_str(), e.resource().as_str()) {
                ("create", "nodes") => {
                    created.insert(name, (received, done));
                }
                ("patch" | "update", "nodes" | "nodes/status") if e.user_agent.contains(ua) => {
                    written.entry(name).or_insert((received, done));
                }
                _ => {}
            }
        }
        let span =
            |a: jiff::Timestamp, b: jiff::Timestamp| Duration::try_from(b.duration_since(a)).ok();
        let mut out = ServerSpans::default();
        for (name, (c0, c1)) in &created {
            let Some((w0, w1)) = written.get(name) else {
                continue;
            };
            let spans = (
                span(*c0, *w1),
                span(*c0, *c1),
                span(*c1, *w0),
                span(*w0, *w1),
            );
            if let (Some(total), Some(create), Some(reaction), Some(write)) = spans {
                out.create_to_write.push(total);
                out.create_in_server.push(create);
                out.created_to_write_received.push(reaction);
                out.write_in_server.push(write);
            }
        }
        for series in [
            &mut out.create_to_write,
            &mut out.create_in_server,
            &mut out.created_to_write_received,
            &mut out.write_in_server,
        ] {
            series.sort();
        }
        out
    }
}

/// Per Node created during a run, spans on the API server's clock from its audit log, each sorted.
#[derive(Debug, Clone, Default)]
pub struct ServerSpans {
    /// Create received → the contender's first Node write done.
    pub create_to_write: Vec<Duration>,
    /// Create received → create done: the create's own write.
    pub create_in_server: Vec<Duration>,
    /// Create done → the contender's write received: the watch delivering the Node to the contender, its
    /// queue and decision, and its client.
    pub created_to_write_received: Vec<Duration>,
    /// The contender's write received → done: the API server's share of the allocation.
    pub write_in_server: Vec<Duration>,
}

/// How many times kube-apiserver has checked its watch cache of Nodes against etcd, from its /metrics;
/// 0 if they cannot be read. Each check (`DetectCacheInconsistency`, on by default since 1.34, every 5
/// to 10 minutes) lists every Node from etcd — seconds of CPU at 50,000 Nodes — so a run it falls in
/// is slower for a reason none of its contenders caused.
pub async fn node_cache_checks(client: &kube::Client) -> u64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a GET of /metrics");
    match client.request_text(request).await {
        Ok(text) => node_cache_checks_in(&text),
        Err(e) => {
            eprintln!("[bench] kube-apiserver's /metrics not read: {e}");
            0
        }
    }
}

/// [`node_cache_checks`] of a Prometheus text exposition: every status of the core group's `nodes`.
fn node_cache_checks_in(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("apiserver_storage_consistency_checks_total{"))
        .filter_map(|l| l.split_once("} "))
        .filter(|(labels, _)| {
            let labels: Vec<&str> = labels.split(',').collect();
            labels.contains(&"group=\"\"") && labels.contains(&"resource=\"nodes\"")
        })
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The `p` quantile (0..=1) of sorted samples, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Milliseconds, one decimal.
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_checks_of_nodes_are_summed_over_their_statuses_and_no_other_resource_counts() {
        let metrics = r#"# TYPE apiserver_storage_consistency_checks_total counter
apiserver_storage_consistency_checks_total{group="",resource="configmaps",status="success"} 7
apiserver_storage_consistency_checks_total{group="",resource="nodes",status="success"} 3
apiserver_storage_consistency_checks_total{group="",resource="nodes",status="error"} 1
apiserver_storage_consistency_checks_total{group="example.io",resource="nodes",status="success"} 5
apiserver_storage_consistency_checks_total_other{group="",resource="nodes",status="success"} 9
"#;
        assert_eq!(node_cache_checks_in(metrics), 4);
        assert_eq!(node_cache_checks_in("no metric here\n"), 0);
    }

    fn event(verb: &str, name: &str, ua: &str, received: &str, done: &str) -> String {
        serde_json::json!({
            "stage": "ResponseComplete", "verb": verb, "userAgent": ua,
            "objectRef": {"resource": "nodes", "name": name},
            "responseStatus": {"code": 200},
            "requestReceivedTimestamp": received, "stageTimestamp": done,
        })
        .to_string()
    }

    #[test]
    fn a_create_to_write_span_is_split_into_the_create_the_reaction_and_the_write() {
        let dir = std::env::temp_dir().join(format!("bench-spans-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let lines = [
            event(
                "create",
                "set-00001",
                "bench/",
                "2026-11-28T00:00:00.000000Z",
                "2026-11-28T00:00:00.010000Z",
            ),
            event(
                "patch",
                "set-00001",
                "netcm/1",
                "2026-11-28T00:00:00.040000Z",
                "2026-11-28T00:00:00.045000Z",
            ),
            // A later write of the same Node is not the allocation.
            event(
                "patch",
                "set-00001",
                "netcm/1",
                "2026-11-28T00:00:01.000000Z",
                "2026-11-28T00:00:01.500000Z",
            ),
            // Another set's Node, and a Node the contender never wrote, are left out.
            event(
                "create",
                "other-00001",
                "bench/",
                "2026-11-28T00:00:00.000000Z",
                "2026-11-28T00:00:00.001000Z",
            ),
            event(
                "create",
                "set-00002",
                "bench/",
                "2026-11-28T00:00:00.000000Z",
                "2026-11-28T00:00:00.001000Z",
            ),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let mark = AuditMark { path, offset: 0 };
        let spans = mark.create_to_write("set-", "netcm/");
        let ms = |v: &[Duration]| v.iter().map(|d| d.as_millis()).collect::<Vec<_>>();
        assert_eq!(ms(&spans.create_to_write), [45]);
        assert_eq!(ms(&spans.create_in_server), [10]);
        assert_eq!(ms(&spans.created_to_write_received), [30]);
        assert_eq!(ms(&spans.write_in_server), [5]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
