//! Logging: tracing-subscriber with `--log-format text|json` and KCM-style `-v` levels; `RUST_LOG` wins.
//!
//! Lines reach stderr through [`sink`]: a bounded queue drained by one thread. A log line never blocks a
//! task and never fails it, whatever happens to stderr (a pipe whose reader exited, a stalled journald, a
//! full disk behind a redirect): a line that does not fit is dropped and counted in
//! `netcm_log_lines_dropped_total`. tracing-subscriber's own error path (`eprintln!`, which panics on a
//! broken stderr) is never reached, because the writer it sees cannot fail.

use tracing_subscriber::EnvFilter;

pub mod sink;

pub use sink::{register_metrics, FlushGuard};

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The filter for a `-v` level: 0–1 info, 2–3 debug for netcm, 4+ trace for netcm and debug for kube.
pub fn filter_for_verbosity(v: u8) -> String {
    match v {
        0 | 1 => "info".to_string(),
        2 | 3 => "info,netcm=debug,netcm_manager=debug,netcm_subnet_allocator=debug".to_string(),
        _ => "debug,netcm=trace,netcm_manager=trace,netcm_subnet_allocator=trace,hyper=info,rustls=info".to_string(),
    }
}

/// Installs the global subscriber writing through the lossy stderr sink; call once at startup and keep
/// the guard until exit, so lines still queued are written (for a bounded time) before the process ends.
pub fn init(format: LogFormat, verbosity: u8) -> FlushGuard {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(filter_for_verbosity(verbosity)));
    let (writer, guard) = sink::stderr();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        // The sink never reports an error, but should a future one, the fallback is `eprintln!`.
        .log_internal_errors(false);
    let result = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(e) = result {
        sink::write_stderr_line(&format!("logging already initialised: {e}"));
    }
    guard
}
