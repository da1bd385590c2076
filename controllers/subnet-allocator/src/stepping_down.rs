//! What a leader leaves its successor when it steps down cleanly: every claim of a block whose
//! allocation writes were all answered is marked idle, so the next leader uses it at once instead of
//! quarantining its free CIDRs ([`crate::blocks`] says why that is safe). Idle claims it was left and did
//! not use are marked again under its own term: the next leader trusts its predecessor's marks only.
//! Runs after the workers have stopped and before the lease is released, so the marks still pass the
//! fence; a leader that dies leaves its claims open, and the next one quarantines them.

use ipnet::IpNet;

use crate::allocator::{Allocator, NAME};
use crate::claims::{ClaimWrite, Claims};

/// How many idle marks are on their way at once: a few hundred blocks at most, within the drain.
const CONCURRENT_MARKS: usize = 16;

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
