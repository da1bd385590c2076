//! Never a duplicate, against an adversary (issue 15): leader election under a saturated client, a Lease
//! deleted by hand, lease durations the Lease cannot carry, writes the API server holds, shutdown with a
//! write in flight, and an API server that stops answering. Everything runs against the real control
//! plane; the adversary is a slow admission webhook, SIGSTOP, or a `kubectl delete`-style call.

use std::time::{Duration, Instant};

/// Runs the binary with `args` and no reachable API server; it must exit on its own within 10 s.
fn run_without_api(args: &[&str]) -> std::process::Output {
    let mut child = std::process::Command::new(netcm_e2e::netcm::netcm_binary())
        .args(["--master=https://127.0.0.1:1", "--port=0"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run netcm");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "netcm {args:?} did not exit within 10 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn a_lease_duration_that_is_not_whole_seconds_exits_2_naming_the_flag_before_any_api_call() {
    for (lease, renew, retry) in [("1500ms", "1s", "200ms"), ("900ms", "500ms", "200ms")] {
        let out = run_without_api(&[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
            &format!("--leader-elect-lease-duration={lease}"),
            &format!("--leader-elect-renew-deadline={renew}"),
            &format!("--leader-elect-retry-period={retry}"),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "lease {lease}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("--leader-elect-lease-duration") && stderr.contains("whole"),
            "{stderr}"
        );
    }
}
