//! The manager's own flags (KCM's generic and leader-election flags), validated before any API call.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use crate::duration::{format_duration, parse_duration};
use crate::logging::LogFormat;

/// Flags every netcm process has, whatever controllers it runs.
#[derive(Debug, Clone, Args)]
pub struct GenericFlags {
    /// Path to a kubeconfig file (else KUBECONFIG, in-cluster config, then ~/.kube/config).
    #[arg(long, env = "NETCM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long)]
    pub master: Option<String>,

    /// QPS to use while talking with kube-apiserver: a client-side token bucket per controller, as KCM's
    /// (the process's own requests and leader election have one each too).
    #[arg(long, default_value_t = 500.0)]
    pub kube_api_qps: f32,

    /// Burst to use while talking with kube-apiserver.
    #[arg(long, default_value_t = 1000)]
    pub kube_api_burst: u32,

    /// Content type the shared Node informer asks the API server for (KCM's flag). Protobuf costs the
    /// API server about a third of JSON's CPU; netcm reads it into JSON of just the fields it keeps.
    #[arg(
        long,
        value_enum,
        default_value = "application/vnd.kubernetes.protobuf"
    )]
    pub kube_api_content_type: ApiContentType,

    /// Controllers to enable: '*' enables all on-by-default controllers, 'foo' enables foo, '-foo' disables foo.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub controllers: Vec<String>,

    /// Interval between starting controllers (jittered up to 2x, as KCM does).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub controller_start_interval: Duration,

    /// A controller whose queue has ready keys and starts or finishes no sync for this long is stalled:
    /// its health check fails and the process exits so a standby takes over; 0s disables the check.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub controller_stall_timeout: Duration,

    /// Start a leader election client and gain leadership before running controllers.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,

    /// How long non-leaders wait after observing a renewal before they may take the lease; whole
    /// seconds, as the Lease stores them.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps retrying to renew before it stops leading; shorter than the lease
    /// duration.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub leader_elect_renew_deadline: Duration,

    /// How long clients wait between attempts to acquire and renew leadership; shorter than the renew
    /// deadline.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub leader_elect_retry_period: Duration,

    /// The name of the Lease object used for leader election.
    #[arg(long, default_value = "netcm")]
    pub leader_elect_resource_name: String,

    /// The namespace of the Lease (default: the pod's namespace from POD_NAMESPACE, else kube-system).
    #[arg(long)]
    pub leader_elect_resource_namespace: Option<String>,

    /// A standby lists and watches Nodes while it waits for the Lease, so that it serves at once when it
    /// leads instead of relisting every Node first, proving its cache fresh with one write; it then holds
    /// the leader's Node cache too. false: it holds nothing until it leads.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub warm_standby: bool,

    /// The IP address on which to serve /metrics and health checks.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,

    /// The port for /metrics and health checks over plain HTTP; 0 disables the listener.
    #[arg(long, default_value_t = 10271)]
    pub port: u16,

    /// The port for /metrics and health checks over HTTPS with delegated authentication and
    /// authorization (TokenReview / SubjectAccessReview); 0 disables it.
    #[arg(long, default_value_t = 0)]
    pub secure_port: u16,

    /// PEM certificate for --secure-port (default: a self-signed certificate made in memory).
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key for --tls-cert-file (both or neither).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log verbosity, as KCM's -v (0–1 info, 2–3 debug, 4+ trace); RUST_LOG overrides it.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,
}

/// What `--kube-api-content-type` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiContentType {
    /// Kubernetes protobuf (KCM's default).
    #[value(name = "application/vnd.kubernetes.protobuf")]
    Protobuf,
    /// JSON.
    #[value(name = "application/json")]
    Json,
}

impl ApiContentType {
    /// The flag's value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Protobuf => "application/vnd.kubernetes.protobuf",
            Self::Json => "application/json",
        }
    }
}

/// A flag value that breaks a rule; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

impl GenericFlags {
    /// Checks the rules client-go and KCM enforce, before anything touches the API.
    pub fn validate(&self) -> Result<(), FlagError> {
        if self.kube_api_qps.is_nan() || self.kube_api_qps <= 0.0 || !self.kube_api_qps.is_finite()
        {
            return Err(FlagError(format!(
                "--kube-api-qps must be greater than 0, got {}",
                self.kube_api_qps
            )));
        }
        if self.secure_port != 0 && self.secure_port == self.port {
            return Err(FlagError(format!(
                "--secure-port and --port must differ, both are {}",
                self.port
            )));
        }
        if self.kube_api_burst == 0 {
            return Err(FlagError("--kube-api-burst must be at least 1".into()));
        }
        if self.leader_elect {
            let (lease, renew, retry) = (
                self.leader_elect_lease_duration,
                self.leader_elect_renew_deadline,
                self.leader_elect_retry_period,
            );
            if retry.is_zero() || renew.is_zero() || lease.is_zero() {
                return Err(FlagError(
                    "--leader-elect-lease-duration, --leader-elect-renew-deadline and --leader-elect-retry-period must all be greater than zero".into(),
                ));
            }
            // The Lease stores whole seconds: a fraction would be cut off there, and other replicas
            // would then count a shorter term than the one this process fences its writes by.
            if lease.subsec_nanos() != 0 || i32::try_from(lease.as_secs()).is_err() {
                return Err(FlagError(format!(
                    "--leader-elect-lease-duration must be a whole number of seconds of at most {}s (the Lease stores leaseDurationSeconds), got {}",
                    i32::MAX,
                    format_duration(lease)
                )));
            }
            if lease <= renew {
                return Err(FlagError(format!(
                    "--leader-elect-lease-duration ({lease:?}) must be greater than --leader-elect-renew-deadline ({renew:?})"
                )));
            }
            if renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
                return Err(FlagError(format!(
                    "--leader-elect-renew-deadline ({renew:?}) must be greater than 1.2 x --leader-elect-retry-period ({retry:?})"
                )));
            }
            if self.leader_elect_resource_name.is_empty() {
                return Err(FlagError(
                    "--leader-elect-resource-name must not be empty".into(),
                ));
            }
        }
        Ok(())
    }

    /// The Lease namespace: the flag, else the pod's namespace, else kube-system.
    pub fn lease_namespace(&self) -> String {
        self.leader_elect_resource_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "kube-system".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<GenericFlags, String> {
        crate::test_support::parse_flags(args).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_match_kube_controller_manager_leader_election() {
        let g = parse(&[]).expect("defaults");
        assert!(g.leader_elect);
        assert_eq!(g.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(g.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(g.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(g.controllers, ["*"]);
        assert!(g.validate().is_ok());
    }

    #[test]
    fn booleans_take_a_value_as_kcm_flags_do() {
        assert!(
            !parse(&["--leader-elect=false"])
                .expect("parse")
                .leader_elect
        );
        assert!(parse(&["--leader-elect"]).expect("parse").leader_elect);
    }

    #[test]
    fn a_renew_deadline_not_below_the_lease_duration_is_rejected_naming_both_flags() {
        let g = parse(&[
            "--leader-elect-lease-duration=10s",
            "--leader-elect-renew-deadline=10s",
        ])
        .expect("parse");
        let msg = g.validate().expect_err("invalid").to_string();
        assert!(
            msg.contains("--leader-elect-lease-duration")
                && msg.contains("--leader-elect-renew-deadline"),
            "{msg}"
        );
    }

    #[test]
    fn a_retry_period_too_close_to_the_renew_deadline_is_rejected() {
        let g = parse(&[
            "--leader-elect-renew-deadline=2s",
            "--leader-elect-retry-period=2s",
        ])
        .expect("parse");
        assert!(g.validate().is_err());
    }

    #[test]
    fn a_lease_duration_that_is_not_whole_seconds_is_refused_naming_the_flag() {
        for lease in ["1500ms", "900ms", "15s1ms"] {
            let g = parse(&[
                &format!("--leader-elect-lease-duration={lease}"),
                "--leader-elect-renew-deadline=500ms",
                "--leader-elect-retry-period=100ms",
            ])
            .expect("parse");
            let msg = g.validate().expect_err(lease).to_string();
            assert!(
                msg.contains("--leader-elect-lease-duration") && msg.contains("whole"),
                "{msg}"
            );
        }
        let whole = parse(&[
            "--leader-elect-lease-duration=2s",
            "--leader-elect-renew-deadline=1500ms",
            "--leader-elect-retry-period=500ms",
        ])
        .expect("parse");
        assert!(
            whole.validate().is_ok(),
            "renew deadline and retry period are never written into the Lease"
        );
    }

    #[test]
    fn a_bad_duration_is_a_parse_error_naming_the_flag() {
        let msg = parse(&["--leader-elect-retry-period=2"]).expect_err("no unit");
        assert!(msg.contains("--leader-elect-retry-period"), "{msg}");
    }

    #[test]
    fn zero_qps_is_rejected() {
        let g = parse(&["--kube-api-qps=0"]).expect("parse");
        assert!(g
            .validate()
            .expect_err("zero")
            .to_string()
            .contains("--kube-api-qps"));
    }

    #[test]
    fn controllers_are_a_comma_list() {
        assert_eq!(
            parse(&["--controllers=-route-controller,*"])
                .expect("parse")
                .controllers,
            ["-route-controller", "*"]
        );
    }
}
