//! The pure half of `hack/bench.sh token-expiry` (`e2e/src/bin/bench-token-expiry.rs`): the Deployment
//! patch that gives netcm's pod a short-lived token, what netcm's audited requests say about the tokens it
//! used, and the verdict over what the campaign found — kept here, apart from the cluster, so that which
//! findings fail the campaign, and with which message, is unit-tested.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::{json, Value};

use crate::audit::{self, AuditEvent, CredentialUse};
use crate::jwt::Claims;

/// The shortest lifetime the API server issues.
pub const LIFETIME: i64 = 600;
/// The projected volume that holds the token of LIFETIME seconds.
pub const VOLUME: &str = "token-600s";
/// Where the automounted token would be, so netcm's in-cluster config finds the short one there.
pub const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The Deployment's pod template with its own token of LIFETIME seconds, mounted where the automounted
/// one would be (ca.crt and namespace beside it, as the automount's projected volume has them).
pub fn token_patch() -> Value {
    json!({"spec": {"template": {"spec": {
        "automountServiceAccountToken": false,
        "volumes": [{"name": VOLUME, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": LIFETIME, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}}],
        "containers": [{"name": "netcm", "volumeMounts": [
            {"name": VOLUME, "mountPath": MOUNT, "readOnly": true}
        ]}]
    }}}})
}

/// Who holds netcm's Lease and how often it changed hands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    /// `spec.holderIdentity`, empty when nobody holds it.
    pub holder: String,
    /// `spec.leaseTransitions`.
    pub transitions: i64,
}

impl LeaseState {
    /// The state of a Lease object as `kubectl get -o json` prints it.
    pub fn of(lease: &Value) -> LeaseState {
        LeaseState {
            holder: lease["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            transitions: lease["spec"]["leaseTransitions"].as_i64().unwrap_or(0),
        }
    }
}

/// Whether a pod (as JSON) has the Ready condition True.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The restartCount of a pod's netcm container, -1 when it has none.
pub fn restarts(pod: &Value) -> i64 {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "netcm")
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(-1)
}

/// Whether a line of netcm's log is about tokens or refused requests.
pub fn about_tokens(line: &str) -> bool {
    // The probe Nodes' names hold "token"; the lines about them are the allocator's.
    let line = line.to_ascii_lowercase().replace("token-expiry-", "");
    ["401", "unauthorized", "unauthenticated", "expired", "token"]
        .iter()
        .any(|w| line.contains(w))
}

/// A Unix time in seconds as a timestamp.
pub fn at(unix: i64) -> Timestamp {
    Timestamp::from_second(unix).unwrap()
}

/// Seconds from the first token's expiry (negative before it).
pub fn from_exp(t: Timestamp, exp: Timestamp) -> f64 {
    (t.as_millisecond() - exp.as_millisecond()) as f64 / 1000.0
}

/// The time of day, as the tables print it.
pub fn clock(t: Timestamp) -> String {
    t.strftime("%H:%M:%S").to_string()
}

/// A row of the table of tokens the kubelet wrote: `claims`, first seen in the file at `seen`.
pub fn token_row(seen: Timestamp, claims: &Claims, first_exp: Timestamp) -> String {
    format!(
        "| {} | {} | {} | {} ({:+.0} s from the first exp) |",
        claims.jti,
        clock(at(claims.iat)),
        clock(at(claims.exp)),
        clock(seen),
        from_exp(seen, first_exp)
    )
}

/// A row of the table of netcm's requests by credential: credential `id` (empty when none was
/// recorded), used as `used`, by a token that expires at `token_exp` if it was this pod's.
pub fn credential_row(
    id: &str,
    used: &CredentialUse,
    token_exp: Option<Timestamp>,
    this_pod: bool,
    first_exp: Timestamp,
) -> String {
    let exp = token_exp.map_or("(not this pod's)".to_string(), clock);
    let mine = if this_pod { "" } else { " (earlier pod)" };
    format!(
        "| {}{mine} | {exp} | {} ({:+.0} s) | {} ({:+.0} s) | {} | {} |",
        if id.is_empty() { "(none)" } else { id },
        clock(used.first),
        from_exp(used.first, first_exp),
        clock(used.last),
        from_exp(used.last, first_exp),
        used.count,
        used.codes
            .iter()
            .map(|(c, n)| format!("{c}×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// One probe Node: created with no kubelet behind it, to see whether netcm still gives it pod CIDRs.
#[derive(Debug, Clone)]
pub struct Probe {
    pub name: String,
    pub created: Timestamp,
    /// Seconds from the create to the CIDRs, or None when none came within the probe's wait.
    pub took: Option<f64>,
}

/// What netcm's own audited requests (its user, from its pod) say about the tokens it used.
#[derive(Debug, Clone)]
pub struct TokenUse {
    /// The requests grouped by credential id (`JTI=<jti>`).
    pub by_credential: BTreeMap<String, CredentialUse>,
    /// Successful requests made with a token other than the first after the first one's expiry.
    pub later_token_successes_after_exp: usize,
    /// The requests made with the first token after its expiry, as `<received> <code>`.
    pub first_token_after_exp: Vec<String>,
}

impl TokenUse {
    /// Reads `ours`, netcm's requests as `user`, against the first token's credential id and expiry.
    pub fn of(ours: &[&AuditEvent], user: &str, first_id: &str, first_exp: Timestamp) -> TokenUse {
        let credential = |e: &AuditEvent| e.extra(audit::CREDENTIAL_ID).map(str::to_string);
        let after_exp = |e: &AuditEvent| e.received().is_some_and(|t| t > first_exp);
        TokenUse {
            by_credential: audit::by_credential(ours.iter().copied(), user),
            later_token_successes_after_exp: ours
                .iter()
                .filter(|e| {
                    credential(e).is_some_and(|id| id.starts_with("JTI=") && id != first_id)
                })
                .filter(|e| after_exp(e) && e.succeeded())
                .count(),
            first_token_after_exp: ours
                .iter()
                .filter(|e| credential(e).as_deref() == Some(first_id))
                .filter(|e| after_exp(e))
                .map(|e| format!("{} {:?}", e.request_received_timestamp, e.code()))
                .collect(),
        }
    }

    /// How many distinct tokens (JTIs) netcm authenticated with.
    pub fn jtis(&self) -> usize {
        self.by_credential
            .keys()
            .filter(|k| k.starts_with("JTI="))
            .count()
    }
}

/// What the campaign found, all the verdict looks at.
#[derive(Debug, Clone)]
pub struct Findings {
    /// The first token's expiry.
    pub first_exp: Timestamp,
    pub probes: Vec<Probe>,
    /// The netcm container's restartCount at the end, -1 when its pod was gone.
    pub restart_count: i64,
    pub lease_start: LeaseState,
    pub lease_end: LeaseState,
    /// How many tokens the kubelet wrote into the pod's file while it was watched.
    pub tokens_in_file: usize,
    /// How many distinct tokens netcm authenticated with.
    pub jtis: usize,
    pub later_token_successes_after_exp: usize,
    /// The first token's requests after its expiry, as `<received> <code>`.
    pub first_token_after_exp: Vec<String>,
    /// The first token's credential id, `JTI=<jti>`.
    pub first_id: String,
    /// Whether the audit log has any request made with the first token.
    pub first_token_audited: bool,
}

/// One row of the verdict table.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// What was seen, printed after `ok:` or `FAILED:`.
    pub what: String,
}

impl Check {
    /// The check as a row of the verdict's markdown table.
    pub fn row(&self) -> String {
        let result = if self.ok { "ok:" } else { "FAILED:" };
        format!("| {} | {result} {} |", self.name, self.what)
    }
}

/// Every check, in the order the table prints them.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub checks: Vec<Check>,
}

impl Verdict {
    /// The failed checks as `<check>: <what>`.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.what))
            .collect()
    }

    /// What the campaign prints before it exits 1, or None when it passed.
    pub fn failure_message(&self) -> Option<String> {
        let failures = self.failures();
        (!failures.is_empty()).then(|| format!("token-expiry FAILED:\n  {}", failures.join("\n  ")))
    }
}

/// The campaign passes only if every probe Node got its CIDRs, the container never restarted, the Lease
/// kept its holder and transitions, netcm used at least two tokens, made successful requests with a later
/// token after the first one's expiry and none with the first token after it.
pub fn verdict(f: &Findings) -> Verdict {
    let probes = f.probes.len();
    let got = f.probes.iter().filter(|p| p.took.is_some()).count();
    let slowest = f
        .probes
        .iter()
        .filter_map(|p| p.took)
        .fold(0.0f64, f64::max);
    let after_exp = f
        .probes
        .iter()
        .filter(|p| p.created > f.first_exp && p.took.is_some())
        .count();
    let check = |name, ok, what| Check { name, ok, what };
    Verdict {
        checks: vec![
            check(
                "probe Nodes got pod CIDRs within 30 s",
                got == probes && probes > 0,
                format!(
                    "{got} of {probes} ({after_exp} created after the first token's exp), slowest {slowest:.1} s"
                ),
            ),
            check(
                "netcm container restarts",
                f.restart_count == 0,
                format!("restartCount {}", f.restart_count),
            ),
            check(
                "Lease holder and transitions unchanged",
                f.lease_start == f.lease_end,
                format!(
                    "start {} / {}, end {} / {}",
                    f.lease_start.holder,
                    f.lease_start.transitions,
                    f.lease_end.holder,
                    f.lease_end.transitions
                ),
            ),
            check(
                "distinct tokens (JTIs) netcm authenticated with",
                f.jtis >= 2,
                format!("{} ({} in the file)", f.jtis, f.tokens_in_file),
            ),
            check(
                "successful requests with a later token after the first token's exp",
                f.later_token_successes_after_exp > 0,
                format!("{}", f.later_token_successes_after_exp),
            ),
            check(
                "requests with the first token after its exp",
                f.first_token_after_exp.is_empty(),
                format!(
                    "{} {:?}",
                    f.first_token_after_exp.len(),
                    f.first_token_after_exp.iter().take(3).collect::<Vec<_>>()
                ),
            ),
            check(
                "the first token's requests are in the audit log",
                f.first_token_audited,
                f.first_id.clone(),
            ),
        ],
    }
}

#[cfg(test)]
mod tests;
