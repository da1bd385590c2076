//! Sorting the kernel's refusals: errors every route would get (permission, memory, the socket) are this
//! host's; the rest (an unreachable gateway, a bad prefix) are the route's.

use super::gateways::GatewayError;
use crate::backend::{BackendError, Route};

/// errno values the backend tells apart.
pub(super) const EPERM: i32 = 1;
pub(super) const ENOENT: i32 = 2;
pub(super) const ESRCH: i32 = 3;
pub(super) const ENOMEM: i32 = 12;
pub(super) const EACCES: i32 = 13;
pub(super) const EEXIST: i32 = 17;
pub(super) const ENOBUFS: i32 = 105;

/// Whether an errno is one every route would get on this host.
fn host_errno(errno: i32) -> bool {
    matches!(errno, EPERM | EACCES | ENOMEM | ENOBUFS)
}

/// A backend error, this host's or the route's.
fn sorted(
    operation: &'static str,
    subject: String,
    message: String,
    on_this_host: bool,
) -> BackendError {
    if on_this_host {
        BackendError::Host {
            operation,
            subject,
            message,
        }
    } else {
        BackendError::Refused {
            operation,
            subject,
            message,
        }
    }
}

/// A nexthop that could not be made, sorted like [`failure`] (errno 0: its socket failed).
pub(super) fn nexthop_failure(
    operation: &'static str,
    route: &Route,
    e: GatewayError,
) -> BackendError {
    let on_this_host = e.errno().is_some_and(|n| n == 0 || host_errno(n));
    sorted(operation, route.to_string(), e.to_string(), on_this_host)
}

/// The kernel's errno in an rtnetlink error, if it is one.
pub(super) fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(m.raw_code().abs()),
        _ => None,
    }
}

/// A failed call, sorted by whose it is: errors every route would get (permission, memory, the socket)
/// are this host's; the rest (an unreachable gateway, a bad prefix) are the route's.
pub(super) fn failure(
    operation: &'static str,
    subject: String,
    e: &rtnetlink::Error,
) -> BackendError {
    match e {
        rtnetlink::Error::NetlinkError(m) => sorted(
            operation,
            subject,
            m.to_io().to_string(),
            host_errno(m.raw_code().abs()),
        ),
        other => sorted(operation, subject, other.to_string(), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Route {
        Route {
            destination: "10.244.1.0/24".parse().expect("dst"),
            gateway: "192.0.2.1".parse().expect("gw"),
        }
    }

    fn kernel(errno: i32) -> GatewayError {
        GatewayError::Kernel {
            gateway: route().gateway,
            errno,
            message: "refused".into(),
        }
    }

    #[test]
    fn a_nexthop_refused_for_permission_memory_or_its_socket_is_this_hosts_and_the_rest_the_routes()
    {
        for errno in [EPERM, EACCES, ENOMEM, ENOBUFS, 0] {
            assert!(nexthop_failure("create", &route(), kernel(errno)).on_this_host());
        }
        let unreachable = nexthop_failure("create", &route(), kernel(101));
        assert!(matches!(unreachable, BackendError::Refused { .. }));
        let no_link = nexthop_failure("create", &route(), GatewayError::Lookup("no route".into()));
        assert!(matches!(no_link, BackendError::Refused { .. }));
    }
}
