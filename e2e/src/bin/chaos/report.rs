//! The campaign's report: the table (what `hack/chaos.sh` exists to print) and, for every overlap and late
//! landed write, what is needed to chase it: the Nodes, their CIDRs, every netcm write on them, the
//! replica, API server and configuration behind each write, and the faults just before.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::checker::{Overlap, Unparsable};
use crate::faults::{Kind, Outcome, Record};
use crate::replicas::Start;
use crate::terms::{Late, Term, Write};
use crate::verdict::{self, Counts, Finding, NodesAtEnd};
use crate::workload::Stats;
use netcm_e2e::api_path::Mechanism;

/// Everything the report says.
pub struct Summary {
    pub seed: u64,
    pub minutes: f64,
    pub kinds: Vec<Kind>,
    pub mechanism: Mechanism,
    pub started: jiff::Timestamp,
    pub faults: Vec<Record>,
    pub terms: Vec<Term>,
    pub sampled_changes: usize,
    pub overlaps: Vec<Overlap>,
    pub late: Vec<Late>,
    pub late_completions: Vec<Late>,
    pub early: Vec<(Term, Term)>,
    pub unparsable: Vec<Unparsable>,
    /// The last Node list after the settle period; None: it failed on every API server.
    pub final_list: Option<FinalList>,
    pub settle_secs: f64,
    pub workload: Stats,
    pub revived: usize,
    pub starts: Vec<Start>,
    pub writes: Vec<Write>,
    pub lists: (u64, u64),
    /// Stopped by SIGINT/SIGTERM: fewer minutes than asked, and no settle.
    pub interrupted: bool,
}

/// What the last Node list after the settle period held.
#[derive(Debug, Clone)]
pub struct FinalList {
    pub total: usize,
    pub without_cidrs: Vec<String>,
}

impl Summary {
    /// The numbers the verdict is taken on.
    pub fn counts(&self) -> Counts {
        let mut failed_faults: BTreeMap<Kind, usize> = BTreeMap::new();
        for f in self.faults.iter().filter(|f| f.outcome.failed()) {
            *failed_faults.entry(f.kind).or_default() += 1;
        }
        Counts {
            overlaps: self.overlaps.len(),
            stale_writes: self.stale_writes(),
            early_takeovers: self.early.len(),
            unparsable_cidrs: self.unparsable.len(),
            nodes_at_end: match &self.final_list {
                Some(l) => NodesAtEnd::Listed {
                    total: l.total,
                    without_cidrs: l.without_cidrs.len(),
                },
                None => NodesAtEnd::ListFailed,
            },
            settle_secs: self.settle_secs,
            faults: self.faults.len(),
            failed_faults,
            terms: self.terms.len(),
            writes: self.writes.len(),
            lists: self.lists.0,
            failed_lists: self.lists.1,
            interrupted: self.interrupted,
        }
    }

    /// What the run fails on; empty: it passes.
    pub fn findings(&self) -> Vec<Finding> {
        verdict::findings(&self.counts())
    }

    fn failed_faults(&self) -> usize {
        self.faults.iter().filter(|f| f.outcome.failed()).count()
    }

    /// Late landed writes that landed once a successor led: the ones the fence and the quarantine are
    /// there to make harmless, and that the campaign fails on.
    pub fn stale_writes(&self) -> usize {
        self.late.iter().filter(|l| l.after_successor).count()
    }

    /// Lease holder changes: every term after the first.
    pub fn leader_changes(&self) -> usize {
        self.terms.len().saturating_sub(1)
    }

    fn secs(&self, t: jiff::Timestamp) -> String {
        format!("+{:.3}s", t.duration_since(self.started).as_secs_f64())
    }

    fn who(&self, identity: &str) -> String {
        match self.starts.iter().find(|s| s.identity == identity) {
            Some(s) => format!("{} ({}, {})", s.label, s.server, s.variant.name()),
            None => format!("unknown identity {identity}"),
        }
    }

    /// The faults that overlap `[from, to]`.
    fn faults_between(&self, from: jiff::Timestamp, to: jiff::Timestamp) -> Vec<&Record> {
        self.faults
            .iter()
            .filter(|f| f.end >= from && f.start <= to)
            .collect()
    }

    fn fault_lines(&self, out: &mut String, from: jiff::Timestamp, to: jiff::Timestamp) {
        for f in self.faults_between(from, to) {
            let _ = writeln!(
                out,
                "      fault #{} {} {}..{}: {}",
                f.n,
                f.kind.name(),
                self.secs(f.start),
                self.secs(f.end),
                f.outcome
            );
        }
    }

    /// The table.
    pub fn table(&self) -> String {
        let mut by_kind: BTreeMap<Kind, usize> = BTreeMap::new();
        for f in &self.faults {
            *by_kind.entry(f.kind).or_default() += 1;
        }
        let mut out = String::new();
        let row = |out: &mut String, k: &str, v: String| {
            let _ = writeln!(out, "| {k:<52} | {v:>12} |");
        };
        let _ = writeln!(out, "| {:<52} | {:>12} |", "chaos", "");
        let _ = writeln!(out, "|{}|{}|", "-".repeat(54), "-".repeat(14));
        row(&mut out, "seed", self.seed.to_string());
        row(&mut out, "minutes", format!("{:.1}", self.minutes));
        row(
            &mut out,
            "leader changes (Lease holder changes)",
            self.leader_changes().to_string(),
        );
        row(&mut out, "faults", self.faults.len().to_string());
        row(
            &mut out,
            "  of them failed to apply",
            self.failed_faults().to_string(),
        );
        for kind in &self.kinds {
            let n = by_kind.get(kind).copied().unwrap_or(0);
            row(
                &mut out,
                &format!("  {} ({})", kind.name(), kind.what()),
                n.to_string(),
            );
        }
        row(
            &mut out,
            "overlapping pairs ever seen",
            self.overlaps.len().to_string(),
        );
        row(
            &mut out,
            "late landed writes (after the writer's term)",
            self.late.len().to_string(),
        );
        row(
            &mut out,
            "  of them stale (landed once a successor led)",
            self.stale_writes().to_string(),
        );
        row(
            &mut out,
            "takeovers before the previous term's end",
            self.early.len().to_string(),
        );
        row(
            &mut out,
            "unparsable pod CIDRs seen",
            self.unparsable.len().to_string(),
        );
        row(
            &mut out,
            "Nodes without CIDRs at the end",
            match &self.final_list {
                Some(l) => format!("{} of {}", l.without_cidrs.len(), l.total),
                None => "list failed".into(),
            },
        );
        out
    }

    /// The details under the table.
    pub fn details(&self) -> String {
        let mut out = String::new();
        if self.interrupted {
            let _ = writeln!(out, "INTERRUPTED: the campaign stopped early and did not settle; Nodes without CIDRs mean nothing");
        }
        let w = &self.workload;
        let _ = writeln!(
            out,
            "workload: {} Nodes created, {} deleted, {} Node requests failed or timed out; ClusterCIDRs {} created, {} deleted",
            w.nodes_created,
            w.nodes_deleted,
            w.node_requests_failed,
            w.pools_created,
            w.pools_deleted
        );
        let _ = writeln!(
            out,
            "replicas: {} processes started, {} revived after exiting; Lease acquisitions seen by the checker's watches and reads: {} (terms in the audit logs: {})",
            self.starts.len(),
            self.revived,
            self.sampled_changes,
            self.terms.len()
        );
        let _ = writeln!(
            out,
            "checker: {} Node lists ({} failed or timed out) plus a Node watch per API server; settle took {:.1} s",
            self.lists.0, self.lists.1, self.settle_secs
        );
        match &self.mechanism {
            Mechanism::Netem => {
                let _ = writeln!(out, "path faults: tc netem in the replica's namespace");
            }
            Mechanism::RelayAndIptables(why) => {
                let _ = writeln!(
                    out,
                    "path faults: no tc netem here ({why}); delay added by the relay into the replica's namespace, loss by an iptables statistic DROP rule on its loopback"
                );
            }
        }
        let _ = writeln!(
            out,
            "late completions (received within the writer's term, answered after its end; may have committed in time): {}",
            self.late_completions.len()
        );
        for l in self.late_completions.iter().take(10) {
            self.late_line(&mut out, l);
        }
        let _ = writeln!(
            out,
            "takeovers before the previous term's end (not after a release): {}",
            self.early.len()
        );
        for (a, b) in self.early.iter().take(10) {
            let _ = writeln!(
                out,
                "  {} took over at {} from {}, whose term ended {}",
                self.who(&b.identity),
                self.secs(b.start),
                self.who(&a.identity),
                a.end.map(|e| self.secs(e)).unwrap_or_default()
            );
        }
        for l in &self.late {
            let what = if l.after_successor {
                "STALE WRITE (landed once a successor led)"
            } else {
                "LATE LANDED WRITE (after its term, before any successor led)"
            };
            let _ = writeln!(out, "{what}:");
            self.late_line(&mut out, l);
            let from = l.write.received - jiff::SignedDuration::from_secs(20);
            self.fault_lines(&mut out, from, l.write.completed);
        }
        for o in &self.overlaps {
            self.overlap_lines(&mut out, o);
        }
        for f in self.faults.iter().filter(|f| f.outcome.failed()) {
            if let Outcome::Failed(e) = &f.outcome {
                let _ = writeln!(
                    out,
                    "FAULT NOT APPLIED: #{} {} {}..{}: {e}",
                    f.n,
                    f.kind.name(),
                    self.secs(f.start),
                    self.secs(f.end)
                );
            }
        }
        for u in &self.unparsable {
            let _ = writeln!(
                out,
                "UNPARSABLE POD CIDR first seen {} by {}: {} holds {:?}",
                self.secs(u.first_seen),
                u.seen_by,
                u.node,
                u.text
            );
        }
        match &self.final_list {
            Some(l) if !l.without_cidrs.is_empty() => {
                let names: Vec<&str> = l
                    .without_cidrs
                    .iter()
                    .take(20)
                    .map(String::as_str)
                    .collect();
                let _ = writeln!(
                    out,
                    "Nodes without CIDRs at the end (first 20): {}",
                    names.join(", ")
                );
            }
            Some(_) => {}
            None => {
                let _ = writeln!(
                    out,
                    "the last Node list after the settle period failed on every API server"
                );
            }
        }
        out
    }

    fn late_line(&self, out: &mut String, l: &Late) {
        let w = &l.write;
        let _ = writeln!(
            out,
            "  {} {} {} by {} via kube-apiserver {}: received {}, answered {} ({}), term ended {}{}",
            w.verb,
            w.resource,
            w.name,
            self.who(&w.identity),
            w.server,
            self.secs(w.received),
            self.secs(w.completed),
            w.code,
            l.term_end
                .map(|e| self.secs(e))
                .unwrap_or_else(|| "never led".into()),
            l.seen
                .map(|s| format!("; the Node was first seen with pod CIDRs {}", self.secs(s)))
                .unwrap_or_default()
        );
    }

    fn overlap_lines(&self, out: &mut String, o: &Overlap) {
        let _ = writeln!(
            out,
            "OVERLAP first seen {} by {}: {} holds {}, {} holds {}",
            self.secs(o.first_seen),
            o.seen_by,
            o.a.0,
            o.a.1,
            o.b.0,
            o.b.1
        );
        let mut earliest = o.first_seen;
        for node in [&o.a.0, &o.b.0] {
            for w in self
                .writes
                .iter()
                .filter(|w| w.resource.starts_with("nodes") && &w.name == node)
            {
                earliest = earliest.min(w.received);
                let _ = writeln!(
                    out,
                    "    {node}: {} {} by {} via kube-apiserver {}, received {}, answered {} ({})",
                    w.verb,
                    w.resource,
                    self.who(&w.identity),
                    w.server,
                    self.secs(w.received),
                    self.secs(w.completed),
                    w.code
                );
            }
        }
        let from = earliest - jiff::SignedDuration::from_secs(20);
        self.fault_lines(out, from, o.first_seen);
        for t in self
            .terms
            .iter()
            .filter(|t| t.start <= o.first_seen && t.end.is_none_or(|e| e >= from))
        {
            let _ = writeln!(
                out,
                "      term of {} from {} to {}{}",
                self.who(&t.identity),
                self.secs(t.start),
                t.end
                    .map(|e| self.secs(e))
                    .unwrap_or_else(|| "the end".into()),
                if t.released { " (released)" } else { "" }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{FinalList, Summary};
    use crate::faults::{Kind, Outcome, Record};
    use crate::verdict::{Finding, NodesAtEnd};
    use netcm_e2e::api_path::Mechanism;

    fn summary() -> Summary {
        let t = jiff::Timestamp::UNIX_EPOCH;
        let fault = |n, kind, outcome| Record {
            n,
            kind,
            start: t,
            end: t,
            outcome,
        };
        Summary {
            seed: 1,
            minutes: 2.0,
            kinds: vec![Kind::LeaderKill, Kind::EtcdStop],
            mechanism: Mechanism::Netem,
            started: t,
            faults: vec![
                fault(1, Kind::LeaderKill, Outcome::Applied("leader r0".into())),
                fault(2, Kind::EtcdStop, Outcome::Failed("read etcd.pid".into())),
            ],
            terms: Vec::new(),
            sampled_changes: 0,
            overlaps: Vec::new(),
            late: Vec::new(),
            late_completions: Vec::new(),
            early: Vec::new(),
            unparsable: Vec::new(),
            final_list: None,
            settle_secs: 90.0,
            workload: Default::default(),
            revived: 0,
            starts: Vec::new(),
            writes: Vec::new(),
            lists: (0, 5),
            interrupted: false,
        }
    }

    #[test]
    fn a_failed_fault_and_a_failed_final_list_reach_the_verdict_as_counts_not_text() {
        let s = summary();
        let c = s.counts();
        assert_eq!(c.failed_faults, BTreeMap::from([(Kind::EtcdStop, 1)]));
        assert_eq!(c.faults, 2);
        assert_eq!(c.nodes_at_end, NodesAtEnd::ListFailed);
        let findings = s.findings();
        assert!(findings
            .iter()
            .any(|f| matches!(f, Finding::FaultsNotApplied { .. })));
        assert!(findings
            .iter()
            .any(|f| matches!(f, Finding::FinalListFailed { .. })));
        assert!(s.table().contains("list failed"), "{}", s.table());
        assert!(!s.table().contains("0 of 0"), "{}", s.table());

        let listed = Summary {
            final_list: Some(FinalList {
                total: 3,
                without_cidrs: vec!["chaos-000007".into()],
            }),
            ..summary()
        };
        assert_eq!(
            listed.counts().nodes_at_end,
            NodesAtEnd::Listed {
                total: 3,
                without_cidrs: 1
            }
        );
        assert!(crate::verdict::lines(&listed.findings()).contains("1 of 3 Nodes"));
    }
}
