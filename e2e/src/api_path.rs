//! The network path between a netcm process in its own network namespace and its API server, and the
//! faults on it: delay and loss. Used by the chaos campaign (`src/bin/chaos`, one path per replica) and by
//! the e2e test of a leader behind a 300 ms, 5 % lossy path (`tests/e2e/faults_outside_the_api.rs`),
//! which reads back what the path did ([`ApiPath::round_trip`], [`ApiPath::dropped_packets`]).
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
    ip_netns_stdout(ns, args).map(drop)
}

/// Runs `ip netns exec <ns> args…`; its stdout, or its stderr on failure.
fn ip_netns_stdout(ns: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .map_err(|e| format!("running {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
    port: u16,
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
            port,
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

    /// How the path applies delay and loss.
    pub fn mechanism(&self) -> &Mechanism {
        &self.mechanism
    }

    /// One round trip through the path, as a process in the namespace sees it: from sending a plaintext
    /// HTTP request to 127.0.0.1:`port` to the first byte of the API server's answer (its TLS listener
    /// answers `HTTP/1.0 400 Bad Request`; the end of a connection is not delayed by the relay, so the
    /// answer must have a byte). Runs on a blocking thread inside the namespace, so the relay keeps
    /// running on the caller's runtime.
    pub async fn round_trip(&self) -> Result<Duration, String> {
        let (ns, port) = (self.ns.clone(), self.port);
        tokio::task::spawn_blocking(move || {
            crate::netns::in_netns(&ns, move || -> Result<Duration, String> {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
                    .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .map_err(|e| format!("read timeout: {e}"))?;
                let sent = std::time::Instant::now();
                s.write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
                    .map_err(|e| format!("send through the path: {e}"))?;
                let mut first = [0u8; 1];
                match s.read(&mut first) {
                    Ok(1) => Ok(sent.elapsed()),
                    Ok(_) => Err("the API server closed the connection without a byte".into()),
                    Err(e) => Err(format!("no answer through the path: {e}")),
                }
            })
        })
        .await
        .map_err(|e| format!("round-trip thread: {e}"))?
    }

    /// How many packets the loss has dropped so far in the namespace: the packet counters of the
    /// iptables DROP rules on its OUTPUT chain, or netem's `dropped` count.
    pub fn dropped_packets(&self) -> Result<u64, String> {
        match &self.mechanism {
            Mechanism::Netem => {
                let out = ip_netns_stdout(&self.ns, &["tc", "-s", "qdisc", "show", "dev", "lo"])?;
                out.split("dropped ")
                    .skip(1)
                    .map(|rest| {
                        let n = rest.split(|c: char| !c.is_ascii_digit()).next();
                        n.and_then(|n| n.parse::<u64>().ok())
                            .ok_or_else(|| format!("no count after `dropped` in {out:?}"))
                    })
                    .sum()
            }
            Mechanism::RelayAndIptables(_) => {
                let out =
                    ip_netns_stdout(&self.ns, &["iptables", "-L", "OUTPUT", "-v", "-x", "-n"])?;
                Ok(iptables_dropped(&out))
            }
        }
    }
}

/// The sum of the packet counters of the DROP rules in `iptables -L <chain> -v -x -n` output.
fn iptables_dropped(listing: &str) -> u64 {
    listing
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let packets = fields.next()?.parse::<u64>().ok()?;
            let _bytes = fields.next()?;
            (fields.next()? == "DROP").then_some(packets)
        })
        .sum()
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

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_drop_rules_packets_count_as_dropped() {
        let listing = "\
Chain OUTPUT (policy ACCEPT 4521 packets, 2310876 bytes)
    pkts      bytes target     prot opt in     out     source               destination
     231    40112 DROP       0    --  *      lo      0.0.0.0/0            0.0.0.0/0            statistic mode random probability 0.04999999981
      17     1020 ACCEPT     0    --  *      lo      0.0.0.0/0            0.0.0.0/0
";
        assert_eq!(super::iptables_dropped(listing), 231);
        assert_eq!(
            super::iptables_dropped("Chain OUTPUT (policy ACCEPT 0 packets, 0 bytes)\n"),
            0
        );
    }
}
