//! The leader's effective configuration, published as an annotation on its Lease when it takes the
//! lease, so `netcm check` (and anyone with `kubectl get lease`) can read the cluster CIDRs, masks and
//! lease settings the running leader uses without access to its pod, its logs or its metrics port.
//!
//! Why the Lease: it is the one object every leader already writes (no new RBAC: `get` and `update` on
//! it are granted), it names the holder, and it is gone from consideration when nobody leads. The write
//! happens once per term, before the renew loop starts, so it never races a renewal.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};

/// The annotation on the Lease holding [`EffectiveConfiguration`] as JSON.
pub const ANNOTATION: &str = "netcm.io/effective-configuration";

/// What the leader runs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct EffectiveConfiguration {
    /// The leader's identity (the Lease's holder when it wrote this).
    pub identity: String,
    /// netcm's version.
    pub version: String,
    /// The controllers enabled by `--controllers`, canonical names.
    pub controllers: Vec<String>,
    /// Controller flags as `--flag` → value (the effective-configuration log lines).
    pub flags: BTreeMap<String, String>,
}

impl EffectiveConfiguration {
    /// Reads the configuration from a Lease, if it carries one that parses.
    pub fn from_lease(lease: &Lease) -> Option<EffectiveConfiguration> {
        let raw = lease.metadata.annotations.as_ref()?.get(ANNOTATION)?;
        serde_json::from_str(raw).ok()
    }

    /// A flag's value, if published and not empty.
    pub fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Writes `config` onto the Lease `name` while `config.identity` holds it (read-modify-update with the
/// resourceVersion, retried on conflict, within `timeout`). Failure is logged, never fatal: the
/// annotation is a convenience for diagnosis.
pub async fn publish(
    api: &Api<Lease>,
    name: &str,
    config: &EffectiveConfiguration,
    timeout: Duration,
) {
    let value = match serde_json::to_string(config) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "could not encode the effective configuration");
            return;
        }
    };
    let attempt = async {
        for _ in 0..5 {
            let mut lease = api.get(name).await?;
            let holder = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref());
            if holder != Some(config.identity.as_str()) {
                return Ok(false);
            }
            let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
            if annotations.get(ANNOTATION) == Some(&value) {
                return Ok(true);
            }
            annotations.insert(ANNOTATION.to_string(), value.clone());
            match api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(true)) => {
            tracing::info!(
                lease = name,
                annotation = ANNOTATION,
                "published the effective configuration on the lease"
            )
        }
        Ok(Ok(false)) => {
            tracing::warn!(
                lease = name,
                "did not publish the effective configuration: the lease changed hands"
            )
        }
        Ok(Err(e)) => {
            tracing::warn!(lease = name, error = %e, "could not publish the effective configuration on the lease")
        }
        Err(_) => tracing::warn!(
            lease = name,
            "timed out publishing the effective configuration on the lease"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn the_configuration_round_trips_through_the_lease_annotation() {
        let config = EffectiveConfiguration {
            identity: "host_1".into(),
            version: "0.1.0".into(),
            controllers: vec!["subnet-allocator".into()],
            flags: [("--cluster-cidr".to_string(), "10.244.0.0/16".to_string())].into(),
        };
        let lease = Lease {
            metadata: ObjectMeta {
                annotations: Some(
                    [(
                        ANNOTATION.to_string(),
                        serde_json::to_string(&config).expect("json"),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: None,
        };
        let read = EffectiveConfiguration::from_lease(&lease).expect("parses");
        assert_eq!(read, config);
        assert_eq!(read.flag("--cluster-cidr"), Some("10.244.0.0/16"));
        assert_eq!(read.flag("--service-cluster-ip-range"), None);
    }

    #[test]
    fn a_lease_without_the_annotation_has_no_configuration() {
        assert_eq!(EffectiveConfiguration::from_lease(&Lease::default()), None);
    }
}
