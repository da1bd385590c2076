//! The tasks the main sequence starts and stops: the leader's renew loop ([`Term`]), the running
//! controllers ([`Running`]) and the shared informer ([`Informer`]).

use std::sync::Arc;

use kube::api::Api;
use netcm_node::CachedNode;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::DRAIN_TIMEOUT;
use crate::client::protobuf::node_informer_client;
use crate::controller::Controller;
use crate::flags::ApiContentType;
use crate::informer::SharedInformer;
use crate::leader::{LeaderElector, TermEnd};
use crate::node_fields::{NodeFields, WireNode};
use crate::supervision::{Failure, Supervisor};

/// A leader's term: the renew loop on its own task, from the lease won until it is lost or stopped.
/// Without leader election there is no lease, and the term ends only by shutdown.
pub(super) struct Term {
    /// `None` without leader election, or once the loop has ended by itself (lost).
    renewing: Option<JoinHandle<(LeaderElector, TermEnd)>>,
    stop: CancellationToken,
}

impl Term {
    /// A term without leader election.
    pub(super) fn unelected() -> Self {
        Self {
            renewing: None,
            stop: CancellationToken::new(),
        }
    }

    /// Starts renewing the lease `elector` just won.
    pub(super) fn start(mut elector: LeaderElector) -> Self {
        let stop = CancellationToken::new();
        let renewing = tokio::spawn({
            let stop = stop.clone();
            async move {
                let end = elector.renew_until_lost(&stop).await;
                (elector, end)
            }
        });
        Self {
            renewing: Some(renewing),
            stop,
        }
    }

    /// Resolves when the renew loop ends by itself — the lease is lost, and its elector is dropped
    /// unreleased; never without leader election. Cancel-safe: dropped early, the loop runs on.
    pub(super) async fn renewal_ended(&mut self) -> TermEnd {
        let Some(task) = self.renewing.as_mut() else {
            return std::future::pending().await;
        };
        let end = task.await.map(|(_, end)| end).unwrap_or(TermEnd::Lost);
        self.renewing = None;
        end
    }

    /// Stops renewing: the elector to release the lease with, and how its loop ended; nothing when
    /// there is no loop left to stop (no leader election, lost, or the task panicked).
    pub(super) async fn stop(self) -> (Option<LeaderElector>, Option<TermEnd>) {
        self.stop.cancel();
        match self.renewing {
            Some(task) => match task.await {
                Ok((elector, end)) => (Some(elector), Some(end)),
                Err(_) => (None, None),
            },
            None => (None, None),
        }
    }
}

/// The running controllers.
pub(super) struct Running {
    cancel: CancellationToken,
    tasks: JoinSet<()>,
}

impl Running {
    /// No controller yet.
    pub(super) fn none() -> Self {
        Self {
            cancel: CancellationToken::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Runs `controller` until [`Running::stop`], reporting to `supervisor` if it cannot work.
    pub(super) fn spawn(
        &mut self,
        name: &'static str,
        controller: Controller,
        supervisor: Supervisor,
    ) {
        self.tasks.spawn(controller.run(
            name,
            self.cancel.child_token(),
            DRAIN_TIMEOUT,
            supervisor,
        ));
    }

    /// Stops every controller and waits for their drains, bounded; a controller that overruns is aborted.
    pub(super) async fn stop(mut self) {
        self.cancel.cancel();
        let drained = tokio::time::timeout(DRAIN_TIMEOUT * 2, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("controllers did not stop in time");
            self.tasks.abort_all();
        }
    }
}

/// The shared Node informer's task, and what it needs to start again.
pub(super) struct Informer {
    cancel: CancellationToken,
    task: JoinHandle<()>,
    nodes: SharedInformer<CachedNode>,
    client: kube::Client,
    fields: NodeFields,
    failure: Failure,
}

impl Informer {
    /// Starts the list+watch, in `content_type` on the wire, decoding each Node as a [`WireNode`] and
    /// caching only `fields` of it; subscriptions are closed from here on. A list+watch that ends
    /// before it is stopped fails the process: a frozen cache would silently stop every controller.
    pub(super) fn start(
        nodes: &SharedInformer<CachedNode>,
        client: &kube::Client,
        content_type: ApiContentType,
        fields: NodeFields,
        failure: &Failure,
    ) -> Self {
        let client = match content_type {
            ApiContentType::Protobuf => node_informer_client(client.clone()),
            ApiContentType::Json => client.clone(),
        };
        tracing::info!(
            content_type = content_type.as_str(),
            "the Node informer lists and watches in this encoding"
        );
        let (cancel, task) = Self::spawn(nodes, &client, &fields, failure);
        Self {
            cancel,
            task,
            nodes: nodes.clone(),
            client,
            fields,
            failure: failure.clone(),
        }
    }

    fn spawn(
        nodes: &SharedInformer<CachedNode>,
        client: &kube::Client,
        fields: &NodeFields,
        failure: &Failure,
    ) -> (CancellationToken, JoinHandle<()>) {
        let cancel = CancellationToken::new();
        let fields = fields.clone();
        let list_watch = nodes.clone().run(
            Api::<WireNode>::all(client.clone()),
            Arc::new(move |wire: WireNode| fields.keep(wire)),
            cancel.clone(),
        );
        let task = tokio::spawn({
            let (cancel, failure) = (cancel.clone(), failure.clone());
            async move {
                list_watch.await;
                if !cancel.is_cancelled() {
                    failure.fail("the Node informer's list+watch ended");
                }
            }
        });
        (cancel, task)
    }

    /// Starts the list+watch over with a new list into the same cache, and waits until that list is
    /// complete: a consistent read made from now on.
    pub(super) async fn relist(&mut self) {
        self.cancel.cancel();
        let _ = (&mut self.task).await;
        let before = self.nodes.lists_completed();
        (self.cancel, self.task) =
            Self::spawn(&self.nodes, &self.client, &self.fields, &self.failure);
        self.nodes.wait_listed_after(before).await;
    }

    /// Stops the list+watch and waits for it to end.
    pub(super) async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}
