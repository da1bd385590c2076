//! The network path between a netcm process in its own network namespace and its API server, and the
//! faults on it: delay and loss. Used by the chaos campaign (`src/bin/chaos`, one path per replica).
//!
//! The API server listens on the root namespace's 127.0.0.1; the process reaches it through a listener
//! on its namespace's 127.0.0.1:<same port> whose connections the caller's tokio runtime relays (the
//! trick of [`NetNs::forward_apiserver`], here with a delay the relay can apply). Delay and loss come
//! from `tc qdisc … netem` on the namespace's loopback when the kernel has netem ([`probe_netem`]);
//! without it, delay is added by the relay (each chunk is held for the delay, order kept) and loss by an
//! iptables `statistic` DROP rule on the namespace's loopback, so packets are really lost and TCP really
//! retransmits.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::netns::NetNs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How delay and loss are applied on this machine, found once by [`probe_netem`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mechanism {
    /// `tc qdisc add dev lo root netem delay … loss …` in the path's namespace.
    Netem,
    /// Delay in the relay, loss by iptables; the reason netem is not used.
    RelayAndIptables(String),
}

/// Tries `tc qdisc … netem` in `ns` (and removes it again).
pub fn probe_netem(ns: &NetNs) -> Mechanism {
    match ip_netns_exec(
        &ns.name,
        &[
            "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
        ],
    ) {
        Ok(()) => {
            let _ = ip_netns_exec(&ns.name, &["tc", "qdisc", "del", "dev", "lo", "root"]);
            Mechanism::Netem
        }
        Err(e) => Mechanism::RelayAndIptables(e),
    }
}

/// Runs `ip netns exec <ns> args…`; the command's stderr on failure.
fn ip_netns_exec(ns: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .map_err(|e| format!("running {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The port of a kubeconfig's `https://127.0.0.1:<port>` server.
pub fn apiserver_port(kubeconfig: &Path) -> Result<u16, String> {
    let text = std::fs::read_to_string(kubeconfig)
        .map_err(|e| format!("read {}: {e}", kubeconfig.display()))?;
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .ok_or_else(|| format!("no server in {}", kubeconfig.display()))?;
    server
        .strip_prefix("https://127.0.0.1:")
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or_else(|| format!("expected an API server on https://127.0.0.1:<port>, got {server}"))
}

/// A relay from a namespace's 127.0.0.1:`port` to the root namespace's, with an adjustable delay.
pub struct ApiPath {
    ns: String,
    delay_ms: Arc<AtomicU64>,
    mechanism: Mechanism,
    task: tokio::task::JoinHandle<()>,
}

impl ApiPath {
    /// Starts relaying `port` into `ns`. Call from a multi-threaded tokio runtime.
    pub fn open(ns: &NetNs, port: u16, mechanism: Mechanism) -> Result<ApiPath, String> {
        let listener = ns
            .run(move || std::net::TcpListener::bind(("127.0.0.1", port)))
            .map_err(|e| format!("listen on 127.0.0.1:{port} in {}: {e}", ns.name))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("non-blocking listener: {e}"))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("tokio listener: {e}"))?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let delay_ms = delay_ms.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let delay_ms = delay_ms.clone();
                    tokio::spawn(async move {
                        let Ok(outbound) = TcpStream::connect(("127.0.0.1", port)).await else {
                            return;
                        };
                        let (ri, wi) = inbound.into_split();
                        let (ro, wo) = outbound.into_split();
                        tokio::join!(relay(ri, wo, delay_ms.clone()), relay(ro, wi, delay_ms));
                    });
                }
            }
        });
        Ok(ApiPath {
            ns: ns.name.clone(),
            delay_ms,
            mechanism,
            task,
        })
    }

    /// Degrades the path: `delay` each way and `loss_percent` of packets dropped.
    pub fn degrade(&self, delay: Duration, loss_percent: u64) -> Result<(), String> {
        match &self.mechanism {
            Mechanism::Netem => {
                let delay = format!("{}ms", delay.as_millis());
                let loss = format!("{loss_percent}%");
                ip_netns_exec(
                    &self.ns,
                    &[
                        "tc", "qdisc", "replace", "dev", "lo", "root", "netem", "delay", &delay,
                        "loss", &loss,
                    ],
                )
            }
            Mechanism::RelayAndIptables(_) => {
                let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                self.delay_ms.store(millis, Ordering::SeqCst);
                if loss_percent == 0 {
                    return Ok(());
                }
                let p = format!("{:.2}", loss_percent as f64 / 100.0);
                ip_netns_exec(
                    &self.ns,
                    &[
                        "iptables",
                        "-A",
                        "OUTPUT",
                        "-o",
                        "lo",
                        "-m",
                        "statistic",
                        "--mode",
                        "random",
                        "--probability",
                        &p,
                        "-j",
                        "DROP",
                    ],
                )
            }
        }
    }

    /// Removes every delay and loss.
    pub fn heal(&self) -> Result<(), String> {
        self.delay_ms.store(0, Ordering::SeqCst);
        match &self.mechanism {
            Mechanism::Netem => {
                ip_netns_exec(&self.ns, &["tc", "qdisc", "del", "dev", "lo", "root"])
            }
            Mechanism::RelayAndIptables(_) => {
                ip_netns_exec(&self.ns, &["iptables", "-F", "OUTPUT"])
            }
        }
    }
}

impl Drop for ApiPath {
    fn drop(&mut self) {
        let _ = self.heal();
        self.task.abort();
    }
}

/// Copies one direction of a connection, holding each chunk for the delay current when it was read.
async fn relay(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay_ms: Arc<AtomicU64>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let at =
                        Instant::now() + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                    if tx.send((at, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
