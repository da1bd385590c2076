//! The metrics/health listeners under hostile or broken clients: slow headers and slow TLS handshakes
//! are cut off, connections are capped, and accept errors (here: the process is out of file descriptors)
//! back off instead of spinning. netcm runs against an API server that is never there, so these tests
//! need no cluster and hold no cluster lock: the listeners serve before the API server is reached.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use netcm_e2e::{wait_for, Netcm};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// netcm's header-read (and TLS-handshake) timeout (`http::Limits::default`).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// netcm's cap on concurrent connections per listener (`http::Limits::default`).
const MAX_CONNECTIONS: usize = 128;

/// A kubeconfig whose API server refuses connections, and the directory holding it.
fn unreachable_kubeconfig() -> (PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("unreachable.kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\n\
         users:\n- name: u\n  user: {token: x}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
         current-context: x\n",
    )
    .expect("write kubeconfig");
    (path, dir)
}

fn start(label: &str, wrapper: &[&str], kubeconfig: &std::path::Path) -> Netcm {
    Netcm::start_wrapped(
        label,
        wrapper,
        kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    )
}

/// Open file descriptors of a process.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// GET /healthz on the plain port, bounded by `timeout`.
async fn healthz(n: &Netcm, timeout: Duration) -> Option<u16> {
    tokio::time::timeout(timeout, n.http_get("/healthz"))
        .await
        .ok()
        .flatten()
        .map(|(code, _)| code)
}

/// A slow-loris client: sends the start of a request (an HTTP request line and part of a header, or the
/// start of a TLS record), then one more byte a second. Returns how long the server kept it open, or
/// `None` if it was still open after `give_up`.
async fn slow_loris(port: u16, tls: bool, give_up: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head: &[u8] = if tls {
        // A handshake record announcing 512 bytes, of which only the header arrives.
        b"\x16\x03\x01\x02\x00"
    } else {
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
    };
    if s.write_all(head).await.is_err() {
        return Some(started.elapsed());
    }
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return Some(started.elapsed()),
                Ok(_) => {} // an error response before the close
            },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if started.elapsed() > give_up {
                    return None;
                }
                if s.write_all(b"a").await.is_err() {
                    return Some(started.elapsed());
                }
            }
        }
    }
}

#[tokio::test]
async fn slow_loris_clients_are_cut_off_after_the_header_timeout_and_healthz_answers_meanwhile() {
    let (kubeconfig, _dir) = unreachable_kubeconfig();
    let n = start("loris", &[], &kubeconfig);
    n.wait_http(Duration::from_secs(30)).await;

    let give_up = HEADER_TIMEOUT * 3;
    let mut lorises = Vec::new();
    for i in 0..50 {
        let (port, tls) = if i % 5 == 0 {
            (n.secure_port, true)
        } else {
            (n.port, false)
        };
        lorises.push(tokio::spawn(slow_loris(port, tls, give_up)));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..3 {
        assert_eq!(
            healthz(&n, Duration::from_secs(5)).await,
            Some(200),
            "/healthz while 50 slow clients are connected"
        );
        let (code, body) = n.https_get("/healthz", None);
        assert_eq!(
            code, 200,
            "secure /healthz while slow clients are connected: {body}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut still_open = 0;
    let mut longest = Duration::ZERO;
    for l in lorises {
        match l.await.expect("slow client task") {
            Some(held) => longest = longest.max(held),
            None => still_open += 1,
        }
    }
    assert_eq!(
        still_open, 0,
        "{still_open} of 50 slow clients were still connected after {give_up:?} (header timeout {HEADER_TIMEOUT:?})"
    );
    eprintln!("[http_limits] the longest slow client was held {longest:?}");
    assert_eq!(healthz(&n, Duration::from_secs(5)).await, Some(200));
}

#[tokio::test]
async fn more_connections_than_the_cap_hold_no_more_descriptors_and_healthz_is_still_answered() {
    let (kubeconfig, _dir) = unreachable_kubeconfig();
    let n = start("cap", &[], &kubeconfig);
    n.wait_http(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = open_fds(n.pid());

    // Idle clients: connected, never a byte. The first MAX_CONNECTIONS take every slot.
    let extra = 40;
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS + extra {
        idle.push(
            TcpStream::connect(("127.0.0.1", n.port))
                .await
                .expect("connect"),
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = open_fds(n.pid());
    // A little slack for the API client's reconnect attempts.
    assert!(
        held <= baseline + MAX_CONNECTIONS + 4,
        "{} idle connections made netcm hold {held} descriptors (baseline {baseline}, cap {MAX_CONNECTIONS})",
        MAX_CONNECTIONS + extra
    );
    // A probe queued behind them is served once the header timeout frees the first slots.
    let started = Instant::now();
    let code = healthz(&n, HEADER_TIMEOUT * 2 + Duration::from_secs(5)).await;
    assert_eq!(
        code,
        Some(200),
        "/healthz behind {} idle connections",
        MAX_CONNECTIONS + extra
    );
    eprintln!(
        "[http_limits] /healthz answered {:?} after the idle flood",
        started.elapsed()
    );
    n.assert_running();
    drop(idle);
}

/// Lines in the log about failed accepts.
fn accept_error_lines(n: &Netcm) -> usize {
    n.logs().lines().filter(|l| l.contains("accepting")).count()
}

/// user + system CPU time of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

#[tokio::test]
async fn accept_errors_from_too_many_open_files_back_off_instead_of_flooding_the_log() {
    let (kubeconfig, _dir) = unreachable_kubeconfig();
    // netcm needs about 13 descriptors of its own; 32 leaves room for a few connections only.
    let n = start("emfile", &["prlimit", "--nofile=32:32"], &kubeconfig);
    n.wait_http(Duration::from_secs(30)).await;

    // Held open (idle) so the descriptors stay used; fewer than the cap, so only the limit stops accepts.
    let mut clients = Vec::new();
    for _ in 0..64 {
        clients.push(
            TcpStream::connect(("127.0.0.1", n.port))
                .await
                .expect("connect"),
        );
    }
    wait_for(
        "netcm to report a failed accept",
        Duration::from_secs(10),
        || async { (accept_error_lines(&n) > 0).then_some(()) },
    )
    .await;
    let (lines_before, cpu_before) = (accept_error_lines(&n), cpu_ticks(n.pid()));
    // Shorter than the header timeout, so no held connection is cut meanwhile and accepts keep failing.
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let (lines, cpu) = (
        accept_error_lines(&n) - lines_before,
        cpu_ticks(n.pid()).saturating_sub(cpu_before),
    );
    eprintln!(
        "[http_limits] {lines} accept-error lines and {cpu} CPU ticks in {window:?} out of descriptors"
    );
    // Backing off from 5 ms doubling to 1 s logs about 9 lines in the first 2.5 s, then one a second.
    assert!(
        lines <= 15,
        "{lines} accept-error log lines in {window:?}: the accept loop spins on EMFILE"
    );
    n.assert_running();
    drop(clients);
    // Once descriptors are free again, connections are accepted and answered.
    wait_for(
        "/healthz after the descriptors are freed",
        HEADER_TIMEOUT * 2,
        || async { (healthz(&n, Duration::from_secs(2)).await == Some(200)).then_some(()) },
    )
    .await;
}
