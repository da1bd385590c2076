//! Two kube-apiservers on one etcd: the harness's own and a second one started by
//! `hack/controlplane.sh start-apiserver2`. A test freezes (SIGSTOP) the one a leader talks to while the
//! other keeps serving, which is how a stale leader's writes come to land late: the frozen server keeps
//! its sockets open, so requests sent to it wait in the kernel and are handled when it is thawed.

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{control_plane, controlplane_sh, repo_root};

/// One of the two API servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apiserver {
    /// The harness's kube-apiserver (`hack/controlplane.sh up`).
    One,
    /// The second kube-apiserver (`hack/controlplane.sh start-apiserver2`).
    Two,
}

impl Apiserver {
    /// The other one.
    pub fn other(self) -> Apiserver {
        match self {
            Apiserver::One => Apiserver::Two,
            Apiserver::Two => Apiserver::One,
        }
    }

    /// 0 for [`Apiserver::One`], 1 for [`Apiserver::Two`], to index per-server arrays.
    pub fn index(self) -> usize {
        match self {
            Apiserver::One => 0,
            Apiserver::Two => 1,
        }
    }

    fn pid_file(self) -> &'static str {
        match self {
            Apiserver::One => "kube-apiserver.pid",
            Apiserver::Two => "kube-apiserver2.pid",
        }
    }
}

impl std::fmt::Display for Apiserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Apiserver::One => f.write_str("kube-apiserver 1"),
            Apiserver::Two => f.write_str("kube-apiserver 2"),
        }
    }
}

/// Both API servers. Dropping it thaws both and stops the second, so a failing test never leaves the
/// cluster frozen for the tests after it.
#[derive(Debug)]
pub struct ApiServers {
    state_dir: PathBuf,
    kubeconfigs: [PathBuf; 2],
    audit_logs: [PathBuf; 2],
}

impl ApiServers {
    /// Starts the second kube-apiserver next to the harness's one (idempotent). Panics if the harness's
    /// cluster is not the one `hack/controlplane.sh` manages in this checkout: a second server on some
    /// other etcd would prove nothing.
    pub fn start() -> ApiServers {
        Self::start_with_flags(&[])
    }

    /// [`ApiServers::start`], the second server (re)started with `flags` appended to its command line, so a
    /// test can have one server that lacks a feature the other serves.
    pub fn start_with_flags(flags: &[&str]) -> ApiServers {
        let cp = control_plane();
        let env = controlplane_sh(&["env"]);
        let var = |name: &str| -> PathBuf {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("hack/controlplane.sh env printed no {name}: {env:?}"))
        };
        let state_dir = var("STATE_DIR");
        assert_eq!(
            cp.kubeconfig,
            var("KUBECONFIG"),
            "the e2e cluster is not the one hack/controlplane.sh runs in {}; a second API server needs its etcd",
            repo_root().display()
        );
        if !flags.is_empty() {
            // A running second server has the flags of whoever started it.
            controlplane_sh(&["stop-apiserver2"]);
        }
        let out = controlplane_sh(&[&["start-apiserver2"], flags].concat());
        let kubeconfig2 = out
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("KUBECONFIG="))
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                panic!(
                    "hack/controlplane.sh start-apiserver2 did not print KUBECONFIG=…; got {out:?}"
                )
            });
        let audit2 = PathBuf::from(controlplane_sh(&["audit2"]).trim());
        ApiServers {
            state_dir,
            kubeconfigs: [cp.kubeconfig.clone(), kubeconfig2],
            audit_logs: [cp.audit_log.clone(), audit2],
        }
    }

    /// The admin kubeconfig that talks to `server`.
    pub fn kubeconfig(&self, server: Apiserver) -> &Path {
        &self.kubeconfigs[server.index()]
    }

    /// The audit log `server` writes.
    pub fn audit_log(&self, server: Apiserver) -> &Path {
        &self.audit_logs[server.index()]
    }

    /// Both audit logs.
    pub fn audit_logs(&self) -> &[PathBuf; 2] {
        &self.audit_logs
    }

    /// The process id of `server`, read from its pid file each time.
    pub fn pid(&self, server: Apiserver) -> i32 {
        let path = self.state_dir.join(server.pid_file());
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("pid in {}: {e}", path.display()))
    }

    /// SIGSTOPs `server`. Signalled directly (not through the script) so the freeze lands within
    /// microseconds of the test deciding on it.
    pub fn freeze(&self, server: Apiserver) {
        kill(Pid::from_raw(self.pid(server)), Signal::SIGSTOP)
            .unwrap_or_else(|e| panic!("SIGSTOP {server}: {e}"));
    }

    /// SIGCONTs `server`.
    pub fn thaw(&self, server: Apiserver) {
        kill(Pid::from_raw(self.pid(server)), Signal::SIGCONT)
            .unwrap_or_else(|e| panic!("SIGCONT {server}: {e}"));
    }
}

impl Drop for ApiServers {
    fn drop(&mut self) {
        // Never panic here: this also runs while a failing test unwinds.
        for server in [Apiserver::One, Apiserver::Two] {
            let pid = std::fs::read_to_string(self.state_dir.join(server.pid_file()))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok());
            if let Some(pid) = pid {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
        }
        // The second server costs a core's worth of CPU now and then; the tests after this one need none.
        let _ = Command::new("bash")
            .arg(repo_root().join("hack/controlplane.sh"))
            .arg("stop-apiserver2")
            .output();
    }
}
