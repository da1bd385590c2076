//! One nexthop object per gateway: the ids netcm's routes name instead of a gateway, created on first use,
//! adopted from the kernel after a restart, and removed once no route has used them for two reconcile
//! periods.
//!
//! Why two periods and not a count of routes per nexthop: routes come and go outside netcm (an operator's
//! `ip route flush`, a link going down), so a count would drift, while the periodic listing sees the
//! table as it is. A use stamps its nexthop with the current listing's generation, and a nexthop is
//! deleted only if neither of the last two listings found a route naming it and it was not used since
//! before the earlier one began — a route added since is in the later listing. Should a route still
//! lose its nexthop (someone deletes it), the kernel drops the route, reports it, and netcm repairs it
//! with a fresh nexthop.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;

use tokio::sync::Mutex;

use super::nexthop::{NexthopClient, NexthopError, EEXIST};

/// Ids tried before a create gives up: others' nexthops may hold a run of ids.
const ID_ATTEMPTS: u32 = 64;

/// The sysctl that makes the kernel report a nexthop route with its gateway (default 1). With it off a
/// route names only its nexthop id, which every reader of the table (netcm's watch, `ip route`,
/// flannel) would have to resolve, so netcm writes plain gateway routes then.
const COMPAT_MODE: &str = "/proc/sys/net/ipv4/nexthop_compat_mode";

/// A use or a listing of nexthops that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    /// The interface towards the gateway could not be found, or no id was free.
    #[error("{0}")]
    Lookup(String),
    /// The kernel refused a nexthop call.
    #[error("nexthop via {gateway}: {message}")]
    Kernel {
        /// The gateway.
        gateway: IpAddr,
        /// The kernel's errno (0: the socket failed).
        errno: i32,
        /// The kernel's answer.
        message: String,
    },
}

impl GatewayError {
    /// The kernel's errno, when the kernel answered.
    pub fn errno(&self) -> Option<i32> {
        match self {
            GatewayError::Kernel { errno, .. } => Some(*errno),
            GatewayError::Lookup(_) => None,
        }
    }
}

fn kernel(gateway: IpAddr, e: NexthopError) -> GatewayError {
    GatewayError::Kernel {
        gateway,
        errno: e.errno,
        message: e.message,
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u32,
    /// The listing generation of its last use.
    used: u64,
}

#[derive(Debug, Default)]
struct State {
    by_gateway: HashMap<IpAddr, Entry>,
    next_id: u32,
    generation: u64,
    /// netcm's nexthops no route named at the last listing.
    unnamed_last: HashSet<u32>,
}

/// netcm's nexthop per gateway, in one network namespace.
pub struct GatewayNexthops {
    client: NexthopClient,
    protocol: u8,
    state: Mutex<State>,
}

/// Whether the kernel reports nexthop routes with their gateways (see [`COMPAT_MODE`]).
pub fn kernel_reports_gateways() -> bool {
    std::fs::read_to_string(COMPAT_MODE).is_ok_and(|v| v.trim() != "0")
}

impl GatewayNexthops {
    /// netcm's nexthops, marked with `protocol`.
    pub fn new(client: NexthopClient, protocol: u8) -> Self {
        Self {
            client,
            protocol,
            state: Mutex::new(State {
                next_id: 1,
                ..Default::default()
            }),
        }
    }

    /// Whether this kernel has nexthop objects (a dump succeeds); new ids start above the ones it lists.
    pub async fn supported(&self) -> Result<(), String> {
        let nexthops = self.client.dump().await.map_err(|e| e.message)?;
        let highest = nexthops.iter().map(|n| n.id).max().unwrap_or(0);
        let mut state = self.state.lock().await;
        state.next_id = state.next_id.max(highest.saturating_add(1));
        Ok(())
    }

    /// The id of the nexthop via `gateway`, created on interface `oif` (awaited only then) if there is
    /// none yet. With `verify` a known nexthop is first read back from the kernel: a replace repairs a
    /// route someone changed, and they may have changed the nexthop itself (`ip nexthop replace`).
    pub async fn id_for(
        &self,
        gateway: IpAddr,
        oif: impl Future<Output = Result<u32, String>>,
        verify: bool,
    ) -> Result<u32, GatewayError> {
        let mut state = self.state.lock().await;
        let generation = state.generation;
        if let Some(entry) = state.by_gateway.get(&gateway).copied() {
            let holds = !verify
                || matches!(self.client.get(entry.id).await,
                    Ok(Some(n)) if n.gateway == Some(gateway) && n.protocol == self.protocol);
            if holds {
                if let Some(e) = state.by_gateway.get_mut(&gateway) {
                    e.used = generation;
                }
                return Ok(entry.id);
            }
            // Changed or gone: a fresh nexthop; the listing deletes the changed one once unnamed.
            state.by_gateway.remove(&gateway);
        }
        let oif = oif.await.map_err(GatewayError::Lookup)?;
        for _ in 0..ID_ATTEMPTS {
            let id = state.next_id;
            state.next_id = id.checked_add(1).unwrap_or(1);
            match self.client.create(id, gateway, oif, self.protocol).await {
                Ok(()) => {
                    state.by_gateway.insert(
                        gateway,
                        Entry {
                            id,
                            used: generation,
                        },
                    );
                    return Ok(id);
                }
                Err(e) if e.errno == EEXIST => continue,
                Err(e) => return Err(kernel(gateway, e)),
            }
        }
        Err(GatewayError::Lookup(format!(
            "nexthop via {gateway}: {ID_ATTEMPTS} ids in a row are taken by other nexthops"
        )))
    }

    /// The id netcm uses for `gateway`, if any, without creating one.
    pub async fn known(&self, gateway: IpAddr) -> Option<u32> {
        self.state
            .lock()
            .await
            .by_gateway
            .get(&gateway)
            .map(|e| e.id)
    }

    /// How many nexthops netcm has installed, one per gateway.
    pub async fn installed(&self) -> usize {
        self.state.lock().await.by_gateway.len()
    }

    /// Forgets `gateway`'s nexthop if the kernel no longer has it; whether it was gone. A route that
    /// named it was refused, so the caller tries again with a fresh one.
    pub async fn forget_if_gone(&self, gateway: IpAddr, id: u32) -> bool {
        let gone = matches!(self.client.get(id).await, Ok(None));
        if gone {
            let mut state = self.state.lock().await;
            if state.by_gateway.get(&gateway).is_some_and(|e| e.id == id) {
                state.by_gateway.remove(&gateway);
            }
        }
        gone
    }

    /// Starts a listing: call before dumping the routes, and pass the generation to [`Self::collect`].
    pub async fn begin_listing(&self) -> u64 {
        let mut state = self.state.lock().await;
        state.generation += 1;
        state.generation
    }

    /// Squares the cache with the kernel after a route dump that found routes naming `named`: adopts
    /// netcm's nexthops it does not know (a restart), forgets the ones the kernel lost, and deletes the
    /// ones no route has named for two listings. The number deleted.
    pub async fn collect(
        &self,
        generation: u64,
        named: &HashSet<u32>,
    ) -> Result<usize, GatewayError> {
        // Locked before the dump: a nexthop created after it would look lost to the kernel.
        let mut state = self.state.lock().await;
        let kernel_nexthops = self
            .client
            .dump()
            .await
            .map_err(|e| GatewayError::Lookup(format!("listing nexthops: {e}")))?;
        let highest = kernel_nexthops.iter().map(|n| n.id).max().unwrap_or(0);
        state.next_id = state.next_id.max(highest.saturating_add(1)).max(1);
        let ours: Vec<(u32, IpAddr)> = kernel_nexthops
            .iter()
            .filter(|n| n.protocol == self.protocol)
            .filter_map(|n| Some((n.id, n.gateway?)))
            .collect();
        let in_kernel: HashMap<u32, IpAddr> = ours.iter().copied().collect();
        state
            .by_gateway
            .retain(|gateway, e| in_kernel.get(&e.id) == Some(gateway));
        for &(id, gateway) in &ours {
            let adopt = match state.by_gateway.get(&gateway) {
                None => true,
                // Two of netcm's nexthops via one gateway (a crash between a create and its route):
                // keep the one routes name.
                Some(e) => !named.contains(&e.id) && named.contains(&id),
            };
            if adopt {
                state.by_gateway.insert(gateway, Entry { id, used: 0 });
            }
        }
        let unnamed: HashSet<u32> = ours
            .iter()
            .map(|&(id, _)| id)
            .filter(|id| !named.contains(id))
            .collect();
        let mut deleted = 0;
        for &(id, gateway) in &ours {
            let entry = state
                .by_gateway
                .get(&gateway)
                .filter(|e| e.id == id)
                .copied();
            let used_lately = entry.is_some_and(|e| e.used + 1 >= generation);
            if unnamed.contains(&id) && state.unnamed_last.contains(&id) && !used_lately {
                match self.client.delete(id).await {
                    Ok(()) => deleted += 1,
                    Err(e) if e.errno == super::nexthop::ENOENT => {}
                    Err(e) => return Err(kernel(gateway, e)),
                }
                if entry.is_some() {
                    state.by_gateway.remove(&gateway);
                }
            }
        }
        state.unnamed_last = unnamed;
        Ok(deleted)
    }
}
