//! A process's memory and CPU from /proc, for the benchmarks.

/// A process's memory and CPU at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStats {
    /// VmHWM: the peak resident set so far.
    pub peak_rss_mib: f64,
    /// VmRSS: the resident set now.
    pub rss_mib: f64,
    /// utime + stime so far.
    pub cpu_seconds: f64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`; zeros once the process is gone.
pub fn proc_stats(pid: u32) -> ProcStats {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces; the fields after its closing parenthesis do not. utime and
    // stime are fields 14 and 15 of stat(5), in USER_HZ (100 on Linux).
    let after_comm = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks = |i: usize| -> f64 {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    ProcStats {
        peak_rss_mib: kib("VmHWM:") / 1024.0,
        rss_mib: kib("VmRSS:") / 1024.0,
        cpu_seconds: (ticks(11) + ticks(12)) / 100.0,
    }
}
