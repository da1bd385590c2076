//! The control plane this run tests against, through `hack/controlplane.sh`: started once, its
//! kube-apiserver restarted, stopped, frozen or given a new certificate, and the tools it built.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::{command_output, install_crds, repo_root};

/// The running control plane: kubeconfig and audit log paths.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    pub kubeconfig: PathBuf,
    pub audit_log: PathBuf,
}

pub(crate) fn controlplane_sh(args: &[&str]) -> String {
    command_output(
        Command::new("bash")
            .arg(repo_root().join("hack/controlplane.sh"))
            .args(args),
        None,
    )
}

/// The control plane for this test run: started once (idempotently), never skipped.
pub fn control_plane() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    CP.get_or_init(|| {
        let kubeconfig = match std::env::var("NETCM_E2E_KUBECONFIG") {
            Ok(k) if !k.is_empty() => PathBuf::from(k),
            _ => {
                let out = controlplane_sh(&["up"]);
                let last = out.lines().last().unwrap_or_default();
                PathBuf::from(last.strip_prefix("KUBECONFIG=").unwrap_or_else(|| {
                    panic!("hack/controlplane.sh up did not print KUBECONFIG=…; got {out:?}")
                }))
            }
        };
        let audit_log = PathBuf::from(controlplane_sh(&["audit"]).trim());
        install_crds(&kubeconfig);
        ControlPlane {
            kubeconfig,
            audit_log,
        }
    })
}

/// Stops and starts kube-apiserver, keeping etcd's data.
pub fn restart_apiserver() {
    controlplane_sh(&["restart-apiserver"]);
}

/// Gives kube-apiserver a new serving key and certificate from the same CA and restarts it, so every
/// client connects again and meets the new certificate; returns the new certificate's serial.
pub fn rotate_apiserver_serving_cert() -> String {
    controlplane_sh(&["rotate-serving-cert"])
}

/// Stops kube-apiserver (start it again with [`start_apiserver`]).
pub fn stop_apiserver() {
    controlplane_sh(&["stop-apiserver"]);
}

/// Starts a stopped kube-apiserver with the same flags and port.
pub fn start_apiserver() {
    controlplane_sh(&["start-apiserver"]);
}

/// The process id of this checkout's kube-apiserver.
pub fn apiserver_pid() -> u32 {
    let env = controlplane_sh(&["env"]);
    let state = env
        .lines()
        .find_map(|l| l.strip_prefix("STATE_DIR="))
        .expect("STATE_DIR in hack/controlplane.sh env");
    std::fs::read_to_string(Path::new(state).join("kube-apiserver.pid"))
        .expect("kube-apiserver.pid")
        .trim()
        .parse()
        .expect("kube-apiserver.pid holds a pid")
}

/// Freezes kube-apiserver with SIGSTOP (connections are accepted by the kernel, nothing is answered)
/// until dropped, which sends SIGCONT — also when the test fails.
pub struct FrozenApiserver {
    pid: String,
}

impl FrozenApiserver {
    /// Sends SIGSTOP to this checkout's kube-apiserver.
    pub fn freeze() -> FrozenApiserver {
        let pid = apiserver_pid().to_string();
        kill(&pid, "STOP");
        FrozenApiserver { pid }
    }
}

impl Drop for FrozenApiserver {
    fn drop(&mut self) {
        kill(&self.pid, "CONT");
    }
}

fn kill(pid: &str, sig: &str) {
    let status = Command::new("kill")
        .args(["-s", sig, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s {sig} {pid} failed");
}

/// kubectl against `kubeconfig`.
pub fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(tool("kubectl"));
    cmd.env("KUBECONFIG", kubeconfig);
    cmd
}

/// A path of a built tool (kubectl, kube-controller-manager, …).
pub fn tool(name: &str) -> PathBuf {
    PathBuf::from(controlplane_sh(&["bin", name]).trim())
}
