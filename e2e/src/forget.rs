//! What a surviving node of `hack/cluster.sh` still holds about a deleted Node, read back from its network
//! namespace (`hack/bench.sh forget`: how long `--cidr-release-hold` must keep the deleted Node's
//! pod CIDRs from the next Node): the kernel routes to its CIDRs of whoever routes pods (netcm's route
//! controller, flanneld host-gw or vxlan, with vxlan's VTEP neighbour and FDB entries), the UDP conntrack
//! entries of flows to its pod (through a Service, where kube-proxy DNATs, and pod IP to pod IP), and the
//! neighbour entries of its node addresses — and a UDP flow sent from inside the namespace that makes
//! those conntrack entries.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ipnet::IpNet;
use nix::sched::{setns, CloneFlags};

use crate::flannel_daemonset::Backend;
use crate::flannel_routes::{self, SubnetLease};
use crate::multinode::{in_node, in_node_json};

/// One datagram every this often: a flow a client keeps alive, at a rate that keeps the log small.
const SEND_EVERY: Duration = Duration::from_millis(100);

/// A UDP flow from a node's namespace to `target`, sending until stopped and counting the replies (the
/// probe pods echo UDP on their port). One socket, so one conntrack entry; its thread entered the
/// namespace before creating the socket, since a socket belongs to its creator's namespace.
pub struct UdpFlow {
    stop: Arc<AtomicBool>,
    replies: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl UdpFlow {
    pub fn start(node: &str, target: SocketAddr) -> UdpFlow {
        let stop = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(AtomicU64::new(0));
        let path = format!("/run/netns/{node}");
        let (s, r) = (stop.clone(), replies.clone());
        let thread = std::thread::spawn(move || {
            let ns = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            setns(&ns, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
            let bind = if target.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            };
            let socket = UdpSocket::bind(bind).expect("bind a UDP socket");
            socket
                .set_read_timeout(Some(SEND_EVERY))
                .expect("set_read_timeout");
            let mut buf = [0u8; 64];
            while !s.load(Ordering::Relaxed) {
                // An unreachable target is what is measured, not an error.
                let _ = socket.send_to(b"forget", target);
                if socket.recv_from(&mut buf).is_ok() {
                    r.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        UdpFlow {
            stop,
            replies,
            thread: Some(thread),
        }
    }

    pub fn replies(&self) -> u64 {
        self.replies.load(Ordering::Relaxed)
    }

    /// Sends no more; returns once the thread has ended.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("the UDP flow's thread");
        }
    }
}

impl Drop for UdpFlow {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What held state about the deleted Node, one kind of entry each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// netcm's route controller (DaemonSet, `--route-mode=node`): protocol 199 routes to its CIDRs.
    NetcmRoutes,
    /// flanneld: its routes to the Node's CIDRs.
    FlannelRoutes,
    /// flanneld vxlan: the permanent neighbour and the FDB entry of the Node's VTEPs.
    FlannelVtep,
    /// kube-proxy: the conntrack entry of a UDP flow to a ClusterIP DNATed to the Node's pod, its sender
    /// still sending (only kube-proxy's cleanup ends it then), the Service keeping a backend elsewhere.
    ConntrackService,
    /// The same through a Service whose only backend was the Node's pod.
    ConntrackServiceEmptied,
    /// The kernel: the conntrack entry of a UDP flow to the Node's pod IP, its sender stopped at the
    /// deletion (the timeout ends it).
    ConntrackPod,
    /// The kernel: the neighbour entries of the Node's addresses (the next hop of its routes).
    Neighbour,
}

impl Holder {
    pub fn name(self) -> &'static str {
        match self {
            Holder::NetcmRoutes => "netcm route controller: routes to the CIDRs",
            Holder::FlannelRoutes => "flanneld: routes to the subnet",
            Holder::FlannelVtep => "flanneld vxlan: VTEP neighbour + FDB entries",
            Holder::ConntrackService => {
                "kube-proxy: UDP conntrack via a Service to the old pod, a backend left elsewhere"
            }
            Holder::ConntrackServiceEmptied => {
                "kube-proxy: UDP conntrack via a Service to the old pod, its only backend"
            }
            Holder::ConntrackPod => "conntrack: UDP pod-IP flow, sender stopped at deletion",
            Holder::Neighbour => "neighbour entries of the node's addresses",
        }
    }

    pub fn method(self) -> &'static str {
        match self {
            Holder::NetcmRoutes => "`ip -j route show proto 199`, dst in the Node's CIDRs",
            Holder::FlannelRoutes => "`ip -j route show`, the routes flanneld made from its lease",
            Holder::FlannelVtep => {
                "`ip neigh show nud permanent`, `bridge fdb show` on flannel.1/flannel-v6.1"
            }
            Holder::ConntrackService | Holder::ConntrackServiceEmptied => {
                "`conntrack -L -p udp`: orig dst the ClusterIP, reply src the old pod; 10 datagrams/s on"
            }
            Holder::ConntrackPod => "`conntrack -L -p udp`: orig dst the old pod IP (ASSURED before)",
            Holder::Neighbour => "`ip -j neigh show to` the Node's IPv4 and IPv6",
        }
    }
}

/// The deleted Node as seen from one survivor: everything needed to recognise entries about it.
#[derive(Debug, Clone)]
pub struct Target {
    pub survivor: String,
    pub cidrs: Vec<IpNet>,
    pub node_ips: Vec<IpAddr>,
    pub pod_ip: IpAddr,
    /// The ClusterIP of a Service backed by the Node's pod and the survivor's.
    pub shared_service_ip: IpAddr,
    /// The ClusterIP of a Service backed by the Node's pod alone.
    pub sole_service_ip: IpAddr,
    /// flannel: the Node's lease (read before the deletion) and the backend; `None` for netcm alone.
    pub flannel: Option<(Backend, SubnetLease)>,
    pub cluster_cidrs: Vec<IpNet>,
}

/// The entries `holder` keeps about the target in the survivor's namespace now, one line each.
pub async fn present(holder: Holder, t: &Target) -> Vec<String> {
    let node = t.survivor.as_str();
    match holder {
        Holder::NetcmRoutes => {
            let mut out = Vec::new();
            for family in ["-4", "-6"] {
                for r in
                    in_node_json(node, &["ip", "-j", family, "route", "show", "proto", "199"]).await
                {
                    let dst = r["dst"].as_str().and_then(|d| d.parse::<IpNet>().ok());
                    if dst.is_some_and(|d| t.cidrs.contains(&d)) {
                        out.push(format!("{} via {}", r["dst"], r["gateway"]));
                    }
                }
            }
            out
        }
        Holder::FlannelRoutes | Holder::FlannelVtep => {
            let Some((backend, lease)) = &t.flannel else {
                return Vec::new();
            };
            let theirs = flannel_routes::expected(node, *backend, std::slice::from_ref(lease));
            let have = flannel_routes::programmed(node, *backend, &t.cluster_cidrs).await;
            let routes = holder == Holder::FlannelRoutes;
            have.intersection(&theirs)
                .filter(|e| e.starts_with("route ") == routes)
                .cloned()
                .collect()
        }
        Holder::ConntrackService | Holder::ConntrackServiceEmptied | Holder::ConntrackPod => {
            let (_, out) = in_node(node, &["conntrack", "-L", "-p", "udp"]).await;
            out.lines()
                .filter(|l| {
                    let (orig_dst, reply_src) = conntrack_addresses(l);
                    let dst = match holder {
                        Holder::ConntrackService => t.shared_service_ip,
                        Holder::ConntrackServiceEmptied => t.sole_service_ip,
                        _ => return orig_dst == Some(t.pod_ip),
                    };
                    orig_dst == Some(dst) && reply_src == Some(t.pod_ip)
                })
                .map(str::to_string)
                .collect()
        }
        Holder::Neighbour => {
            let mut out = Vec::new();
            for ip in &t.node_ips {
                for n in
                    in_node_json(node, &["ip", "-j", "neigh", "show", "to", &ip.to_string()]).await
                {
                    out.push(format!("{ip} dev {} {}", n["dev"], n["state"]));
                }
            }
            out
        }
    }
}

/// An entry as it is compared between two readings: a conntrack line without its countdown (its third
/// field), so a change means a changed entry, not a second gone by.
pub fn without_countdown(entry: &str) -> String {
    let mut words: Vec<&str> = entry.split_whitespace().collect();
    if words.first() == Some(&"udp") && words.len() > 2 {
        words.remove(2);
    }
    words.join(" ")
}

/// A `conntrack -L` line's original destination and reply source (the second `src=`): who the flow was
/// sent to and who answers it after NAT.
pub fn conntrack_addresses(line: &str) -> (Option<IpAddr>, Option<IpAddr>) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let field = |key: &str, nth: usize| {
        words
            .iter()
            .filter_map(|w| w.strip_prefix(key))
            .nth(nth)
            .and_then(|v| v.parse().ok())
    };
    (field("dst=", 0), field("src=", 1))
}

/// The settings that bound how long the kernel keeps what it learned, read in the node's namespace
/// (net sysctls are per namespace): (path under /proc/sys/net, value).
pub async fn forget_sysctls(node: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for key in [
        "netfilter/nf_conntrack_udp_timeout",
        "netfilter/nf_conntrack_udp_timeout_stream",
        "netfilter/nf_conntrack_tcp_timeout_established",
        "ipv4/neigh/eth0/base_reachable_time_ms",
        "ipv4/neigh/eth0/gc_stale_time",
        "ipv4/neigh/eth0/delay_first_probe_time",
        "ipv4/neigh/eth0/ucast_solicit",
        "ipv4/neigh/eth0/mcast_solicit",
        "ipv4/neigh/eth0/retrans_time_ms",
        "ipv4/neigh/default/gc_interval",
        "ipv4/neigh/default/gc_thresh1",
        "ipv6/neigh/eth0/base_reachable_time_ms",
        "ipv6/neigh/eth0/gc_stale_time",
    ] {
        let path = format!("/proc/sys/net/{key}");
        // The table's own settings (`neigh/default/gc_*`) exist only in the host's namespace: one table
        // for every namespace.
        let (ok, value) = if key.contains("default/gc_") {
            let v = std::fs::read_to_string(&path);
            (v.is_ok(), v.unwrap_or_default())
        } else {
            in_node(node, &["cat", &path]).await
        };
        out.push((
            key.to_string(),
            if ok {
                value.trim().to_string()
            } else {
                "unreadable".into()
            },
        ));
    }
    out
}

/// How many neighbour entries the node's namespace holds now, of each family (the kernel's periodic
/// collection of stale entries skips a table below `gc_thresh1`).
pub async fn neighbour_count(node: &str) -> (usize, usize) {
    (
        in_node_json(node, &["ip", "-j", "-4", "neigh", "show"])
            .await
            .len(),
        in_node_json(node, &["ip", "-j", "-6", "neigh", "show"])
            .await
            .len(),
    )
}

/// The set of every holder's entries at once, for a log line.
pub async fn snapshot(holders: &[Holder], t: &Target) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for h in holders {
        for e in present(*h, t).await {
            all.insert(format!("{h:?}: {e}"));
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dnat_entry_names_the_service_as_destination_and_the_pod_as_replier() {
        let line = "udp      17 117 src=198.19.254.11 dst=198.19.17.40 sport=40001 dport=8080 \
                    src=198.19.130.5 dst=198.19.254.11 sport=8080 dport=40001 [ASSURED] mark=0 use=1";
        assert_eq!(
            conntrack_addresses(line),
            (
                Some("198.19.17.40".parse().unwrap()),
                Some("198.19.130.5".parse().unwrap())
            )
        );
    }

    #[test]
    fn an_unreplied_entry_still_has_both_tuples() {
        let line =
            "udp      17 29 src=198.19.254.11 dst=198.19.130.5 sport=40002 dport=8080 [UNREPLIED] \
                    src=198.19.130.5 dst=198.19.254.11 sport=8080 dport=40002 mark=0 use=1";
        let (dst, reply) = conntrack_addresses(line);
        assert_eq!(dst, reply);
        assert_eq!(
            without_countdown(line),
            without_countdown(&line.replace(" 29 ", " 28 "))
        );
        assert_eq!(
            conntrack_addresses("conntrack v1.4.8: 0 flow entries"),
            (None, None)
        );
    }
}
