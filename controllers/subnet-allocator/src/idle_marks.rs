//! Idle marks: what a leader writes on the PodCIDRClaims of blocks it no longer writes to, so its
//! successor uses their free CIDRs at once instead of quarantining them (`crate::blocks` says why that is
//! safe; `blocks/idle.rs` keeps which blocks are due). Two writers, one mark:
//!
//! - **While leading**, so a leader that dies (kill -9, its node lost) leaves its successor few open
//!   claims to quarantine. Every [`SWEEP_PERIOD`] the leader marks idle the claims of the blocks it has
//!   stopped writing to ([`crate::blocks::Blocks::take_for_idle_marks`] says which): a block is taken out
//!   of use first, so no PATCH starts from it while its mark is on its way, and is adopted again (one
//!   claim write) when a CIDR of it is next handed out. The block of the latest write stays open, so a
//!   steady trickle of Nodes costs no claim writes; a backlog costs one mark per block it filled.
//! - **At a clean step-down** ([`Allocator::mark_claims_idle`]): every claim of a block whose allocation
//!   writes were all answered is marked idle. Idle claims it was left and did not use are marked again
//!   under its own term: the next leader trusts its predecessor's marks only. It runs after the workers
//!   have stopped and before the lease is released, so the marks still pass the fence; a leader that
//!   dies leaves its claims open, and the next one quarantines them.

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, NAME};
use crate::claims::{ClaimWrite, Claims};

/// How often the leader marks idle the blocks it stopped writing to: a block goes idle 1–2 periods after
/// its last write.
pub(crate) const SWEEP_PERIOD: Duration = Duration::from_secs(10);

/// How many idle marks are on their way at once: a few hundred blocks at most, within a step-down's drain.
const CONCURRENT_MARKS: usize = 16;

/// The task: a sweep every [`SWEEP_PERIOD`] until `shutdown` (it writes, so it stops with the workers,
/// before the step-down's marks and the lease's release).
pub(crate) async fn run(allocator: Arc<Allocator>, shutdown: CancellationToken) {
    let Some(claims) = &allocator.claims else {
        return;
    };
    let mut tick = tokio::time::interval(SWEEP_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        allocator.mark_unused_blocks_idle(claims).await;
    }
}

impl Allocator {
    /// One sweep: marks idle the claims [`crate::blocks::Blocks::take_for_idle_marks`] picks. Holds the
    /// block lock throughout, so no worker adopts a block while its mark is on its way (the adoption
    /// would land first and the mark after it, leaving a block in use marked idle).
    async fn mark_unused_blocks_idle(&self, claims: &Claims) {
        let _blocks = self.block_create.lock().await;
        if self.guard.ensure_leader().is_err() {
            return;
        }
        let to_mark = self.state.lock().blocks.take_for_idle_marks(&self.term);
        if to_mark.is_empty() {
            return;
        }
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut marked = 0usize;
        for chunk in to_mark.chunks(CONCURRENT_MARKS) {
            let answers = futures::future::join_all(
                chunk
                    .iter()
                    .map(|(block, named)| claims.mark_idle(block, named, &self.term, &since)),
            )
            .await;
            for ((block, _), answer) in chunk.iter().zip(answers) {
                marked += usize::from(self.after_idle_mark(*block, &since, answer));
            }
        }
        tracing::info!(
            controller = NAME,
            marked,
            of = to_mark.len(),
            "marked idle the claims of blocks this leader stopped writing to"
        );
    }

    /// Records what an idle mark of `block` found; whether it landed. Unanswered, the block stays
    /// adoptable by a test of its term alone and is marked again at the next sweep.
    fn after_idle_mark(
        &self,
        block: IpNet,
        since: &str,
        answer: Result<ClaimWrite, crate::claims::ClaimError>,
    ) -> bool {
        match answer {
            Ok(ClaimWrite::Landed) => {
                let mut state = self.state.lock();
                state.blocks.marked_idle(block, &self.term, since);
                return true;
            }
            Ok(ClaimWrite::NotLanded) => self.state.lock().blocks.claim_gone(&block),
            Ok(ClaimWrite::Refused) => {
                self.refuse_block(block);
            }
            Err(e) => {
                tracing::warn!(controller = NAME, block = %block, error = %e, "could not mark a claim idle; marked again at the next sweep");
            }
        }
        false
    }
}

// =================================================================================================
// At a clean step-down
// =================================================================================================

impl Allocator {
    /// Marks idle the claims no write of this term (or, once its quarantine ended, of an earlier one) can
    /// still land in. A mark refused (a later leader adopted the block) or failed leaves the claim open:
    /// the safe side.
    pub(crate) async fn mark_claims_idle(&self) {
        let Some(claims) = &self.claims else {
            return;
        };
        let to_mark = self.state.lock().blocks.to_mark_idle(&self.term);
        if to_mark.is_empty() {
            return;
        }
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut marks = Vec::with_capacity(to_mark.len());
        for chunk in to_mark.chunks(CONCURRENT_MARKS) {
            let answers = futures::future::join_all(
                chunk
                    .iter()
                    .map(|(block, named)| self.mark_idle(claims, *block, named, &since)),
            );
            marks.extend(answers.await);
        }
        let marked = marks.iter().filter(|m| **m).count();
        let left_open = self.state.lock().blocks.left_open() + (marks.len() - marked);
        tracing::info!(
            controller = NAME,
            idle = marked,
            left_open,
            "stepping down: marked idle the claims no write of this leader can still land in; the next leader uses them without a quarantine"
        );
    }

    /// One idle mark of a claim that names `named`; whether it landed.
    async fn mark_idle(&self, claims: &Claims, block: IpNet, named: &str, since: &str) -> bool {
        if self.guard.ensure_leader().is_err() {
            return false;
        }
        match claims.mark_idle(&block, named, &self.term, since).await {
            Ok(ClaimWrite::Landed) => true,
            Ok(ClaimWrite::NotLanded | ClaimWrite::Refused) => false,
            Err(e) => {
                tracing::warn!(controller = NAME, block = %block, error = %e, "could not mark a claim idle; the next leader quarantines it");
                false
            }
        }
    }
}
