//! The route backend interface, in the shape of cloud-provider's `Routes` (list / create / delete) plus
//! an in-place replace, which a kernel table offers and a gateway change needs.
//!
//! A backend only ever sees netcm's own routes: it lists, replaces and deletes routes marked as netcm's
//! (for netlink: `--route-table` and `--route-protocol`), and a create that collides with anyone else's
//! route fails with [`BackendError::Exists`] instead of overwriting it. It also tells the networks the
//! host is directly connected to (no pod CIDR may cover one), and may report changes others make to the
//! table as [`TableChange`]s, so a route someone removes is repaired at once.

use std::fmt;
use std::net::IpAddr;

use futures::future::BoxFuture;
use ipnet::IpNet;

/// One route: `destination via gateway`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    /// The pod CIDR.
    pub destination: IpNet,
    /// The Node's address.
    pub gateway: IpAddr,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via {}", self.destination, self.gateway)
    }
}

/// The operation a backend error came from; the `operation` label of `netcm_route_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Listing netcm's routes.
    List,
    /// Creating a route.
    Create,
    /// Replacing a route's gateway.
    Replace,
    /// Deleting a route.
    Delete,
}

impl Operation {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::List => "list",
            Operation::Create => "create",
            Operation::Replace => "replace",
            Operation::Delete => "delete",
        }
    }
}

/// Why a backend call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// A route to the destination already exists (netcm's own, or someone else's).
    #[error("a route to {0} already exists in the table")]
    Exists(IpNet),
    /// The backend refused this call for a reason of the route (for netlink: the kernel's errno and
    /// message, e.g. a gateway that is not on any link).
    #[error("{operation} {subject}: {message}")]
    Refused {
        /// What was attempted.
        operation: &'static str,
        /// The route or table.
        subject: String,
        /// The backend's message.
        message: String,
    },
    /// The call failed for a reason of this host, whatever the route: no permission, no memory, the
    /// netlink socket gone. Every route would fail the same way.
    #[error("{operation} {subject}: {message}")]
    Host {
        /// What was attempted.
        operation: &'static str,
        /// The route or table.
        subject: String,
        /// The backend's message.
        message: String,
    },
}

impl BackendError {
    /// Whether the failure is this host's, not the route's.
    pub fn on_this_host(&self) -> bool {
        matches!(self, BackendError::Host { .. })
    }
}

/// A change to netcm's table, made by anyone (netcm included), as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableChange {
    /// A route to `destination` was added to the table or replaced.
    Added {
        /// The destination.
        destination: IpNet,
        /// Its gateway, if it has one.
        gateway: Option<IpAddr>,
        /// Whether it carries netcm's protocol.
        ours: bool,
    },
    /// A route to `destination` was removed from the table.
    Removed {
        /// The destination.
        destination: IpNet,
        /// Its gateway, if it had one.
        gateway: Option<IpAddr>,
        /// Whether it carried netcm's protocol.
        ours: bool,
    },
    /// The host's addresses changed, so its connected networks may have.
    Addresses,
    /// Changes were lost (the notification buffer overflowed): only a full listing tells the truth.
    Lost,
}

/// A route backend: cloud-provider's `Routes`, for netcm's routes only. Implementations are cheap to
/// share and take concurrent calls.
pub trait Routes: Send + Sync {
    /// Every route this backend marks as netcm's.
    fn list_routes(&self) -> BoxFuture<'_, Result<Vec<Route>, BackendError>>;
    /// Creates a route; fails with [`BackendError::Exists`] if any route to the destination exists.
    fn create_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>>;
    /// Replaces netcm's route to `route.destination` so it goes via `route.gateway`.
    fn replace_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>>;
    /// Deletes netcm's route; a route that is already gone is not an error.
    fn delete_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>>;
    /// The networks of the host's addresses (the host is directly connected to each).
    fn connected_networks(&self) -> BoxFuture<'_, Result<Vec<IpNet>, BackendError>>;
}

#[cfg(test)]
pub(crate) mod fake {
    //! An in-memory backend for the sync logic's unit tests.

    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// netcm's routes, routes of others, gateways the "kernel" refuses, the host's networks, and
    /// switches for failures of the whole host.
    #[derive(Default)]
    pub(crate) struct FakeRoutes {
        pub(crate) ours: Mutex<BTreeMap<IpNet, IpAddr>>,
        pub(crate) foreign: Mutex<BTreeSet<IpNet>>,
        pub(crate) unreachable: Mutex<BTreeSet<IpAddr>>,
        pub(crate) connected: Mutex<Vec<IpNet>>,
        pub(crate) calls: Mutex<Vec<String>>,
        /// Listing fails.
        pub(crate) list_fails: AtomicBool,
        /// Every change fails as it would without CAP_NET_ADMIN.
        pub(crate) host_fails: AtomicBool,
    }

    impl FakeRoutes {
        fn record(&self, call: String) {
            self.calls.lock().expect("calls").push(call);
        }

        fn check_gateway(&self, op: &'static str, route: &Route) -> Result<(), BackendError> {
            if self.host_fails.load(Ordering::SeqCst) {
                return Err(BackendError::Host {
                    operation: op,
                    subject: route.to_string(),
                    message: "Operation not permitted".into(),
                });
            }
            if self
                .unreachable
                .lock()
                .expect("unreachable")
                .contains(&route.gateway)
            {
                return Err(BackendError::Refused {
                    operation: op,
                    subject: route.to_string(),
                    message: "Nexthop has invalid gateway".into(),
                });
            }
            Ok(())
        }

        pub(crate) fn table(&self) -> Vec<Route> {
            self.ours
                .lock()
                .expect("ours")
                .iter()
                .map(|(d, g)| Route {
                    destination: *d,
                    gateway: *g,
                })
                .collect()
        }

        pub(crate) fn take_calls(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().expect("calls"))
        }
    }

    impl Routes for FakeRoutes {
        fn list_routes(&self) -> BoxFuture<'_, Result<Vec<Route>, BackendError>> {
            Box::pin(async move {
                self.record("list".into());
                if self.list_fails.load(Ordering::SeqCst) {
                    return Err(BackendError::Host {
                        operation: "list",
                        subject: "table 100".into(),
                        message: "No buffer space available".into(),
                    });
                }
                Ok(self.table())
            })
        }

        fn create_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>> {
            Box::pin(async move {
                self.record(format!("create {route}"));
                self.check_gateway("create", &route)?;
                let mut ours = self.ours.lock().expect("ours");
                if ours.contains_key(&route.destination)
                    || self
                        .foreign
                        .lock()
                        .expect("foreign")
                        .contains(&route.destination)
                {
                    return Err(BackendError::Exists(route.destination));
                }
                ours.insert(route.destination, route.gateway);
                Ok(())
            })
        }

        fn replace_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>> {
            Box::pin(async move {
                self.record(format!("replace {route}"));
                self.check_gateway("replace", &route)?;
                self.ours
                    .lock()
                    .expect("ours")
                    .insert(route.destination, route.gateway);
                Ok(())
            })
        }

        fn delete_route(&self, route: Route) -> BoxFuture<'_, Result<(), BackendError>> {
            Box::pin(async move {
                self.record(format!("delete {route}"));
                if self.host_fails.load(Ordering::SeqCst) {
                    return Err(BackendError::Host {
                        operation: "delete",
                        subject: route.to_string(),
                        message: "Operation not permitted".into(),
                    });
                }
                let mut ours = self.ours.lock().expect("ours");
                if ours.get(&route.destination) == Some(&route.gateway) {
                    ours.remove(&route.destination);
                }
                Ok(())
            })
        }

        fn connected_networks(&self) -> BoxFuture<'_, Result<Vec<IpNet>, BackendError>> {
            Box::pin(async move { Ok(self.connected.lock().expect("connected").clone()) })
        }
    }
}
