//! The audit logs of both API servers, read from where they were at the start of the campaign: the
//! Lease's terms (who held it, from when, until when) and every netcm write judged against its writer's
//! terms.
//!
//! A term is a run of successful writes of netcm's Lease by one identity (the user agent ends with the
//! leader-election identity: `netcm/<version> (<os>/<arch>) <identity>`), in the order the API servers
//! completed them. It ends, by the fence rule in `docs/safety.md`, a lease duration after its last
//! renewal was sent — the renewal's `renewTime`, as the checker's Lease reads saw it (the audit log's
//! receive time of the last renewal when the reads missed it) — or at the release, when the holder gave
//! the Lease up (the checker saw it with no holder). A write of the identity received by an API server
//! after its term's end is a late landed write; one received within the term but answered after its
//! end is a late completion (it may have been committed in time, so it is reported, not failed). A late
//! landed write that landed once another identity's term had begun (or by a writer that never led) is
//! a stale write: that is what the campaign fails on (`docs/chaos.md` says why the rest are counted, not
//! failed).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use netcm_e2e::audit::AuditEvent;
use netcm_e2e::{LEASE_NAME, LEASE_NAMESPACE};

use crate::checker::Seen;

/// Where one audit log was when the campaign started.
#[derive(Debug, Clone)]
pub struct Mark {
    pub path: PathBuf,
    pub offset: u64,
}

impl Mark {
    /// The end of `path` now (0 if it does not exist yet).
    pub fn now(path: &Path) -> Mark {
        Mark {
            path: path.to_path_buf(),
            offset: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        }
    }
}

/// A completed write of a netcm process, from one server's audit log.
#[derive(Debug, Clone)]
pub struct Write {
    /// 1 or 2.
    pub server: usize,
    pub identity: String,
    pub verb: String,
    pub resource: String,
    pub name: String,
    pub code: u16,
    pub received: jiff::Timestamp,
    pub completed: jiff::Timestamp,
}

/// The leader-election identity in a netcm user agent (standby work has none).
pub fn identity_of(user_agent: &str) -> Option<&str> {
    if !user_agent.starts_with("netcm/") {
        return None;
    }
    let id = user_agent.rsplit(' ').next()?;
    (id != "standby" && id.contains('_')).then_some(id)
}

/// Every completed write of a netcm process since the marks.
pub fn read(marks: &[Mark; 2]) -> Result<Vec<Write>, String> {
    let mut out = Vec::new();
    for (i, mark) in marks.iter().enumerate() {
        let mut file = std::fs::File::open(&mark.path)
            .map_err(|e| format!("open {}: {e}", mark.path.display()))?;
        file.seek(SeekFrom::Start(mark.offset))
            .map_err(|e| format!("seek {}: {e}", mark.path.display()))?;
        for line in BufReader::new(file).lines() {
            let Ok(line) = line else { break };
            let Ok(e) = serde_json::from_str::<AuditEvent>(&line) else {
                continue;
            };
            if e.stage != "ResponseComplete"
                || !matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")
            {
                continue;
            }
            let Some(identity) = identity_of(&e.user_agent) else {
                continue;
            };
            let (Some(received), Ok(completed)) = (e.received(), e.stage_timestamp.parse()) else {
                continue;
            };
            let obj = e.object_ref.clone();
            let is_lease = obj
                .as_ref()
                .is_some_and(|o| o.namespace == LEASE_NAMESPACE && o.name == LEASE_NAME);
            let resource = e.resource();
            if resource == "leases" && !is_lease {
                continue;
            }
            out.push(Write {
                server: i + 1,
                identity: identity.to_string(),
                verb: e.verb.clone(),
                resource,
                name: obj.map(|o| o.name).unwrap_or_default(),
                code: e.response_status.as_ref().map(|s| s.code).unwrap_or(0),
                received,
                completed,
            });
        }
    }
    out.sort_by_key(|w| w.completed);
    Ok(out)
}

/// One term of the Lease.
#[derive(Debug, Clone)]
pub struct Term {
    pub identity: String,
    /// When the acquiring write was received.
    pub start: jiff::Timestamp,
    /// When another may lead (None: still held at the end of the campaign).
    pub end: Option<jiff::Timestamp>,
    pub released: bool,
}

/// The terms in order, from the successful Lease writes and what the checker saw of the Lease.
pub fn terms(writes: &[Write], seen: &Seen, lease: Duration) -> Vec<Term> {
    let lease = jiff::SignedDuration::try_from(lease).unwrap_or(jiff::SignedDuration::ZERO);
    let released: Vec<String> = seen
        .changes()
        .into_iter()
        .filter(|c| c.to.is_none())
        .filter_map(|c| c.from)
        .collect();
    let mut runs: Vec<(String, jiff::Timestamp, jiff::Timestamp)> = Vec::new();
    for w in writes
        .iter()
        .filter(|w| w.resource == "leases" && (200..300).contains(&w.code))
    {
        match runs.last_mut() {
            Some((id, _, last)) if *id == w.identity => *last = w.received,
            _ => runs.push((w.identity.clone(), w.received, w.received)),
        }
    }
    let n = runs.len();
    runs.into_iter()
        .enumerate()
        .map(|(i, (identity, start, last))| {
            let released = released.contains(&identity);
            let end = if i + 1 == n && !released {
                None
            } else if released {
                Some(last)
            } else {
                let renewed = seen.renewals.get(&identity).copied().unwrap_or(last);
                Some(renewed + lease)
            };
            Term {
                identity,
                start,
                end,
                released,
            }
        })
        .collect()
}

/// A write judged against its writer's terms.
#[derive(Debug, Clone)]
pub struct Late {
    pub write: Write,
    /// The end of the writer's last term before the write (None: it never led before it).
    pub term_end: Option<jiff::Timestamp>,
    /// For a Node write: when a Node watch first saw the Node with pod CIDRs.
    pub seen: Option<jiff::Timestamp>,
    /// It landed once another identity's term had begun after the writer's own (or the writer never
    /// led): a stale write, not only a late one.
    pub after_successor: bool,
}

/// (late landed writes, late completions): successful non-Lease writes received after their writer's
/// term ended (or by a writer that never led), and those received in time but answered after the end.
/// A late completion on a Node that a Node watch first saw with pod CIDRs only after the term ended
/// (`cidrs_seen`) landed late too: the write that gave them was committed after the end.
pub fn late_writes(
    writes: &[Write],
    terms: &[Term],
    cidrs_seen: &HashMap<String, jiff::Timestamp>,
) -> (Vec<Late>, Vec<Late>) {
    let mut by_id: HashMap<&str, Vec<&Term>> = HashMap::new();
    for t in terms {
        by_id.entry(t.identity.as_str()).or_default().push(t);
    }
    let within = |ts: &[&Term], at: jiff::Timestamp| {
        ts.iter()
            .any(|t| t.start <= at && t.end.is_none_or(|end| at <= end))
    };
    // Whether `identity`, whose own terms are `ts`, wrote at `landed` after another identity's term
    // began following its last one.
    let after_successor = |identity: &str, ts: &[&Term], landed: jiff::Timestamp| {
        let Some(own) = ts.iter().map(|t| t.start).filter(|s| *s <= landed).max() else {
            return true;
        };
        terms
            .iter()
            .any(|t| t.identity != identity && t.start > own && t.start <= landed)
    };
    let (mut landed, mut completed) = (Vec::new(), Vec::new());
    for w in writes
        .iter()
        .filter(|w| w.resource != "leases" && (200..300).contains(&w.code))
    {
        let ts = by_id
            .get(w.identity.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let term_end = ts
            .iter()
            .filter(|t| t.start <= w.received)
            .filter_map(|t| t.end)
            .max();
        let seen = w
            .resource
            .starts_with("nodes")
            .then(|| cidrs_seen.get(&w.name).copied())
            .flatten();
        if !within(ts, w.received) {
            landed.push(Late {
                write: w.clone(),
                term_end,
                seen,
                after_successor: after_successor(&w.identity, ts, w.received),
            });
        } else if !within(ts, w.completed) {
            // Seen after the term's end, between receipt and answer (or the watch's delay after it):
            // that is when it landed.
            let answered = w.completed + jiff::SignedDuration::from_secs(1);
            let landed_at =
                seen.filter(|at| *at >= w.received && *at <= answered && !within(ts, *at));
            let late = Late {
                write: w.clone(),
                term_end: ts.iter().filter_map(|t| t.end).max(),
                seen,
                after_successor: landed_at.is_some_and(|at| after_successor(&w.identity, ts, at)),
            };
            if landed_at.is_some() {
                landed.push(late);
            } else {
                completed.push(late);
            }
        }
    }
    (landed, completed)
}

/// Takeovers that came before the previous term ended (not after a release): (previous, next).
pub fn early_takeovers(terms: &[Term]) -> Vec<(Term, Term)> {
    terms
        .windows(2)
        .filter(|p| !p[0].released)
        .filter(|p| p[0].end.is_some_and(|end| p[1].start < end))
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{early_takeovers, identity_of, late_writes, terms, Write};
    use crate::checker::Seen;

    fn at(secs: f64) -> jiff::Timestamp {
        jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs_f64(1_000.0 + secs)
    }

    fn write(identity: &str, resource: &str, received: f64, completed: f64) -> Write {
        Write {
            server: 1,
            identity: identity.into(),
            verb: "patch".into(),
            resource: resource.into(),
            name: "n".into(),
            code: 200,
            received: at(received),
            completed: at(completed),
        }
    }

    #[test]
    fn a_write_received_after_its_writers_term_ended_landed_late() {
        // a_1 holds the Lease from 0, renews at 1 and 2, so its term ends at 2 + 4; b_2 takes over at 7.
        let mut writes = vec![
            write("a_1", "leases", 0.0, 0.0),
            write("a_1", "leases", 1.0, 1.0),
            write("a_1", "leases", 2.0, 2.0),
            write("b_2", "leases", 7.0, 7.0),
            write("a_1", "nodes", 5.0, 5.1),
            write("a_1", "nodes", 5.9, 6.2),
            write("a_1", "nodes", 6.5, 6.6),
            write("c_3", "nodes", 3.0, 3.0),
            write("b_2", "nodes", 8.0, 8.0),
        ];
        writes.sort_by_key(|w| w.completed);
        let mut seen = Seen::default();
        seen.renewals.insert("a_1".into(), at(2.0));
        seen.versions.insert(1, Some("a_1".into()));
        seen.versions.insert(5, Some("b_2".into()));
        let ts = terms(&writes, &seen, Duration::from_secs(4));
        assert_eq!(ts.len(), 2);
        assert_eq!(ts[0].end, Some(at(6.0)));
        assert_eq!(ts[1].end, None);
        let (landed, completed) = late_writes(&writes, &ts, &Default::default());
        let received: Vec<(String, jiff::Timestamp)> = landed
            .iter()
            .map(|l| (l.write.identity.clone(), l.write.received))
            .collect();
        assert_eq!(
            received,
            vec![("c_3".to_string(), at(3.0)), ("a_1".to_string(), at(6.5))]
        );
        // c_3 never led: stale. a_1's write at 6.5 came after its term, before b_2's began at 7.
        let stale: Vec<bool> = landed.iter().map(|l| l.after_successor).collect();
        assert_eq!(stale, vec![true, false]);
        assert_eq!(completed.len(), 1);
        assert_eq!(completed[0].write.received, at(5.9));
        assert!(early_takeovers(&ts).is_empty());

        // The late completion's Node got its CIDRs after the term's end: it landed late.
        let seen_at = [("n".to_string(), at(6.1))].into();
        let (landed, completed) = late_writes(&writes, &ts, &seen_at);
        assert_eq!(landed.len(), 3);
        assert!(landed.iter().any(|l| l.write.received == at(5.9)));
        assert!(completed.is_empty());
    }

    #[test]
    fn a_write_that_lands_once_a_successor_leads_is_stale_and_one_before_is_only_late() {
        // a_1's term ends at 2 + 4 = 6; b_2 takes over at 7; a_1 leads again from 20.
        let mut writes = vec![
            write("a_1", "leases", 0.0, 0.0),
            write("a_1", "leases", 2.0, 2.0),
            write("b_2", "leases", 7.0, 7.0),
            write("b_2", "leases", 9.0, 9.0),
            write("a_1", "leases", 20.0, 20.0),
            write("a_1", "nodes", 6.5, 6.6),
            write("a_1", "nodes", 7.5, 7.6),
            write("a_1", "nodes", 21.0, 21.0),
        ];
        writes.sort_by_key(|w| w.completed);
        let mut seen = Seen::default();
        seen.renewals.insert("a_1".into(), at(2.0));
        seen.renewals.insert("b_2".into(), at(9.0));
        seen.versions.insert(1, Some("a_1".into()));
        seen.versions.insert(5, Some("b_2".into()));
        seen.versions.insert(9, Some("a_1".into()));
        let ts = terms(&writes, &seen, Duration::from_secs(4));
        let (landed, _) = late_writes(&writes, &ts, &Default::default());
        let judged: Vec<(jiff::Timestamp, bool)> = landed
            .iter()
            .map(|l| (l.write.received, l.after_successor))
            .collect();
        // The write at 21 is inside a_1's second term: neither late nor stale.
        assert_eq!(judged, vec![(at(6.5), false), (at(7.5), true)]);
    }

    #[test]
    fn a_release_ends_the_term_at_once_and_an_early_takeover_is_found_otherwise() {
        let writes = vec![
            write("a_1", "leases", 0.0, 0.0),
            write("a_1", "leases", 1.0, 1.0),
            write("b_2", "leases", 1.5, 1.5),
            write("b_2", "leases", 2.0, 2.0),
            write("c_3", "leases", 3.0, 3.0),
        ];
        let mut seen = Seen::default();
        seen.renewals.insert("a_1".into(), at(0.5));
        seen.renewals.insert("b_2".into(), at(2.0));
        // a_1 released (a version with no holder after its own); b_2 did not.
        seen.versions.insert(1, Some("a_1".into()));
        seen.versions.insert(2, None);
        seen.versions.insert(3, Some("b_2".into()));
        seen.versions.insert(4, Some("c_3".into()));
        let ts = terms(&writes, &seen, Duration::from_secs(4));
        assert!(ts[0].released);
        assert_eq!(ts[0].end, Some(at(1.0)));
        let early = early_takeovers(&ts);
        assert_eq!(early.len(), 1);
        assert_eq!(
            (early[0].0.identity.as_str(), early[0].1.identity.as_str()),
            ("b_2", "c_3")
        );
    }

    #[test]
    fn the_identity_is_the_last_word_of_a_netcm_user_agent() {
        assert_eq!(
            identity_of("netcm/0.1.0 (linux/x86_64) host_1b2c-3d"),
            Some("host_1b2c-3d")
        );
        assert_eq!(identity_of("netcm/0.1.0 standby"), None);
        assert_eq!(
            identity_of("kubectl/v1.33.0 (linux/amd64) kubernetes/abc"),
            None
        );
    }
}
