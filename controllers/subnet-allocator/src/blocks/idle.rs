//! Which claims a leader marks idle while it leads (`idle_marks.rs` does the writes). A leader that dies
//! leaves open every claim it did not mark, and its successor quarantines their free CIDRs; marked only
//! at a clean step-down, a kill -9 left every block a leader ever used open, and a successor with a
//! backlog larger than the space outside them touched each Node waiting beyond it (one extra write per
//! Node). Marked while leading, a dead leader leaves open only the blocks it wrote to lately.

use ipnet::IpNet;

use super::{Adoptable, Blocks};

impl Blocks {
    /// The claims to mark idle in this sweep, each with the term it must still name, and starts the next
    /// sweep's window. This term's usable blocks with every write answered, neither taken into use nor
    /// written to since the last sweep, nor written by the latest allocation, are taken out of use until
    /// their claim is adopted again (no PATCH may start while the mark is on its way); listed claims no
    /// earlier write can land in are marked again under this term, the only one its successor trusts.
    pub(crate) fn take_for_idle_marks(&mut self, term: &str) -> Vec<(IpNet, Box<str>)> {
        let earlier: Vec<(IpNet, Box<str>)> = self
            .adoptable
            .iter()
            .filter(|(_, a)| !a.is_idle_by(term))
            .filter_map(|(b, a)| Some((*b, a.term.clone()?)))
            .collect();
        let unused: Vec<IpNet> = self
            .usable
            .iter()
            .filter(|b| {
                self.every_write_answered(b)
                    && !self.used_since_sweep.contains(b)
                    && !self.latest_write.contains(b)
            })
            .copied()
            .collect();
        for block in &unused {
            self.usable.remove(block);
            let mine = Adoptable {
                term: Some(term.into()),
                idle_since: None,
            };
            self.adoptable.insert(*block, mine);
        }
        self.used_since_sweep.clear();
        unused
            .into_iter()
            .map(|b| (b, Box::from(term)))
            .chain(earlier)
            .collect()
    }

    /// The idle mark of `block` landed: its claim names `term` and carries `since`.
    pub(crate) fn marked_idle(&mut self, block: IpNet, term: &str, since: &str) {
        if let Some(a) = self.adoptable.get_mut(&block) {
            a.term = Some(term.into());
            a.idle_since = Some(since.into());
        }
    }

    /// The claim of `block` is gone (404): taken into use again, it is created afresh.
    pub(crate) fn claim_gone(&mut self, block: &IpNet) {
        self.adoptable.remove(block);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::ListedBlock;
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn used(blocks: &[&str]) -> Blocks {
        let mut b = Blocks::start(Vec::new(), HashMap::new());
        for block in blocks {
            b.taken_into_use(net(block));
        }
        b
    }

    #[test]
    fn a_block_taken_into_use_since_the_last_sweep_stays_open_and_goes_idle_at_the_next() {
        let mut b = used(&["10.0.0.0/18"]);
        assert_eq!(b.take_for_idle_marks("t1"), []);
        assert!(b.is_usable(&net("10.0.0.0/18")));
        assert_eq!(
            b.take_for_idle_marks("t1"),
            [(net("10.0.0.0/18"), "t1".into())]
        );
        assert!(
            !b.is_usable(&net("10.0.0.0/18")),
            "no PATCH may start from a block whose idle mark is on its way"
        );
        assert!(b.is_adoptable(&net("10.0.0.0/18")));
    }

    #[test]
    fn the_block_of_the_latest_write_stays_open_however_long_ago_it_was() {
        let mut b = used(&["10.0.0.0/18", "10.0.64.0/18"]);
        assert!(b.write_started(&[net("10.0.0.0/18")]));
        b.write_ended(&[net("10.0.0.0/18")], true);
        assert!(b.write_started(&[net("10.0.64.0/18")]));
        b.write_ended(&[net("10.0.64.0/18")], true);
        b.take_for_idle_marks("t1");
        assert_eq!(
            b.take_for_idle_marks("t1"),
            [(net("10.0.0.0/18"), "t1".into())],
            "the next Node most likely lands where the last one did: marking it would cost an adoption each"
        );
        assert!(b.is_usable(&net("10.0.64.0/18")));
        b.marked_idle(net("10.0.0.0/18"), "t1", "2026-11-29T09:00:00Z");
        assert_eq!(b.take_for_idle_marks("t1"), []);
    }

    #[test]
    fn a_block_with_a_write_on_its_way_or_unanswered_is_never_marked() {
        let mut b = used(&["10.0.0.0/18", "10.0.64.0/18", "10.0.128.0/18"]);
        assert!(b.write_started(&[net("10.0.0.0/18")]));
        assert!(b.write_started(&[net("10.0.64.0/18")]));
        b.write_ended(&[net("10.0.64.0/18")], false);
        assert!(b.write_started(&[net("10.0.128.0/18")]));
        b.take_for_idle_marks("t1");
        assert_eq!(b.take_for_idle_marks("t1"), []);
    }

    #[test]
    fn a_write_chosen_before_its_block_was_taken_for_a_mark_is_not_started() {
        let mut b = used(&["10.0.0.0/18"]);
        b.take_for_idle_marks("t1");
        b.take_for_idle_marks("t1");
        assert!(
            !b.write_started(&[net("10.0.0.0/18")]),
            "its block must be adopted again first"
        );
        b.taken_into_use(net("10.0.0.0/18"));
        assert!(b.write_started(&[net("10.0.0.0/18")]));
    }

    #[test]
    fn a_landed_mark_is_what_the_adoption_tests_and_it_is_not_marked_again() {
        let mut b = used(&["10.0.0.0/18"]);
        b.take_for_idle_marks("t1");
        b.take_for_idle_marks("t1");
        b.marked_idle(net("10.0.0.0/18"), "t1", "2026-11-29T09:00:00Z");
        assert_eq!(
            b.adoption_test(&net("10.0.0.0/18")),
            Some(&Adoptable {
                term: Some("t1".into()),
                idle_since: Some("2026-11-29T09:00:00Z".into()),
            })
        );
        assert_eq!(b.take_for_idle_marks("t1"), []);
        assert_eq!(b.to_mark_idle("t1"), [], "nor at the step-down");
    }

    #[test]
    fn a_mark_whose_outcome_is_unknown_is_made_again() {
        let mut b = used(&["10.0.0.0/18"]);
        b.take_for_idle_marks("t1");
        b.take_for_idle_marks("t1");
        assert_eq!(
            b.take_for_idle_marks("t1"),
            [(net("10.0.0.0/18"), "t1".into())]
        );
    }

    #[test]
    fn a_predecessors_idle_claim_is_marked_again_under_this_term_while_it_leads() {
        let listed = ListedBlock {
            range: net("10.0.0.0/18"),
            term: Some("t0".into()),
            idle: true,
            idle_since: Some("2026-11-29T08:00:00Z".into()),
        };
        let mut b = Blocks::start(vec![listed], HashMap::new());
        assert_eq!(
            b.take_for_idle_marks("t1"),
            [(net("10.0.0.0/18"), "t0".into())],
            "a kill -9 of this leader must not leave its successor a mark it does not trust"
        );
        b.marked_idle(net("10.0.0.0/18"), "t1", "2026-11-29T09:00:00Z");
        assert_eq!(b.take_for_idle_marks("t1"), []);
    }

    #[test]
    fn a_refused_block_is_neither_used_nor_adopted_nor_marked() {
        let mut b = used(&["10.0.0.0/18"]);
        b.take_for_idle_marks("t1");
        b.take_for_idle_marks("t1");
        assert_eq!(b.refused(net("10.0.0.0/18")), [net("10.0.0.0/18")]);
        assert!(!b.is_usable(&net("10.0.0.0/18")));
        assert!(!b.is_adoptable(&net("10.0.0.0/18")));
        assert_eq!(b.take_for_idle_marks("t1"), []);
    }
}
