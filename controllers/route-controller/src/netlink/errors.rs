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

/// A nexthop that could not be made, sorted like [`failure`].
pub(super) fn nexthop_failure(
    operation: &'static str,
    route: &Route,
    e: GatewayError,
) -> BackendError {
    let subject = route.to_string();
    let message = e.to_string();
    match e.errno() {
        Some(EPERM | EACCES | ENOMEM | ENOBUFS) | Some(0) => BackendError::Host {
            operation,
            subject,
            message,
        },
        _ => BackendError::Refused {
            operation,
            subject,
            message,
        },
    }
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
        rtnetlink::Error::NetlinkError(m) => {
            let message = m.to_io().to_string();
            match m.raw_code().abs() {
                EPERM | EACCES | ENOMEM | ENOBUFS => BackendError::Host {
                    operation,
                    subject,
                    message,
                },
                _ => BackendError::Refused {
                    operation,
                    subject,
                    message,
                },
            }
        }
        other => BackendError::Host {
            operation,
            subject,
            message: other.to_string(),
        },
    }
}
