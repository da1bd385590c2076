//! Real flannel agents: simulated nodes as network namespaces on one LAN, each able to run a real flanneld
//! (built from its Go module by `hack/controlplane.sh bin flanneld`) in kube-subnet-manager mode against
//! the test API server, and what that flanneld programmed, read back from its namespace.
//!
//! The LAN is a bridge in a namespace of its own; each host's `eth0` is a veth port on it, so host-gw
//! gateways are on-link and vxlan packets have somewhere to go. Nothing touches the root namespace.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use ipnet::IpNet;

use crate::netcm::stop;
use crate::netns::{Forwarder, NetNs};
use crate::wait_for;

/// The flanneld binary, built (once per cache) by `hack/controlplane.sh bin flanneld`.
pub fn flanneld_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| crate::tool("flanneld"))
}

/// A LAN: a bridge `br0` in a namespace of its own.
pub struct Lan {
    switch: NetNs,
    ports: AtomicU32,
}

/// A simulated node's host: a namespace plugged into the LAN as `eth0`, with the API server reachable
/// inside it on the kubeconfig's own address.
pub struct Host {
    pub ns: NetNs,
    /// The address on `eth0` (without prefix length).
    pub address: String,
    _forwarder: Forwarder,
}

impl Lan {
    /// Creates the switch namespace and its bridge.
    pub fn new() -> Lan {
        let switch = NetNs::create();
        switch.ip(&["link", "add", "br0", "type", "bridge"]);
        switch.ip(&["link", "set", "br0", "up"]);
        Lan {
            switch,
            ports: AtomicU32::new(0),
        }
    }

    /// A new host on the LAN with `address` (CIDR notation, IPv4) on its `eth0`. Call from a
    /// multi-threaded tokio runtime (the API forwarder runs on it).
    pub fn host(&self, address: &str, kubeconfig: &Path) -> Host {
        let ns = NetNs::create();
        let port = format!("port{}", self.ports.fetch_add(1, Ordering::SeqCst));
        ns.ip(&[
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &self.switch.name,
        ]);
        self.switch.ip(&["link", "set", &port, "master", "br0"]);
        self.switch.ip(&["link", "set", &port, "up"]);
        ns.ip(&["addr", "add", address, "dev", "eth0"]);
        ns.ip(&["link", "set", "eth0", "up"]);
        let forwarder = ns.forward_apiserver(kubeconfig);
        let address = address.split('/').next().unwrap_or(address).to_string();
        Host {
            ns,
            address,
            _forwarder: forwarder,
        }
    }
}

impl Default for Lan {
    fn default() -> Self {
        Self::new()
    }
}

/// One IPv4 route as flannel programs it: the gateway and the device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Via {
    pub gateway: IpAddr,
    pub dev: String,
}

impl Host {
    /// The main table's IPv4 routes with a gateway whose destination lies inside `network`.
    pub fn routes_within(&self, network: IpNet) -> BTreeMap<IpNet, Via> {
        let json = self.ns.ip(&["-j", "-4", "route", "show", "table", "main"]);
        let routes: Vec<serde_json::Value> = serde_json::from_str(json.trim())
            .unwrap_or_else(|e| panic!("parsing `ip -j route` output {json:?}: {e}"));
        routes
            .iter()
            .filter_map(|r| {
                let dst: IpNet = r.get("dst")?.as_str()?.parse().ok()?;
                let gateway: IpAddr = r.get("gateway")?.as_str()?.parse().ok()?;
                let dev = r.get("dev")?.as_str()?.to_string();
                network
                    .contains(&dst)
                    .then_some((dst, Via { gateway, dev }))
            })
            .collect()
    }

    /// `bridge fdb show dev <dev>` in this namespace (a vxlan device's forwarding entries).
    pub fn fdb(&self, dev: &str) -> String {
        let out = Command::new("bridge")
            .args(["-n", &self.ns.name, "fdb", "show", "dev", dev])
            .output()
            .unwrap_or_else(|e| panic!("running bridge fdb (iproute2): {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A flanneld running in a host's namespace; killed on drop, its log tail printed if the test is failing.
pub struct Flanneld {
    child: Option<std::process::Child>,
    pub label: String,
    pub log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Flanneld {
    /// Starts flanneld for Node `node` in `host`'s namespace: `--kube-subnet-mgr` against `kubeconfig`, the
    /// network `network` with `backend` (`host-gw`, `vxlan`), `eth0` as its interface, no iptables rules
    /// (`--ip-masq=false --iptables-forward-rules=false`). Its net-conf, subnet file and log live in a
    /// temporary directory.
    pub fn start(
        label: &str,
        host: &Host,
        kubeconfig: &Path,
        node: &str,
        network: &str,
        backend: &str,
    ) -> Flanneld {
        // flanneld exits at once without br_netfilter; say why here rather than in its log.
        assert!(
            Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists(),
            "flanneld needs the br_netfilter kernel module (hack/install-prereqs.sh loads it)"
        );
        let binary = flanneld_binary();
        let dir = tempfile::tempdir().expect("tempdir");
        let net_conf = dir.path().join("net-conf.json");
        let conf = serde_json::json!({ "Network": network, "Backend": { "Type": backend } });
        std::fs::write(&net_conf, conf.to_string()).expect("write net-conf.json");
        let log_path = dir.path().join(format!("{label}.log"));
        let log = std::fs::File::create(&log_path).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &host.ns.name])
            .arg(binary)
            .arg("--kube-subnet-mgr")
            .arg(format!("--kubeconfig-file={}", kubeconfig.display()))
            .arg(format!("--net-config-path={}", net_conf.display()))
            .arg(format!(
                "--subnet-file={}",
                dir.path().join("subnet.env").display()
            ))
            .args([
                "--iface=eth0",
                "--ip-masq=false",
                "--iptables-forward-rules=false",
                "-v=2",
            ])
            .env("NODE_NAME", node)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {label} ({}): {e}", binary.display()));
        Flanneld {
            child: Some(child),
            label: label.to_string(),
            log_path,
            _dir: dir,
        }
    }

    /// The log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Panics at once if flanneld has exited, with its log tail.
    pub fn assert_running(&mut self) {
        let exited = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        assert!(
            exited.is_none(),
            "{} exited ({exited:?}); its log:\n{}",
            self.label,
            self.logs()
        );
    }

    /// Waits until the log contains `needle`; fails at once if flanneld exits first.
    pub async fn wait_log(&mut self, needle: &str, timeout: Duration) {
        let what = format!("{} to log {needle:?}", self.label);
        wait_for(&what, timeout, || {
            self.assert_running();
            let found = self.logs().contains(needle).then_some(());
            async move { found }
        })
        .await;
    }
}

impl Drop for Flanneld {
    fn drop(&mut self) {
        stop(self.child.take(), &self.label, &self.log_path);
    }
}
