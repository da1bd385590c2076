//! The lossy, non-blocking log sink: formatted lines go into a bounded queue that one thread writes to
//! the destination. Tasks never wait on the destination and never see its errors; what cannot be
//! queued or written is dropped and counted by reason.

use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts, Registry};
use tracing_subscriber::fmt::MakeWriter;

/// Lines the queue holds while the destination is slow; past this, new lines are dropped. A line is a
/// few hundred bytes, so a full queue is a few MiB.
pub const QUEUE_LINES: usize = 8192;

/// How long [`FlushGuard`] waits at exit for queued lines to be written.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// `reason` of a line dropped because the queue was full (the destination is slower than the logging).
pub const DROPPED_QUEUE_FULL: &str = "queue_full";
/// `reason` of a line dropped because writing it failed (a closed pipe, a full disk).
pub const DROPPED_WRITE_FAILED: &str = "write_failed";

/// `netcm_log_lines_dropped_total{reason}`: process-wide, since logging starts before the registry.
static DROPPED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let counter = IntCounterVec::new(
        Opts::new(
            "netcm_log_lines_dropped_total",
            "Log lines dropped instead of blocking or failing the process, by reason (queue_full: the \
             destination is slower than the logging; write_failed: writing failed, e.g. the reader of \
             stderr exited).",
        ),
        &["reason"],
    );
    #[allow(clippy::expect_used)] // static metric definition: a failure is a programming error
    let counter = counter.expect("valid metric definition");
    for reason in [DROPPED_QUEUE_FULL, DROPPED_WRITE_FAILED] {
        counter.with_label_values(&[reason]);
    }
    counter
});

/// Registers `netcm_log_lines_dropped_total` with `registry`.
pub fn register_metrics(registry: &Registry) -> Result<(), prometheus::Error> {
    registry.register(Box::new(DROPPED.clone()))
}

/// Lines dropped so far for `reason`.
pub fn dropped(reason: &str) -> u64 {
    DROPPED.with_label_values(&[reason]).get()
}

/// What the writer thread is sent.
enum Message {
    /// One formatted line (or a part of one, as the formatter wrote it).
    Line(Vec<u8>),
    /// Answer on the channel once everything queued before has been written.
    Flush(SyncSender<()>),
}

/// The [`MakeWriter`] for tracing-subscriber; clones share one queue.
#[derive(Clone)]
pub struct SinkWriter {
    queue: SyncSender<Message>,
}

impl<'a> MakeWriter<'a> for SinkWriter {
    type Writer = SinkWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Write for SinkWriter {
    /// Queues the bytes if there is room and reports them written either way: a log line is never worth
    /// stalling or failing the task that logs it.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.queue.try_send(Message::Line(buf.to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => DROPPED.with_label_values(&[DROPPED_QUEUE_FULL]).inc(),
            // The writer thread is gone (it never ends by itself): the line is lost like a failed write.
            Err(TrySendError::Disconnected(_)) => {
                DROPPED.with_label_values(&[DROPPED_WRITE_FAILED]).inc()
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Held by `main` until exit; dropping it waits (bounded) for queued lines to be written.
#[must_use = "dropping the guard at once flushes nothing later"]
pub struct FlushGuard {
    queue: SyncSender<Message>,
}

impl FlushGuard {
    /// Waits up to `timeout` for every line queued so far to be written (or dropped); false on timeout.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (done, wait) = mpsc::sync_channel(1);
        let mut message = Message::Flush(done);
        // A full queue behind a stalled destination must not hang the exit: retry until the deadline.
        loop {
            match self.queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    message = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        wait.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.flush(FLUSH_TIMEOUT);
    }
}

/// A sink writing to this process's stderr.
pub fn stderr() -> (SinkWriter, FlushGuard) {
    to(io::stderr())
}

/// A sink writing to `destination` from a thread of its own.
pub fn to<W: Write + Send + 'static>(destination: W) -> (SinkWriter, FlushGuard) {
    let (queue, lines) = mpsc::sync_channel(QUEUE_LINES);
    let spawned = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || write_lines(lines, destination));
    if let Err(e) = spawned {
        // Without the thread every line counts as dropped; the process runs on.
        write_stderr_line(&format!("could not start the log writer thread: {e}"));
    }
    (
        SinkWriter {
            queue: queue.clone(),
        },
        FlushGuard { queue },
    )
}

/// The writer thread: writes each queued line, counting the ones that fail; ends when every sender is gone.
fn write_lines<W: Write>(lines: Receiver<Message>, mut destination: W) {
    while let Ok(message) = lines.recv() {
        match message {
            Message::Line(bytes) => {
                if destination.write_all(&bytes).is_err() {
                    DROPPED.with_label_values(&[DROPPED_WRITE_FAILED]).inc();
                }
            }
            Message::Flush(done) => {
                let _ = destination.flush();
                let _ = done.try_send(());
            }
        }
    }
}

/// Writes one line to stderr directly, ignoring failure: for the few messages before or outside the
/// subscriber (`eprintln!` would panic on a broken stderr).
pub fn write_stderr_line(line: &str) {
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A destination that fails every write, as a pipe whose reader exited does.
    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    /// A destination that blocks every write until released, as a pipe nobody reads does once full.
    struct Stalled(Arc<Mutex<()>>);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _held = self.0.lock();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[derive(Clone, Default)]
    struct Collected(Arc<Mutex<Vec<u8>>>);

    impl Write for Collected {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_reach_the_destination_in_order_once_flushed() {
        let out = Collected::default();
        let (mut w, guard) = to(out.clone());
        for i in 0..100 {
            w.write_all(format!("line {i}\n").as_bytes())
                .expect("never fails");
        }
        assert!(guard.flush(Duration::from_secs(10)));
        let text = String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf8");
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, expected);
    }

    #[test]
    fn a_destination_that_fails_every_write_never_fails_the_logger_and_counts_each_line() {
        let before = dropped(DROPPED_WRITE_FAILED);
        let (mut w, guard) = to(Broken);
        for _ in 0..50 {
            assert_eq!(w.write(b"x\n").expect("never fails"), 2);
        }
        assert!(guard.flush(Duration::from_secs(10)));
        // Other tests share the process-wide counter: at least these 50.
        assert!(dropped(DROPPED_WRITE_FAILED) >= before + 50);
    }

    #[test]
    fn a_destination_that_blocks_never_blocks_the_logger_and_counts_what_did_not_fit() {
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().expect("lock");
        let before = dropped(DROPPED_QUEUE_FULL);
        let (mut w, guard) = to(Stalled(gate.clone()));
        // The writer thread takes one line and blocks on it; the queue then fills and the rest drop.
        let lines = QUEUE_LINES + 1000;
        for _ in 0..lines {
            w.write_all(b"x\n").expect("never fails");
        }
        assert!(dropped(DROPPED_QUEUE_FULL) >= before + 999);
        // The guard's flush gives up instead of hanging while the destination is stalled.
        assert!(!guard.flush(Duration::from_millis(50)));
        drop(held);
        assert!(guard.flush(Duration::from_secs(10)));
    }
}
