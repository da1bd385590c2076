//! What fails a run: a pure function over the run's counts, so each rule is held by a unit test and the
//! exit status cannot drift from what the report says.
//!
//! A finding is either a safety violation (an overlap, a stale write, an early takeover, a Node left
//! without CIDRs, a pod CIDR the checker cannot read) or evidence that the campaign did not test what it
//! claims (the final list failed everywhere, a fault did not apply, the Lease never changed hands, the
//! checker never listed, the audit logs gave no terms). A run with the second kind proves nothing, so it
//! fails too: otherwise an allocator that stops allocating, or a checker that sees nothing, would pass.

use std::collections::BTreeMap;
use std::fmt;

use crate::faults::Kind;

/// The Nodes the last list after the settle period found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodesAtEnd {
    Listed {
        total: usize,
        without_cidrs: usize,
    },
    /// Neither API server answered the list: nothing is known about the Nodes.
    ListFailed,
}

/// The numbers the verdict is taken on.
#[derive(Debug, Clone, PartialEq)]
pub struct Counts {
    pub overlaps: usize,
    pub stale_writes: usize,
    pub early_takeovers: usize,
    pub unparsable_cidrs: usize,
    pub nodes_at_end: NodesAtEnd,
    pub settle_secs: f64,
    pub faults: usize,
    pub failed_faults: BTreeMap<Kind, usize>,
    /// Lease terms read from the audit logs.
    pub terms: usize,
    /// netcm writes read from the audit logs.
    pub writes: usize,
    pub lists: u64,
    pub failed_lists: u64,
    /// Stopped by SIGINT/SIGTERM: no settle period was waited for.
    pub interrupted: bool,
}

impl Counts {
    /// Lease holder changes: every term after the first.
    pub fn leader_changes(&self) -> usize {
        self.terms.saturating_sub(1)
    }
}

/// One reason the run fails.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    Overlaps(usize),
    StaleWrites(usize),
    EarlyTakeovers(usize),
    UnparsableCidrs(usize),
    NodesWithoutCidrs {
        without: usize,
        total: usize,
        settle_secs: f64,
    },
    FinalListFailed {
        settle_secs: f64,
    },
    FaultsNotApplied {
        failed: BTreeMap<Kind, usize>,
        faults: usize,
    },
    NoLeaderChanges {
        terms: usize,
        faults: usize,
    },
    NoCheckerLists {
        failed: u64,
    },
    NoTerms {
        writes: usize,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Overlaps(n) => write!(
                f,
                "FAIL overlaps: {n} pair(s) of Nodes seen holding overlapping pod CIDRs at once"
            ),
            Finding::StaleWrites(n) => write!(
                f,
                "FAIL stale writes: {n} netcm write(s) landed after the writer's term, once a successor led"
            ),
            Finding::EarlyTakeovers(n) => write!(
                f,
                "FAIL early takeovers: {n} Lease takeover(s) before the previous term's end, not after a release (an election bug)"
            ),
            Finding::UnparsableCidrs(n) => write!(
                f,
                "FAIL unparsable pod CIDRs: {n} pod CIDR(s) on Nodes did not parse, so the overlap check could not judge them"
            ),
            Finding::NodesWithoutCidrs {
                without,
                total,
                settle_secs,
            } => write!(
                f,
                "FAIL Nodes without CIDRs: {without} of {total} Nodes had no pod CIDRs after the settle period ({settle_secs:.1} s)"
            ),
            Finding::FinalListFailed { settle_secs } => write!(
                f,
                "FAIL final Node list: it failed on every API server after the settle period ({settle_secs:.1} s); no Node could be checked for CIDRs"
            ),
            Finding::FaultsNotApplied { failed, faults } => {
                let total: usize = failed.values().sum();
                let kinds: Vec<String> = failed
                    .iter()
                    .map(|(k, n)| format!("{} {n}", k.name()))
                    .collect();
                write!(
                    f,
                    "FAIL faults not applied: {total} of {faults} fault(s) failed to apply ({})",
                    kinds.join(", ")
                )
            }
            Finding::NoLeaderChanges { terms, faults } => write!(
                f,
                "FAIL no leader changes: 0 Lease holder changes ({terms} term(s) in the audit logs) under {faults} fault(s); no takeover was tested"
            ),
            Finding::NoCheckerLists { failed } => write!(
                f,
                "FAIL no checker lists: 0 Node lists succeeded ({failed} failed or timed out); the list check saw nothing"
            ),
            Finding::NoTerms { writes } => write!(
                f,
                "FAIL no terms: 0 Lease terms read from the audit logs ({writes} netcm write(s) read); no write could be judged against its term"
            ),
        }
    }
}

/// Every finding of a run, in the order the report prints them; empty: the run passes.
pub fn findings(c: &Counts) -> Vec<Finding> {
    let mut out = Vec::new();
    if c.overlaps > 0 {
        out.push(Finding::Overlaps(c.overlaps));
    }
    if c.stale_writes > 0 {
        out.push(Finding::StaleWrites(c.stale_writes));
    }
    if c.early_takeovers > 0 {
        out.push(Finding::EarlyTakeovers(c.early_takeovers));
    }
    if c.unparsable_cidrs > 0 {
        out.push(Finding::UnparsableCidrs(c.unparsable_cidrs));
    }
    // An interrupted run skipped the settle period, so Nodes still waiting for CIDRs say nothing.
    if !c.interrupted {
        match c.nodes_at_end {
            NodesAtEnd::Listed {
                without_cidrs: 0, ..
            } => {}
            NodesAtEnd::Listed {
                total,
                without_cidrs,
            } => out.push(Finding::NodesWithoutCidrs {
                without: without_cidrs,
                total,
                settle_secs: c.settle_secs,
            }),
            NodesAtEnd::ListFailed => out.push(Finding::FinalListFailed {
                settle_secs: c.settle_secs,
            }),
        }
    }
    let failed: BTreeMap<Kind, usize> = c
        .failed_faults
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| (*k, *n))
        .collect();
    if !failed.is_empty() {
        out.push(Finding::FaultsNotApplied {
            failed,
            faults: c.faults,
        });
    }
    if c.leader_changes() == 0 {
        out.push(Finding::NoLeaderChanges {
            terms: c.terms,
            faults: c.faults,
        });
    }
    if c.lists == 0 {
        out.push(Finding::NoCheckerLists {
            failed: c.failed_lists,
        });
    }
    if c.terms == 0 {
        out.push(Finding::NoTerms { writes: c.writes });
    }
    out
}

/// One line per finding, or the line that says there is none.
pub fn lines(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "PASS: no finding\n".into();
    }
    findings.iter().map(|f| format!("{f}\n")).collect()
}

/// The exit status: 130 when interrupted (whatever was found), 1 on any finding, else 0.
pub fn exit_status(findings: &[Finding], interrupted: bool) -> u8 {
    if interrupted {
        130
    } else if findings.is_empty() {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{exit_status, findings, lines, Counts, Finding, NodesAtEnd};
    use crate::faults::Kind;

    /// A run that found nothing: Nodes all allocated, faults applied, the Lease moved, the checker and
    /// the audit logs saw the run.
    fn clean() -> Counts {
        Counts {
            overlaps: 0,
            stale_writes: 0,
            early_takeovers: 0,
            unparsable_cidrs: 0,
            nodes_at_end: NodesAtEnd::Listed {
                total: 120,
                without_cidrs: 0,
            },
            settle_secs: 3.0,
            faults: 21,
            failed_faults: BTreeMap::from([(Kind::LeaderKill, 0)]),
            terms: 16,
            writes: 2_000,
            lists: 240,
            failed_lists: 3,
            interrupted: false,
        }
    }

    /// Asserts that `c` fails with a finding `is` matches, and that the clean run has none like it.
    fn fails_with(c: &Counts, is: impl Fn(&Finding) -> bool) -> Finding {
        let clean = findings(&clean());
        assert!(clean.is_empty(), "the clean run has findings: {clean:?}");
        let found = findings(c);
        let Some(f) = found.iter().find(|f| is(f)) else {
            panic!("no such finding in {found:?}");
        };
        assert_eq!(exit_status(&found, false), 1);
        f.clone()
    }

    #[test]
    fn a_clean_run_has_no_finding_and_exits_zero() {
        assert_eq!(findings(&clean()), []);
        assert_eq!(exit_status(&findings(&clean()), false), 0);
        assert_eq!(lines(&findings(&clean())), "PASS: no finding\n");
    }

    #[test]
    fn an_overlap_fails_the_run() {
        let c = Counts {
            overlaps: 1,
            ..clean()
        };
        let f = fails_with(&c, |f| matches!(f, Finding::Overlaps(1)));
        assert!(f.to_string().contains("1 pair(s)"), "{f}");
        assert_eq!(lines(&findings(&c)), format!("{f}\n"));
    }

    #[test]
    fn a_stale_write_fails_the_run() {
        let c = Counts {
            stale_writes: 2,
            ..clean()
        };
        let f = fails_with(&c, |f| matches!(f, Finding::StaleWrites(2)));
        assert!(f.to_string().contains("2 netcm write(s)"), "{f}");
    }

    #[test]
    fn an_early_takeover_fails_the_run() {
        let c = Counts {
            early_takeovers: 1,
            ..clean()
        };
        let f = fails_with(&c, |f| matches!(f, Finding::EarlyTakeovers(1)));
        assert!(f.to_string().contains("election bug"), "{f}");
    }

    #[test]
    fn a_pod_cidr_the_checker_cannot_parse_fails_the_run() {
        let c = Counts {
            unparsable_cidrs: 1,
            ..clean()
        };
        let f = fails_with(&c, |f| matches!(f, Finding::UnparsableCidrs(1)));
        assert!(f.to_string().contains("1 pod CIDR(s)"), "{f}");
    }

    #[test]
    fn a_node_left_without_cidrs_after_the_settle_period_fails_the_run() {
        let c = Counts {
            nodes_at_end: NodesAtEnd::Listed {
                total: 120,
                without_cidrs: 1,
            },
            settle_secs: 90.0,
            ..clean()
        };
        let f = fails_with(&c, |f| {
            matches!(
                f,
                Finding::NodesWithoutCidrs {
                    without: 1,
                    total: 120,
                    ..
                }
            )
        });
        assert!(f.to_string().contains("1 of 120 Nodes"), "{f}");
    }

    #[test]
    fn a_final_list_that_failed_on_every_api_server_fails_the_run_instead_of_reading_zero_of_zero()
    {
        let c = Counts {
            nodes_at_end: NodesAtEnd::ListFailed,
            ..clean()
        };
        let f = fails_with(&c, |f| matches!(f, Finding::FinalListFailed { .. }));
        assert!(f.to_string().contains("every API server"), "{f}");
        assert!(!f.to_string().contains("0 of 0"), "{f}");
    }

    #[test]
    fn a_fault_that_failed_to_apply_fails_the_run_and_is_counted_by_kind() {
        let c = Counts {
            failed_faults: BTreeMap::from([(Kind::Path, 2), (Kind::EtcdStop, 1)]),
            ..clean()
        };
        let f = fails_with(&c, |f| matches!(f, Finding::FaultsNotApplied { .. }));
        assert_eq!(
            f.to_string(),
            "FAIL faults not applied: 3 of 21 fault(s) failed to apply (etcd-stop 1, path 2)"
        );
    }

    #[test]
    fn a_campaign_without_a_leader_change_fails_the_run() {
        let c = Counts {
            terms: 1,
            ..clean()
        };
        fails_with(&c, |f| {
            matches!(
                f,
                Finding::NoLeaderChanges {
                    terms: 1,
                    faults: 21
                }
            )
        });
        assert!(!findings(&c)
            .iter()
            .any(|f| matches!(f, Finding::NoTerms { .. })));
    }

    #[test]
    fn a_checker_with_no_successful_list_fails_the_run() {
        let c = Counts {
            lists: 0,
            failed_lists: 240,
            ..clean()
        };
        let f = fails_with(&c, |f| matches!(f, Finding::NoCheckerLists { failed: 240 }));
        assert!(f.to_string().contains("240 failed"), "{f}");
    }

    #[test]
    fn no_term_read_from_the_audit_logs_fails_the_run() {
        let c = Counts {
            terms: 0,
            ..clean()
        };
        fails_with(&c, |f| matches!(f, Finding::NoTerms { writes: 2_000 }));
    }

    #[test]
    fn an_interrupted_run_exits_130_and_is_not_failed_for_nodes_it_did_not_wait_for() {
        let c = Counts {
            nodes_at_end: NodesAtEnd::Listed {
                total: 120,
                without_cidrs: 7,
            },
            interrupted: true,
            ..clean()
        };
        assert_eq!(findings(&c), []);
        let c = Counts { overlaps: 1, ..c };
        assert_eq!(exit_status(&findings(&c), true), 130);
    }
}
