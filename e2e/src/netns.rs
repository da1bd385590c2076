//! Network namespaces for route tests: a fresh namespace per test (deleted on drop), an on-link subnet
//! made of a veth pair whose both ends live in it, its routing tables read back through `ip -j`, the API
//! server reachable from inside it, and netcm started inside it.
//!
//! Reaching the API server: it listens on the root namespace's 127.0.0.1, and inside a fresh namespace
//! 127.0.0.1 is that namespace's own loopback. A socket belongs to the namespace of the thread that
//! created it, so the harness creates a listener on 127.0.0.1:<apiserver port> from a short-lived thread
//! that entered the namespace (`setns`), and serves it from the test's runtime, connecting each accepted
//! connection to the root namespace's 127.0.0.1:<port>. The kubeconfig and the serving certificate stay
//! valid unchanged. The same trick reads netcm's /metrics inside the namespace. Runtime threads never
//! enter a namespace.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sched::{setns, CloneFlags};
use serde::Deserialize;

use crate::netcm::NetcmProcess;

/// Every namespace this harness creates starts with this, followed by the test process id.
const PREFIX: &str = "netcm-e2e-";

fn run_ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip {args:?}: {e} (is iproute2 installed?)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `f` on a fresh thread inside the namespace `name` and returns its result.
pub(crate) fn in_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let ns = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        setns(&ns, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
        f()
    })
    .join()
    .expect("thread inside the namespace")
}

/// Deletes namespaces left behind by test processes that no longer exist (a killed run).
fn remove_stale() {
    let Ok(list) = run_ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = run_ip(&["netns", "del", name]);
        }
    }
}

/// One route as `ip -j route show` prints it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct KernelRoute {
    pub dst: String,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    /// The nexthop object the route names, if it names one.
    #[serde(default)]
    pub nhid: Option<u32>,
}

/// One nexthop object as `ip -j nexthop show` prints it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct KernelNexthop {
    pub id: u32,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
}

/// A network namespace, deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates a namespace with a unique name and its loopback up. Fails loudly without `ip` or root.
    pub fn create() -> NetNs {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        remove_stale();
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        run_ip(&["netns", "add", &name]).unwrap_or_else(|e| {
            panic!("creating a network namespace needs root and iproute2: {e}")
        });
        let ns = NetNs { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n <ns> args…`; returns stdout, panics with ip's message on failure.
    pub fn ip(&self, args: &[&str]) -> String {
        self.try_ip(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `ip -n <ns> args…`; ip's message on failure.
    pub fn try_ip(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_ip(&all)
    }

    /// Gives the namespace on-link subnets: a veth pair `v0`/`v1` whose both ends live in it (the `dummy`
    /// link type is not available everywhere), both up, with `addresses` (CIDR notation, v4 or v6) on v0.
    pub fn add_subnets(&self, addresses: &[&str]) {
        self.ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"]);
        for a in addresses {
            if a.contains(':') {
                self.ip(&["-6", "addr", "add", a, "dev", "v0", "nodad"]);
            } else {
                self.ip(&["addr", "add", a, "dev", "v0"]);
            }
        }
        self.ip(&["link", "set", "v0", "up"]);
        self.ip(&["link", "set", "v1", "up"]);
    }

    /// IPv4 and IPv6 routes of `table`, optionally only those of `protocol`.
    pub fn routes(&self, table: &str, protocol: Option<&str>) -> Vec<KernelRoute> {
        let mut out = Vec::new();
        for family in ["-4", "-6"] {
            let mut args = vec!["-j", family, "route", "show", "table", table];
            if let Some(p) = protocol {
                args.extend(["proto", p]);
            }
            let json = self.table_dump(&args);
            let json = if json.trim().is_empty() {
                "[]"
            } else {
                json.trim()
            };
            let routes: Vec<KernelRoute> = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("parsing `ip {args:?}` output {json:?}: {e}"));
            out.extend(routes);
        }
        out
    }

    /// Every nexthop object of the namespace.
    pub fn nexthops(&self) -> Vec<KernelNexthop> {
        let json = self.ip(&["-j", "nexthop", "show"]);
        let json = if json.trim().is_empty() {
            "[]"
        } else {
            json.trim()
        };
        serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("parsing `ip -j nexthop show` output {json:?}: {e}"))
    }

    /// How many IPv4 and IPv6 routes `table` holds of `protocol` (cheap enough to poll with thousands).
    pub fn route_count(&self, table: &str, protocol: &str) -> usize {
        ["-4", "-6"]
            .iter()
            .map(|f| {
                self.table_dump(&[f, "route", "show", "table", table, "proto", protocol])
                    .lines()
                    .count()
            })
            .sum()
    }

    /// `ip route show table …` output; a table that does not exist yet (no route ever) is empty.
    fn table_dump(&self, args: &[&str]) -> String {
        match self.try_ip(args) {
            Ok(out) => out,
            Err(e) if e.contains("table does not exist") => String::new(),
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs `f` on a fresh thread inside this namespace (sockets it creates live in the namespace).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_netns(&self.name, f)
    }

    /// Makes the root namespace's 127.0.0.1:`port` reachable as 127.0.0.1:`port` inside this namespace
    /// while the returned forwarder lives. Call from a multi-threaded tokio runtime.
    pub fn forward_from_root(&self, port: u16) -> Forwarder {
        let listener = self
            .run(move || std::net::TcpListener::bind(("127.0.0.1", port)))
            .unwrap_or_else(|e| panic!("listening on 127.0.0.1:{port} inside the namespace: {e}"));
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Forwarder { task }
    }

    /// Forwards the API server of `kubeconfig` (a `https://127.0.0.1:<port>` server) into this namespace.
    pub fn forward_apiserver(&self, kubeconfig: &Path) -> Forwarder {
        let text = std::fs::read_to_string(kubeconfig).expect("read kubeconfig");
        let server = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .expect("server in kubeconfig");
        let port: u16 = server
            .strip_prefix("https://127.0.0.1:")
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| {
                panic!("expected an API server on https://127.0.0.1:<port>, got {server}")
            });
        self.forward_from_root(port)
    }

    /// A port free on 127.0.0.1 inside this namespace.
    pub fn free_port(&self) -> u16 {
        self.run(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
        })
        .expect("free port inside the namespace")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run_ip(&["netns", "del", &self.name]);
    }
}

/// A running forwarder; stops accepting on drop.
pub struct Forwarder {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// netcm running inside a network namespace (`ip netns exec`), with the test defaults of
/// [`crate::Netcm::start`]: its HTTP port on the namespace's loopback, Lease in kube-system, -v=2.
pub struct NetnsNetcm {
    process: NetcmProcess,
    netns: String,
    pub port: u16,
}

impl std::ops::Deref for NetnsNetcm {
    type Target = NetcmProcess;
    fn deref(&self) -> &NetcmProcess {
        &self.process
    }
}

impl std::ops::DerefMut for NetnsNetcm {
    fn deref_mut(&mut self) -> &mut NetcmProcess {
        &mut self.process
    }
}

impl NetnsNetcm {
    /// Starts netcm in `ns` against `kubeconfig` (its API server forwarded into `ns`), then `args`, with
    /// extra environment variables.
    pub fn start(
        label: &str,
        ns: &NetNs,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> NetnsNetcm {
        let port = ns.free_port();
        // `ip netns exec` enters the namespace and execs netcm: the child's pid is netcm's.
        let wrapper = ["ip", "netns", "exec", ns.name.as_str()];
        let harness = [format!("--port={port}")];
        NetnsNetcm {
            process: NetcmProcess::spawn(label, &wrapper, kubeconfig, &harness, args, env),
            netns: ns.name.clone(),
            port,
        }
    }

    /// GET a path on netcm's HTTP port inside the namespace: (status, body).
    pub async fn http_get(&self, path: &str) -> Option<(u16, String)> {
        let (netns, port, path) = (self.netns.clone(), self.port, path.to_string());
        let text = tokio::task::spawn_blocking(move || {
            in_netns(&netns, move || -> std::io::Result<String> {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
                let mut buf = String::new();
                s.read_to_string(&mut buf)?;
                Ok(buf)
            })
        })
        .await
        .ok()?
        .ok()?;
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((code, body))
    }

    /// The value of one sample in /metrics (`name{labels}` exactly as printed, or a bare name).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics").await?;
        crate::netcm::sample(&body, series)
    }
}
