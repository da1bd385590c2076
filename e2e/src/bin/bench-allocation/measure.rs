//! What a run reads off the machine: a process's memory and CPU from /proc (`netcm_e2e::proc_stats`),
//! and the writes a contender made from the API server's audit log.

use std::collections::HashMap;
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::time::Duration;

use netcm_e2e::audit::AuditEvent;

pub use netcm_e2e::proc_stats::{proc_stats, ProcStats};

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
    /// For each Node of `set` created since the mark: from the API server receiving its create to the
    /// contender's (`ua`) first successful Node write completing, on the API server's clock (audit
    /// timestamps are in microseconds), so neither the bench's watch nor its client enters.
    pub fn create_to_write(&self, set: &str, ua: &str) -> Vec<Duration> {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut created: HashMap<String, jiff::Timestamp> = HashMap::new();
        let mut written: HashMap<String, jiff::Timestamp> = HashMap::new();
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
            match (e.verb.as_str(), e.resource().as_str()) {
                ("create", "nodes") => {
                    if let Some(t) = e.received() {
                        created.insert(name, t);
                    }
                }
                ("patch" | "update", "nodes" | "nodes/status") if e.user_agent.contains(ua) => {
                    if let Ok(t) = e.stage_timestamp.parse::<jiff::Timestamp>() {
                        written.entry(name).or_insert(t);
                    }
                }
                _ => {}
            }
        }
        let mut out: Vec<Duration> = created
            .iter()
            .filter_map(|(name, t0)| {
                let t1 = written.get(name)?;
                Duration::try_from(t1.duration_since(*t0)).ok()
            })
            .collect();
        out.sort();
        out
    }
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
