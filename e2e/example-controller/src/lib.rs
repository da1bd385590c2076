//! taint-labeler: an example controller, written against netcm-manager's public API alone, that labels
//! every Node `<--taint-label-key>=true` while it has a taint and `false` while it has none.
//!
//! It is the walk-through of `docs/adding-a-controller.md`: its flags ([`Flags`], a
//! [`ControllerOptions`]), its reconciler ([`TaintLabeler`]: a level-triggered sync of one Node from the
//! cache, one merge PATCH behind the leader fence when the label differs) and its registry entry
//! ([`descriptor`]). It reads taints and its own label — fields no other controller reads, so the
//! cache keeps them only because [`TaintLabeler::node_fields`] declares them.

use std::sync::Arc;

use clap::Args;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_manager::flags::GenericFlags;
use netcm_manager::sync_metrics::{api_reason, REASON_FENCED};
use netcm_manager::{
    CachedNode, Controller, ControllerDescriptor, ControllerOptions, Fenced, InitContext,
    InitResult, LeaderGuard, NodeFields, Reconciler, SharedInformer, SyncOutcome,
};

/// The controller's canonical name: its queue, metrics label and log field.
pub const NAME: &str = "taint-labeler";

/// taint-labeler flags.
#[derive(Debug, Clone, Args)]
#[group(id = "taint-labeler-flags")]
pub struct Flags {
    /// The label set on every Node: "true" while it has a taint, "false" while it has none.
    #[arg(long, default_value = "example.netcm.io/tainted")]
    pub taint_label_key: String,

    /// Number of Nodes the taint-labeler syncs concurrently.
    #[arg(long, default_value_t = 2)]
    pub concurrent_taint_label_syncs: usize,
}

/// A flag value the taint-labeler refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// Not `prefix/name` with a DNS prefix and a label name.
    #[error(
        "--taint-label-key {0:?}: must be <dns prefix>/<name> of letters, digits, '-', '_' and '.'"
    )]
    LabelKey(String),
}

/// The registry entry: one line in the binary's registry plugs the controller in.
pub fn descriptor(flags: Flags) -> ControllerDescriptor {
    ControllerDescriptor::new(NAME, &[], flags)
}

impl ControllerOptions for Flags {
    type FlagError = FlagError;

    fn validate(&self, _generic: &GenericFlags) -> Result<(), FlagError> {
        let valid = self
            .taint_label_key
            .split_once('/')
            .is_some_and(|(prefix, name)| {
                let chars = |s: &str, extra: &[char]| {
                    !s.is_empty()
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
                };
                chars(prefix, &['-', '.']) && name.len() <= 63 && chars(name, &['-', '_', '.'])
            });
        if !valid {
            return Err(FlagError::LabelKey(self.taint_label_key.clone()));
        }
        Ok(())
    }

    fn effective_config(&self) -> Vec<(String, String)> {
        vec![
            ("--taint-label-key".into(), self.taint_label_key.clone()),
            (
                "--concurrent-taint-label-syncs".into(),
                self.concurrent_taint_label_syncs.to_string(),
            ),
        ]
    }

    fn workers(&self) -> usize {
        self.concurrent_taint_label_syncs
    }

    fn init(&self, ctx: &InitContext) -> InitResult {
        let queue = ctx.node_queue(NAME)?;
        let labeler = Arc::new(TaintLabeler {
            nodes: ctx.nodes.clone(),
            api: Api::all(ctx.client.clone()),
            guard: ctx.leader.clone(),
            key: self.taint_label_key.clone(),
        });
        Ok(Some(Controller::new().reconciler(
            labeler,
            queue,
            ctx.workers,
        )))
    }
}

/// Why a sync is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// This process may not write now.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The PATCH failed.
    #[error("patching the node's label: {0}")]
    Patch(#[from] kube::Error),
}

impl netcm_manager::SyncError for SyncError {
    fn reason(&self) -> &'static str {
        match self {
            Self::Fenced(_) => REASON_FENCED,
            Self::Patch(e) => api_reason(e),
        }
    }
}

/// The reconciler: one Node at a time, from the cache.
pub struct TaintLabeler {
    nodes: SharedInformer<CachedNode>,
    api: Api<Node>,
    guard: LeaderGuard,
    key: String,
}

/// The label a Node should carry: whether it has any taint.
pub fn desired_label(node: &CachedNode) -> &'static str {
    if node.taints().len() > 0 {
        "true"
    } else {
        "false"
    }
}

impl Reconciler for TaintLabeler {
    type Error = SyncError;

    fn name(&self) -> &'static str {
        NAME
    }

    fn node_fields(&self) -> NodeFields {
        NodeFields::none().taints().labels(&self.key)
    }

    async fn sync(&self, key: &str) -> Result<SyncOutcome, SyncError> {
        let Some(node) = self.nodes.get(key) else {
            return Ok(SyncOutcome::Done);
        };
        let want = desired_label(&node);
        if node.label(&self.key) == Some(want) {
            return Ok(SyncOutcome::Done);
        }
        self.guard.ensure_leader()?;
        let body = serde_json::json!({ "metadata": { "labels": { &self.key: want } } });
        self.api
            .patch(key, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
        tracing::info!(controller = NAME, node = key, label = %self.key, value = want, "labelled node");
        Ok(SyncOutcome::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        generic: GenericFlags,
        #[command(flatten)]
        flags: Flags,
    }

    fn check(args: &[&str]) -> Result<(), FlagError> {
        let cli = Cli::parse_from(std::iter::once("netcm").chain(args.iter().copied()));
        cli.flags.validate(&cli.generic)
    }

    #[test]
    fn a_label_key_needs_a_prefix_and_a_name() {
        assert_eq!(check(&[]), Ok(()));
        for bad in ["tainted", "example.io/", "/tainted", "ex ample.io/t"] {
            assert!(
                check(&[&format!("--taint-label-key={bad}")]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_node_is_tainted_while_it_has_a_taint() {
        let node = CachedNode::builder("n1", "u1", "1");
        assert_eq!(desired_label(&node.build()), "false");
        let mut node = CachedNode::builder("n1", "u1", "1");
        node.taint(netcm_manager::Taint {
            key: "k",
            value: None,
            effect: "NoSchedule",
        });
        assert_eq!(desired_label(&node.build()), "true");
    }
}
