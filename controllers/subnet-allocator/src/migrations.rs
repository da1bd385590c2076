//! PodCIDRMigrations (`podcidrmigrations.ipam.netcm.io`), read for one thing: while a migration the
//! pod-cidr-migration controller has accepted runs, every pool but its destination gives out nothing
//! new ([`netcm_api::pod_cidr_migration::open_pool`], [`netcm_ipam::Pools::open_only`]), so a Node
//! that registers again during it is served from the destination — and a release hold on its old
//! CIDRs ends instead of giving them back. What Nodes hold stays theirs.
//!
//! The allocator runs this watch with `--cluster-cidr-objects` (a destination is a pool, and without
//! ClusterCIDR objects there is only the flag's). Its first list is in before the first allocation, so
//! a new leader does not serve a returning Node from a closed pool for a moment. A missing CRD or a
//! missing right to read it (a chart from before the kind) means no migration can be running that
//! this process could honour: it is logged once and allocation goes on with every pool open.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use netcm_api::pod_cidr_migration::{api_resource, open_pool, Migration};
use netcm_manager::informer::watch_backoff;
use tokio::sync::watch;

use crate::allocator::{Allocator, NAME};

/// Whether the watch cannot read migrations for good: no CRD (404) or no right (403).
fn cannot_read(e: &watcher::Error) -> bool {
    matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s))
            if matches!(s.code, 403 | 404)
    )
}

impl Allocator {
    /// Keeps the pools' closing in line with the migrations; `listed` turns true once the first list is
    /// in (or the kind cannot be read). A service of the allocator's controller: the syncs read what it
    /// sets.
    pub(crate) async fn watch_migrations(
        self: Arc<Self>,
        api: Api<DynamicObject>,
        listed: watch::Sender<bool>,
    ) {
        let writer = reflector::store::Writer::new(api_resource());
        let store = writer.as_reader();
        let stream =
            reflector(writer, watcher(api, watcher::Config::default())).backoff(watch_backoff());
        let mut stream = std::pin::pin!(stream);
        let mut refused_logged = false;
        while let Some(item) = stream.next().await {
            match item {
                Err(e) if cannot_read(&e) => {
                    if !refused_logged {
                        tracing::warn!(controller = NAME, error = %e, "cannot read PodCIDRMigrations (CRD podcidrmigrations.ipam.netcm.io not installed, or no RBAC to list it); allocating from every pool until it can");
                        refused_logged = true;
                    }
                    listed.send_replace(true);
                }
                Err(e) => {
                    tracing::warn!(controller = NAME, error = %e, "watching PodCIDRMigrations failed; retrying with backoff");
                }
                // Mid-relist the store still shows the last complete list.
                Ok(Event::Init | Event::InitApply(_)) => {}
                Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_)) => {
                    refused_logged = false;
                    let migrations: Vec<Migration> = store
                        .state()
                        .iter()
                        .map(|o| Migration::from_object(o))
                        .collect();
                    self.close_pools_for(open_pool(&migrations).as_deref());
                    listed.send_replace(true);
                }
            }
        }
    }

    /// Leaves `open` the only pool giving out CIDRs (`None`: every pool), waking the Nodes that wait
    /// for one when that changed: a Node the closing left without a pool may have one now.
    pub(crate) fn close_pools_for(&self, open: Option<&str>) {
        let changed = self.state.lock().pools.open_only(open);
        if !changed {
            return;
        }
        match open {
            Some(pool) => tracing::info!(
                controller = NAME,
                pool,
                "a PodCIDRMigration runs: new pod CIDRs come from its destination pool alone"
            ),
            None => tracing::info!(
                controller = NAME,
                "no PodCIDRMigration runs: every pool gives out pod CIDRs again"
            ),
        }
        self.wake_waiting();
    }
}
