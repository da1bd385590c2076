//! Changes the kernel reports in netcm's table, made by anyone: applied to the view at once, so a route
//! someone deleted or re-pointed is repaired by the sync of its Node within milliseconds instead of at
//! the next full reconcile. netcm's own changes come back too; they agree with the view and cost nothing.

use super::RouteSyncer;
use crate::backend::TableChange;

impl RouteSyncer {
    /// Applies one reported change to the view; returns the Node to sync again when the change undid
    /// what that Node asks for (or may let a failing Node's route in).
    pub async fn table_changed(&self, change: &TableChange) -> Option<String> {
        // After any reconcile in progress, whose listing may predate the change.
        let _shared = self.table.read().await;
        let mut st = self.state();
        match *change {
            TableChange::Added {
                destination,
                gateway: Some(gateway),
                ours: true,
            } => {
                st.programmed.insert(destination, gateway);
                let routed = st.routed_for.get(&destination)?;
                if routed.gateway == gateway {
                    return None;
                }
                tracing::info!(controller = crate::NAME, node = %routed.node, destination = %destination, gateway = %gateway, "route re-pointed by someone else; syncing the node");
                Some(routed.node.clone())
            }
            TableChange::Added { destination, .. } => {
                // Someone else's route to a destination netcm routes: it replaced netcm's or sits beside
                // it. The Node's sync finds out which, and reports a route in the way.
                let node = st.routed_for.get(&destination)?.node.clone();
                st.programmed.remove(&destination);
                Some(node)
            }
            TableChange::Removed {
                destination,
                gateway,
                ours: true,
            } => {
                // Only the route the view holds counts: netcm's own deletes left the view already.
                if gateway.is_none() || st.programmed.get(&destination) != gateway.as_ref() {
                    return None;
                }
                st.programmed.remove(&destination);
                let node = st.routed_for.get(&destination)?.node.clone();
                tracing::info!(controller = crate::NAME, node = %node, destination = %destination, "route removed by someone else; syncing the node");
                Some(node)
            }
            TableChange::Removed { destination, .. } => {
                // A route in the way is gone: the Node it blocked may get its route now.
                let node = &st.routed_for.get(&destination)?.node;
                st.failing.contains(node).then(|| node.clone())
            }
            TableChange::Addresses | TableChange::Lost => None,
        }
    }
}
