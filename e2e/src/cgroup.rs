//! A CPU quota on one process, as a container runtime sets one (`resources.limits.cpu`): a cgroup the
//! harness creates under the machine's cpu controller (cgroup v1 `cpu.cfs_quota_us`, or v2 `cpu.max`),
//! the process moved into it, and undone on drop (the process moved back, the cgroup removed).

use std::path::{Path, PathBuf};

/// A cgroup holding one process under a CPU quota; removed on drop.
pub struct CpuQuota {
    dir: PathBuf,
    /// Where the process goes back to on drop (`cgroup.procs` of the root).
    root_procs: PathBuf,
    pid: u32,
}

/// The cpu controller's root: v1's `/sys/fs/cgroup/cpu`, else the v2 hierarchy.
fn cpu_root() -> (PathBuf, bool) {
    for v1 in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
        if Path::new(v1).join("cpu.cfs_quota_us").exists() {
            return (PathBuf::from(v1), true);
        }
    }
    for v2 in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if Path::new(v2).join("cgroup.controllers").exists() {
            return (PathBuf::from(v2), false);
        }
    }
    panic!("no cgroup cpu controller under /sys/fs/cgroup: the CPU-starvation test needs one");
}

impl CpuQuota {
    /// Moves `pid` (every thread of it) into a new cgroup allowed `percent` of one core.
    pub fn apply(pid: u32, percent: u32) -> CpuQuota {
        let (root, v1) = cpu_root();
        let dir = root.join(format!("netcm-e2e-{}-{pid}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let period = 100_000u32;
        let quota = (period / 100 * percent).max(1_000);
        let write = |file: &str, value: String| {
            let path = dir.join(file);
            std::fs::write(&path, &value)
                .unwrap_or_else(|e| panic!("write {value:?} to {}: {e}", path.display()));
        };
        if v1 {
            write("cpu.cfs_period_us", period.to_string());
            write("cpu.cfs_quota_us", quota.to_string());
        } else {
            // The cpu controller must be enabled for the root's children first.
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
            write("cpu.max", format!("{quota} {period}"));
        }
        write("cgroup.procs", pid.to_string());
        CpuQuota {
            dir,
            root_procs: root.join("cgroup.procs"),
            pid,
        }
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        // The process may be gone already; either way the cgroup must be empty before rmdir.
        let _ = std::fs::write(&self.root_procs, self.pid.to_string());
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("[e2e] could not remove {}", self.dir.display());
    }
}
