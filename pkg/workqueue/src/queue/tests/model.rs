//! The property test: random workloads of add, get, done and shut down held to a model of the queue.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

/// One step of the random queue workload.
#[derive(Clone, Debug)]
enum Op {
    /// `add` of a key.
    Add(u8),
    /// `get`, only when a key is ready.
    Get,
    /// `done` of the n-th processing key (modulo their number).
    Done(usize),
    /// `shut_down`.
    ShutDown,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6).prop_map(Op::Add),
        3 => Just(Op::Get),
        3 => any::<usize>().prop_map(Op::Done),
        1 => Just(Op::ShutDown),
    ]
}

/// Checks the queue against a model after one `op`.
async fn apply(
    q: &Queue<u8>,
    op: Op,
    dirty: &mut HashSet<u8>,
    processing: &mut HashSet<u8>,
    shut: &mut bool,
) -> Result<(), TestCaseError> {
    match op {
        Op::Add(key) => {
            q.add(key);
            if !*shut {
                dirty.insert(key);
            }
        }
        Op::Get => {
            if !q.is_empty() {
                let key = q.get().await.expect("a ready key");
                prop_assert!(!processing.contains(&key), "{key} handed out twice");
                prop_assert!(dirty.remove(&key), "{key} handed out but not added");
                processing.insert(key);
            }
        }
        Op::Done(n) => {
            let mut held: Vec<u8> = processing.iter().copied().collect();
            held.sort_unstable();
            if !held.is_empty() {
                let key = held[n % held.len()];
                q.done(&key);
                processing.remove(&key);
            }
        }
        Op::ShutDown => {
            q.shut_down();
            *shut = true;
        }
    }
    prop_assert!(q.invariants_hold());
    let ready = dirty.difference(processing).count();
    prop_assert_eq!(q.len(), ready);
    Ok(())
}

proptest! {
    #[test]
    fn random_workloads_keep_the_queue_invariants(ops in prop::collection::vec(op(), 0..80)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let q = queue::<u8>();
            let (mut dirty, mut processing, mut shut) = (HashSet::new(), HashSet::new(), false);
            for op in ops {
                apply(&q, op, &mut dirty, &mut processing, &mut shut).await?;
            }
            // Finish everything: every added key must come out exactly once more.
            for key in std::mem::take(&mut processing) {
                q.done(&key);
            }
            while !q.is_empty() {
                let key = q.get().await.expect("a ready key");
                prop_assert!(dirty.remove(&key), "{key} handed out but not added");
                q.done(&key);
            }
            prop_assert!(dirty.is_empty(), "never handed out: {dirty:?}");
            q.shut_down();
            prop_assert_eq!(q.get().await, None);
            Ok(())
        })?;
    }
}
