//! A process's memory and CPU, and the CPU time the hypervisor took from the whole machine, from /proc,
//! for the benchmarks.

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

/// The whole machine's CPU time so far, from the first line of `/proc/stat`, in USER_HZ ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineCpu {
    /// Every tick of every core: user, nice, system, idle, iowait, irq, softirq and steal.
    pub total: u64,
    /// Ticks a core of this guest was ready to run but the hypervisor ran another guest.
    pub steal: u64,
}

impl MachineCpu {
    /// Reads `/proc/stat`; zeros when it cannot be read.
    pub fn now() -> MachineCpu {
        parse_machine_cpu(&std::fs::read_to_string("/proc/stat").unwrap_or_default())
    }

    /// The percentage of the machine's CPU time since `earlier` that the hypervisor gave to others: a row
    /// of a benchmark that lost some ran on a slower machine than a row that lost none.
    pub fn stolen_pct_since(&self, earlier: &MachineCpu) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        self.steal.saturating_sub(earlier.steal) as f64 / total as f64 * 100.0
    }
}

/// The `cpu` line of `/proc/stat` (proc(5)); guest time is already inside user time, so it is not added.
fn parse_machine_cpu(stat: &str) -> MachineCpu {
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return MachineCpu::default();
    };
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    MachineCpu {
        total: ticks.iter().sum(),
        steal: ticks.get(7).copied().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_machine_cpu, MachineCpu};

    #[test]
    fn the_machine_line_of_proc_stat_gives_its_total_and_stolen_ticks() {
        let stat = "cpu  100 5 50 800 10 1 4 30 7 0\ncpu0 50 2 25 400 5 0 2 15 3 0\nintr 1 2\n";
        assert_eq!(
            parse_machine_cpu(stat),
            MachineCpu {
                total: 1000,
                steal: 30
            }
        );
    }

    #[test]
    fn the_stolen_share_is_of_the_ticks_between_two_readings() {
        let before = MachineCpu {
            total: 1000,
            steal: 30,
        };
        let after = MachineCpu {
            total: 1400,
            steal: 130,
        };
        assert_eq!(after.stolen_pct_since(&before), 25.0);
        assert_eq!(before.stolen_pct_since(&before), 0.0);
    }

    #[test]
    fn a_proc_stat_without_a_machine_line_reads_as_zero() {
        assert_eq!(parse_machine_cpu("intr 1 2\n"), MachineCpu::default());
    }
}
