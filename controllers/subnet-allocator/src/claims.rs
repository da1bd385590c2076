//! PodCIDRClaims: one cluster-scoped object per pod CIDR handed out, named after the CIDR and created
//! before the Node is patched, so the API server — not this process's memory — decides who owns a CIDR.
//!
//! Why: the leader fence stops this process from *sending* writes once its lease may have passed to
//! another replica, but a write already sent can be held by a frozen or slow API server and land after
//! the takeover. The new leader's cache cannot contain that in-flight allocation and would hand out the
//! same CIDR. With claims, the second create of one claim fails with 409 AlreadyExists, whichever leader
//! comes second, and that leader picks another CIDR (the pattern of KEP-1880's `IPAddress` objects).
//! A Node PATCH is only sent after its claim exists, so a late PATCH always carries a claimed CIDR.

use std::net::IpAddr;

use ipnet::IpNet;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{GroupVersionKind, ObjectMeta};

/// The claim CRD's API group.
pub const GROUP: &str = "ipam.netcm.io";
/// The claim CRD's version.
pub const VERSION: &str = "v1alpha1";
/// The claim CRD's kind.
pub const KIND: &str = "PodCIDRClaim";
/// The claim CRD's plural resource name.
pub const PLURAL: &str = "podcidrclaims";

/// The label every claim carries, naming the Node it is claimed for (for `kubectl get pcc -l`).
const NODE_LABEL: &str = "ipam.netcm.io/node";

/// A claim as read from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claimed CIDR.
    pub cidr: IpNet,
    /// The Node it is claimed for.
    pub node_name: String,
    /// That Node's UID.
    pub node_uid: String,
    /// The claim object's own UID (a delete precondition).
    pub object_uid: String,
}

/// What creating a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The claim is this Node's (created now, or by an earlier attempt for the same Node UID).
    Ours,
    /// Another Node (UID) holds the claim.
    Taken(Claim),
}

/// A claim request that failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The API call failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The PodCIDRClaim CRD is not installed.
    #[error("the PodCIDRClaim CRD ({PLURAL}.{GROUP}) is not installed: apply charts/netcm/crds/podcidrclaims.yaml, or run with --pod-cidr-claims=false")]
    NotInstalled,
    /// A claim object has a spec netcm cannot read (someone else wrote it).
    #[error("PodCIDRClaim {name} is malformed: {why}")]
    Malformed {
        /// The object.
        name: String,
        /// What is wrong.
        why: String,
    },
}

impl ClaimError {
    /// The `reason` label of a sync that failed on a claim.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Api(e) => netcm_manager::sync_metrics::api_reason(e),
            Self::NotInstalled | Self::Malformed { .. } => {
                netcm_manager::sync_metrics::REASON_ERROR
            }
        }
    }
}

fn api_error(e: kube::Error) -> ClaimError {
    match &e {
        kube::Error::Api(s)
            if s.code == 404 && s.reason == "NotFound" && s.message.contains(PLURAL) =>
        {
            ClaimError::NotInstalled
        }
        _ => ClaimError::Api(e),
    }
}

/// The object name for a CIDR: the address's fields and the prefix joined by `-` (IPv6 fully expanded),
/// so every CIDR has exactly one name and every name exactly one CIDR.
pub fn claim_name(cidr: &IpNet) -> String {
    let cidr = cidr.trunc();
    let addr = match cidr.addr() {
        IpAddr::V4(a) => a
            .octets()
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join("-"),
        IpAddr::V6(a) => a
            .segments()
            .iter()
            .map(|s| format!("{s:x}"))
            .collect::<Vec<_>>()
            .join("-"),
    };
    format!("{addr}-{}", cidr.prefix_len())
}

/// Reads and writes PodCIDRClaims.
#[derive(Clone)]
pub struct Claims {
    api: Api<DynamicObject>,
}

impl Claims {
    /// Claims through `client` (the fenced, rate-limited process client).
    pub fn new(client: kube::Client) -> Self {
        let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
        let resource = ApiResource::from_gvk_with_plural(&gvk, PLURAL);
        Self {
            api: Api::all_with(client, &resource),
        }
    }

    /// Claims `cidr` for the Node `node_name`/`node_uid`; an existing claim for the same Node UID counts as ours.
    pub async fn claim(
        &self,
        cidr: &IpNet,
        node_name: &str,
        node_uid: &str,
    ) -> Result<ClaimOutcome, ClaimError> {
        let name = claim_name(cidr);
        let mut obj = DynamicObject {
            types: Some(kube::core::TypeMeta {
                api_version: format!("{GROUP}/{VERSION}"),
                kind: KIND.to_string(),
            }),
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    [
                        (NODE_LABEL.to_string(), label_value(node_name)),
                        (
                            "app.kubernetes.io/managed-by".to_string(),
                            "netcm".to_string(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            data: serde_json::json!({}),
        };
        obj.data = serde_json::json!({
            "spec": { "cidr": cidr.trunc().to_string(), "nodeName": node_name, "nodeUID": node_uid }
        });
        match netcm_manager::client::unread::create_unread(&self.api, &PostParams::default(), &obj)
            .await
        {
            Ok(_) => Ok(ClaimOutcome::Ours),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self.api.get(&name).await.map_err(api_error)?;
                let claim = parse(&existing)?;
                if claim.node_uid == node_uid {
                    Ok(ClaimOutcome::Ours)
                } else {
                    Ok(ClaimOutcome::Taken(claim))
                }
            }
            Err(e) => Err(api_error(e)),
        }
    }

    /// Every claim.
    pub async fn list(&self) -> Result<Vec<Claim>, ClaimError> {
        let list = self
            .api
            .list(&ListParams::default())
            .await
            .map_err(api_error)?;
        let mut out = Vec::with_capacity(list.items.len());
        for obj in &list.items {
            match parse(obj) {
                Ok(c) => out.push(c),
                Err(e) => tracing::warn!(error = %e, "ignoring a PodCIDRClaim netcm cannot read"),
            }
        }
        Ok(out)
    }

    /// Deletes the claim of `cidr` if, and only if, it is still the one made for Node UID `node_uid`.
    /// Returns whether a claim was deleted.
    pub async fn release(&self, cidr: &IpNet, node_uid: &str) -> Result<bool, ClaimError> {
        let name = claim_name(cidr);
        let Some(existing) = self.api.get_opt(&name).await.map_err(api_error)? else {
            return Ok(false);
        };
        let claim = parse(&existing)?;
        if claim.node_uid != node_uid {
            return Ok(false);
        }
        self.delete(&name, &claim.object_uid).await
    }

    /// Deletes `claim` exactly (the object UID is a precondition, so a claim re-made meanwhile is kept).
    pub async fn delete_claim(&self, claim: &Claim) -> Result<bool, ClaimError> {
        self.delete(&claim_name(&claim.cidr), &claim.object_uid)
            .await
    }

    async fn delete(&self, name: &str, object_uid: &str) -> Result<bool, ClaimError> {
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(object_uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api.delete(name, &dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
            Err(e) => Err(api_error(e)),
        }
    }
}

/// A label value from a Node name: names longer than a label value allows are cut (the label is only a
/// convenience for `kubectl -l`; the spec holds the full name).
fn label_value(name: &str) -> String {
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.', '_']).to_string()
}

fn parse(obj: &DynamicObject) -> Result<Claim, ClaimError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let malformed = |why: &str| ClaimError::Malformed {
        name: name.clone(),
        why: why.to_string(),
    };
    let spec = obj.data.get("spec").ok_or_else(|| malformed("no spec"))?;
    let field = |f: &str| {
        spec.get(f)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| malformed(&format!("no spec.{f}")))
    };
    let cidr: IpNet = field("cidr")?
        .parse()
        .map_err(|_| malformed("spec.cidr is not a CIDR"))?;
    if claim_name(&cidr) != name {
        return Err(malformed(
            "its name is not the one netcm derives from spec.cidr",
        ));
    }
    Ok(Claim {
        cidr: cidr.trunc(),
        node_name: field("nodeName")?,
        node_uid: field("nodeUID")?,
        object_uid: obj.metadata.uid.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn claim_names_are_derived_from_the_cidr_one_to_one() {
        assert_eq!(claim_name(&net("10.244.3.0/24")), "10-244-3-0-24");
        assert_eq!(claim_name(&net("10.244.3.7/24")), "10-244-3-0-24");
        assert_eq!(
            claim_name(&net("fd00:10:244:3::/64")),
            "fd00-10-244-3-0-0-0-0-64"
        );
        assert_ne!(
            claim_name(&net("10.244.3.0/24")),
            claim_name(&net("10.244.3.0/25"))
        );
    }

    #[test]
    fn a_claim_whose_name_does_not_match_its_cidr_is_malformed() {
        let obj = |name: &str| DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some("u".into()),
                ..Default::default()
            },
            data: serde_json::json!({"spec": {"cidr": "10.0.0.0/24", "nodeName": "a", "nodeUID": "a1"}}),
        };
        assert!(parse(&obj("10-0-0-0-24")).is_ok());
        assert!(matches!(
            parse(&obj("10-0-1-0-24")),
            Err(ClaimError::Malformed { .. })
        ));
    }

    #[test]
    fn long_node_names_make_valid_label_values() {
        let long = "a".repeat(62) + "-b";
        let v = label_value(&long);
        assert!(v.len() <= 63 && !v.ends_with('-'));
    }
}
