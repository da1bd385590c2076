//! The real `netcm` binary as a child process: its log in a file (printed when the test fails), its HTTP
//! endpoints, signals.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{repo_root, wait_for, LEASE_NAMESPACE};

/// The binary: `NETCM_BIN` if set (the benchmarks use a release build), else built once per run with
/// the test-only fault hooks (`--features test-faults`), which the tests of faults no outside action can
/// cause need; `hack/test.sh` refuses an inherited `NETCM_BIN`, so CI always tests this build.
pub fn netcm_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("NETCM_BIN") {
            return PathBuf::from(bin);
        }
        workspace_binary_with("netcm", "netcm", &["test-faults"])
    })
}

/// A binary of the workspace, built (debug) now.
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    workspace_binary_with(package, bin, &[])
}

/// A binary of the workspace built (debug) now with `features`.
fn workspace_binary_with(package: &str, bin: &str, features: &[&str]) -> PathBuf {
    let mut args = vec!["build", "--quiet", "-p", package, "--bin", bin];
    let features = features.join(",");
    if !features.is_empty() {
        args.extend(["--features", features.as_str()]);
    }
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(&args)
        .current_dir(repo_root())
        .status()
        .unwrap_or_else(|e| panic!("run cargo build -p {package}: {e}"));
    assert!(status.success(), "cargo build -p {package} failed");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target"));
    target.join("debug").join(bin)
}

/// Two distinct free ports for `--port` and `--secure-port`. Both listeners are held until both ports
/// are known: binding, dropping and binding again can get the same port back, and netcm then refuses to
/// start (`--secure-port and --port must differ`), which failed a CI run.
fn free_port_pair() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    let port = |l: &std::net::TcpListener| l.local_addr().expect("bound address").port();
    let (first, second) = (bind(), bind());
    (port(&first), port(&second))
}

/// A spawned netcm and its log file: what [`Netcm`] and [`crate::netns::NetnsNetcm`] share. Killed on
/// drop; its log tail is printed when the test is failing.
pub struct NetcmProcess {
    child: Option<std::process::Child>,
    pub log_path: PathBuf,
    pub label: String,
    _dir: tempfile::TempDir,
}

impl NetcmProcess {
    /// Runs `wrapper… netcm --kubeconfig=… <test defaults> harness_args… args…` with `env`, logging to a
    /// temporary file. Test defaults: Lease in kube-system, -v=2, no inherited RUST_LOG/NODE_NAME/POD_NAME.
    pub fn spawn(
        label: &str,
        wrapper: &[&str],
        kubeconfig: &Path,
        harness_args: &[String],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> NetcmProcess {
        let cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(netcm_binary());
                cmd
            }
            None => Command::new(netcm_binary()),
        };
        Self::spawn_command(label, cmd, kubeconfig, harness_args, args, env)
    }

    /// [`NetcmProcess::spawn`] of another program that takes netcm's generic flags (a manager with
    /// other controllers, such as `netcm-example`).
    pub fn spawn_command(
        label: &str,
        mut cmd: Command,
        kubeconfig: &Path,
        harness_args: &[String],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> NetcmProcess {
        let dir = tempfile::tempdir().expect("tempdir");
        let log_path = dir.path().join(format!("{label}.log"));
        let log = std::fs::File::create(&log_path).expect("log file");
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--bind-address=127.0.0.1")
            .args(harness_args)
            .arg(format!(
                "--leader-elect-resource-namespace={LEASE_NAMESPACE}"
            ))
            .arg("-v=2")
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("NODE_NAME")
            .env_remove("POD_NAME")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {label} ({cmd:?}): {e}"));
        NetcmProcess {
            child: Some(child),
            log_path,
            label: label.to_string(),
            _dir: dir,
        }
    }

    /// The log so far: shown when a test fails, and read by the few tests whose subject is the log
    /// itself. Waits and assertions use the metrics ([`Netcm::wait_metric`]) and the API's state.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Panics at once if the process has exited (so a crash fails the test now, not at a timeout).
    pub fn assert_running(&self) {
        let exited = self
            .child
            .as_ref()
            .and_then(|c| std::fs::read_to_string(format!("/proc/{}/stat", c.id())).ok())
            .map(|stat| stat.split_whitespace().nth(2) == Some("Z"))
            .unwrap_or(true);
        assert!(!exited, "{} exited unexpectedly", self.label);
    }

    /// This process's leader-election identity, from the `identity` field of its startup log record:
    /// before it leads, the only place a replica shows it (the Lease names only the holder).
    pub async fn identity(&self) -> String {
        let label = self.label.clone();
        wait_for(
            &format!("{label} to log its identity"),
            Duration::from_secs(30),
            || async {
                let found = self.logs().lines().find_map(|l| {
                    let rest = l.split(" identity=").nth(1)?;
                    Some(
                        rest.split_whitespace()
                            .next()?
                            .trim_matches('"')
                            .to_string(),
                    )
                });
                if found.is_none() {
                    self.assert_running();
                }
                found
            },
        )
        .await
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Sends a signal by name (TERM, KILL, STOP, CONT).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args(["-s", sig, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -s {sig} {} failed", self.pid());
    }

    /// The exit status if the process has exited.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let label = self.label.clone();
        wait_for(&format!("{label} to exit"), timeout, || {
            let s = self.try_exit();
            async move { s }
        })
        .await
    }
}

impl Drop for NetcmProcess {
    fn drop(&mut self) {
        stop(self.child.take(), &self.label, &self.log_path);
    }
}

/// A running netcm on the test's own network (loopback HTTP and HTTPS ports).
pub struct Netcm {
    process: NetcmProcess,
    pub port: u16,
    /// `--secure-port`: HTTPS with TokenReview / SubjectAccessReview.
    pub secure_port: u16,
}

impl std::ops::Deref for Netcm {
    type Target = NetcmProcess;
    fn deref(&self) -> &NetcmProcess {
        &self.process
    }
}

impl std::ops::DerefMut for Netcm {
    fn deref_mut(&mut self) -> &mut NetcmProcess {
        &mut self.process
    }
}

impl Netcm {
    /// Starts netcm against `kubeconfig` with test defaults (loopback HTTP on a free port, Lease in
    /// kube-system, -v=2) followed by `args` (later flags win).
    pub fn start(label: &str, kubeconfig: &Path, args: &[&str]) -> Netcm {
        Self::start_with_env(label, kubeconfig, args, &[])
    }

    /// Like [`Netcm::start`] with extra environment variables.
    pub fn start_with_env(
        label: &str,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Netcm {
        let (port, secure_port) = free_port_pair();
        let harness = [
            format!("--port={port}"),
            format!("--secure-port={secure_port}"),
        ];
        Netcm {
            process: NetcmProcess::spawn(label, &[], kubeconfig, &harness, args, env),
            port,
            secure_port,
        }
    }

    /// Like [`Netcm::start`] for another manager binary (`program`), e.g. [`workspace_binary`].
    pub fn start_program(label: &str, program: &Path, kubeconfig: &Path, args: &[&str]) -> Netcm {
        let (port, secure_port) = free_port_pair();
        let harness = [
            format!("--port={port}"),
            format!("--secure-port={secure_port}"),
        ];
        Netcm {
            process: NetcmProcess::spawn_command(
                label,
                Command::new(program),
                kubeconfig,
                &harness,
                args,
                &[],
            ),
            port,
            secure_port,
        }
    }

    /// Like [`Netcm::start`], run under `wrapper` (e.g. `["prlimit", "--nofile=64:64"]`).
    pub fn start_wrapped(label: &str, wrapper: &[&str], kubeconfig: &Path, args: &[&str]) -> Netcm {
        let (port, secure_port) = free_port_pair();
        let harness = [
            format!("--port={port}"),
            format!("--secure-port={secure_port}"),
        ];
        Netcm {
            process: NetcmProcess::spawn(label, wrapper, kubeconfig, &harness, args, &[]),
            port,
            secure_port,
        }
    }

    /// GET a path on the metrics/health port: (status, body).
    pub async fn http_get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((code, body))
    }

    /// GET a path on the secure port with an optional bearer token (curl, as a scraper would): (status, body).
    pub fn https_get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"]);
        if let Some(t) = token {
            cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
        }
        let out = cmd
            .arg(format!("https://127.0.0.1:{}{path}", self.secure_port))
            .output()
            .expect("run curl (hack/install-prereqs.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// Waits until the HTTP endpoint answers at all.
    pub async fn wait_http(&self, timeout: Duration) {
        wait_for(&format!("{} to serve HTTP", self.label), timeout, || {
            self.http_get("/healthz")
        })
        .await;
    }

    /// The value of one sample in /metrics (`name{labels}` exactly as printed, or a bare name).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics").await?;
        sample(&body, series)
    }

    /// Waits until the sample `series` satisfies `want` (`what` names the expectation in the failure);
    /// returns the value. Fails at once if the process exits first.
    pub async fn wait_metric(
        &self,
        series: &str,
        what: &str,
        want: impl Fn(f64) -> bool,
        timeout: Duration,
    ) -> f64 {
        wait_for(
            &format!("{}'s {series} to be {what}", self.label),
            timeout,
            || async {
                let value = self.metric(series).await.filter(|v| want(*v));
                if value.is_none() {
                    self.assert_running();
                }
                value
            },
        )
        .await
    }

    /// Waits until this replica leads: `leader_election_master_status` of netcm's Lease is 1.
    pub async fn wait_leading(&self, timeout: Duration) {
        self.wait_metric(MASTER_STATUS, "1", |v| v == 1.0, timeout)
            .await;
    }

    /// Whether this replica leads now (`leader_election_master_status` is 1).
    pub async fn is_leading(&self) -> bool {
        self.metric(MASTER_STATUS).await == Some(1.0)
    }

    /// Waits until this replica stands by: its elector exists and does not lead
    /// (`leader_election_master_status` 0, registered just before the first attempt to acquire) while
    /// another identity holds netcm's Lease. Returns that holder.
    pub async fn wait_standing_by(&self, client: &kube::Client, timeout: Duration) -> String {
        wait_for(
            &format!("{} to stand by behind another holder", self.label),
            timeout,
            || async {
                if self.metric(MASTER_STATUS).await != Some(0.0) {
                    self.assert_running();
                    return None;
                }
                crate::lease_holder(client, crate::LEASE_NAME).await
            },
        )
        .await
    }

    /// Waits until the manager runs `controller` (`running_managed_controllers{name=controller}` is 1).
    pub async fn wait_controller_running(&self, controller: &str, timeout: Duration) {
        self.wait_metric(&running_controller(controller), "1", |v| v == 1.0, timeout)
            .await;
    }
}

/// The sample saying whether this process leads netcm's Lease.
pub const MASTER_STATUS: &str = "leader_election_master_status{name=\"netcm\"}";

/// The sample saying whether the manager runs `controller` (labels as the exposition sorts them).
pub fn running_controller(controller: &str) -> String {
    format!("running_managed_controllers{{manager=\"netcm\",name=\"{controller}\"}}")
}

/// The value of one sample in a Prometheus text exposition (`name{labels}` exactly as printed).
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
}

/// The sum of every sample of `family` on `n`'s /metrics whose labels contain all of `labels`
/// (`name="value"` each).
pub async fn metric_sum(n: &Netcm, family: &str, labels: &[&str]) -> f64 {
    let (_, body) = n.http_get("/metrics").await.expect("/metrics");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            name == family && labels.iter().all(|want| rest.contains(want))
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// Kills and reaps a test's process; when the test is failing, prints the end of its log.
pub fn stop(child: Option<std::process::Child>, label: &str, log_path: &Path) {
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
    if std::thread::panicking() {
        print_log_tail(label, log_path);
    }
}

/// Prints the end of a process's log; called when a test fails.
pub fn print_log_tail(label: &str, path: &Path) {
    let logs = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = logs.lines().rev().take(150).collect();
    eprintln!("----- last lines of {label} ({}) -----", path.display());
    for l in tail.into_iter().rev() {
        eprintln!("{l}");
    }
    eprintln!("----- end of {label} -----");
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_two_ports_of_one_netcm_are_never_the_same() {
        for _ in 0..2000 {
            let (port, secure_port) = super::free_port_pair();
            assert_ne!(port, secure_port);
        }
    }
}
