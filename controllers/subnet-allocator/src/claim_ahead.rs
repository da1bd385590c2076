//! Claiming the next block before the workers need it. When a block fills, every worker's next
//! allocation lands in the following block and waits on that block's claim create: the PATCH pipeline
//! drains for a claim round trip plus a PATCH round trip, once per block (20 times in a 5,000-Node
//! backlog in a /8 of /24s). So once an allocation reaches the second half of its block, the workers ask
//! this task to claim the next block ([`crate::blocks::claim_ahead_block`]) through the same path a
//! worker takes ([`Allocator::claim_block`]: the fence, one create per block, the quarantine). A wrong
//! guess costs one claim write; a failure costs nothing, since a worker claims synchronously when it
//! gets there.

use std::sync::Arc;

use ipnet::IpNet;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, NAME};
use crate::blocks::claim_ahead_block_sized;

/// Requests waiting for the task; beyond this a request is dropped (the next allocation repeats it).
pub(crate) const PENDING_REQUESTS: usize = 4;

impl Allocator {
    /// Asks the claim-ahead task for the block after each of `cidrs`' own, once they reach the second
    /// half of it and the next one is not usable yet. Never waits.
    pub(crate) fn request_claim_ahead(&self, cidrs: &[IpNet]) {
        let Some(requests) = &self.claim_ahead else {
            return;
        };
        for cidr in cidrs {
            let Some((cluster, sizing)) = self
                .state
                .lock()
                .pools
                .set_of(*cidr)
                .map(|s| (s.cluster(), s.sizing()))
            else {
                continue;
            };
            let Some(next) = claim_ahead_block_sized(*cidr, cluster, sizing) else {
                continue;
            };
            if !self.state.lock().blocks.is_usable(&next) {
                // Full means requests are pending already; this one comes again with the next allocation.
                let _ = requests.try_send(next);
            }
        }
    }
}

/// The task: claims each requested block that is not usable yet, until `shutdown` (it writes, so it
/// stops with the workers, before the lease can be released).
pub(crate) async fn run(
    allocator: Arc<Allocator>,
    mut requests: mpsc::Receiver<IpNet>,
    shutdown: CancellationToken,
) {
    let Some(claims) = &allocator.claims else {
        return;
    };
    loop {
        let block = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = requests.recv() => match next {
                Some(block) => block,
                None => return,
            },
        };
        if let Err(e) = allocator.claim_block(claims, block, false).await {
            tracing::debug!(controller = NAME, block = %block, error = %e, "could not claim a block ahead of need; a worker claims it when it gets there");
        }
    }
}
