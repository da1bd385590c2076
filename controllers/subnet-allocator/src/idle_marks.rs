//! Marking claims idle while leading, so a leader that dies (kill -9, its node lost) leaves its successor
//! few open claims to quarantine. Every [`SWEEP_PERIOD`] the leader marks idle the claims of the blocks
//! it has stopped writing to ([`crate::blocks::Blocks::take_for_idle_marks`] says which), the same mark
//! a clean step-down makes (`stepping_down.rs`): a block is taken out of use first, so no PATCH starts
//! from it while its mark is on its way, and is adopted again (one claim write) when a CIDR of it is
//! next handed out. The block of the latest write stays open, so a steady trickle of Nodes costs no claim
//! writes; a backlog costs one mark per block it filled.

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, NAME};
use crate::claims::{ClaimWrite, Claims};

/// How often the leader marks idle the blocks it stopped writing to: a block goes idle 1–2 periods after
/// its last write.
pub(crate) const SWEEP_PERIOD: Duration = Duration::from_secs(10);

/// How many idle marks are on their way at once.
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
