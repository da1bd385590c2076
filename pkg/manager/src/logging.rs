//! Logging: tracing-subscriber with `--log-format text|json` and KCM-style `-v` levels; `RUST_LOG` wins.

use tracing_subscriber::EnvFilter;

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

/// Installs the global subscriber; call once at startup.
pub fn init(format: LogFormat, verbosity: u8) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(filter_for_verbosity(verbosity)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(e) = result {
        eprintln!("logging already initialised: {e}");
    }
}
