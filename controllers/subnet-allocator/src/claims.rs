//! PodCIDRClaims: one cluster-scoped object per *block* of pod CIDRs a leader hands out of, named after
//! the block and created before the first Node PATCH with a CIDR of it, so the API server — not this
//! process's memory — decides which leader may use a range.
//!
//! Why: the leader fence stops this process from *sending* writes once its lease may have passed to
//! another replica, but a write already sent can be held by a frozen or slow API server and land after
//! the takeover. The new leader's cache cannot contain that in-flight allocation. With claims, a block
//! has exactly one creator (a second create fails with 409 AlreadyExists), and a new leader keeps the
//! free CIDRs of the blocks it finds quarantined until no earlier write can still land ([`crate::blocks`]).
//! Claims written by earlier netcm versions (one per CIDR, naming a Node) are read as ranges too.

use std::net::IpAddr;

use ipnet::IpNet;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::core::{GroupVersionKind, ObjectMeta};

/// The claim CRD's API group.
pub const GROUP: &str = "ipam.netcm.io";
/// The claim CRD's version.
pub const VERSION: &str = "v1alpha1";
/// The claim CRD's kind.
pub const KIND: &str = "PodCIDRClaim";
/// The claim CRD's plural resource name.
pub const PLURAL: &str = "podcidrclaims";

/// The annotation naming the leader's term (its Lease holder identity) that last took the block into use
/// (created or adopted its claim) or marked it idle: only that term may mark the claim idle
/// ([`Claims::mark_idle`]), and only the next leader trusts the mark.
pub const TERM_ANNOTATION: &str = "ipam.netcm.io/term";

/// [`TERM_ANNOTATION`] as a JSON Pointer, for the idle mark's test.
const TERM_POINTER: &str = "/metadata/annotations/ipam.netcm.io~1term";

/// The annotation a leader that stepped down cleanly sets on a claim (RFC 3339): every write of its term
/// from the block was answered, so none can land late, and the next leader need not quarantine it.
pub const IDLE_ANNOTATION: &str = "ipam.netcm.io/idle-since";

/// [`IDLE_ANNOTATION`] as a JSON Pointer.
const IDLE_POINTER: &str = "/metadata/annotations/ipam.netcm.io~1idle-since";

/// A claim as read from the API: the range it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claimed range (a block, or one node CIDR in claims of earlier versions).
    pub cidr: IpNet,
    /// Its annotations: the release holds of deleted Nodes' CIDRs in the block are kept there
    /// ([`crate::release_hold::record`]).
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl Claim {
    /// The term that last took the block into use, if the claim names one.
    pub fn term(&self) -> Option<&str> {
        self.annotations.get(TERM_ANNOTATION).map(String::as_str)
    }

    /// The claim's idle mark (when it was made, RFC 3339), whoever made it.
    pub fn idle_since(&self) -> Option<&str> {
        self.annotations.get(IDLE_ANNOTATION).map(String::as_str)
    }

    /// Whether the claim carries an idle mark, whoever made it.
    pub fn is_idle(&self) -> bool {
        self.annotations.contains_key(IDLE_ANNOTATION)
    }

    /// Whether `term` marked the claim idle: it stepped down with none of its writes from the block
    /// unanswered, and the mark renamed the claim to it. Only the term right before a leader's is trusted
    /// (`None`: no term is).
    pub fn is_idle_by(&self, term: Option<&str>) -> bool {
        self.is_idle() && term.is_some() && self.term() == term
    }
}

/// What a leader's write to an existing claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimWrite {
    /// The write landed.
    Landed,
    /// The claim is gone (404).
    NotLanded,
    /// The claim no longer is as the write's test expected (422): another term took the block into use,
    /// or marked it, since.
    Refused,
}

/// What creating a block's claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockClaim {
    /// Created now: the block is this leader's.
    Created,
    /// The claim existed (409): another leader's, or one this leader did not list.
    Existed,
}

/// A claim request that failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The API call failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The PodCIDRClaim CRD is not installed.
    #[error("the PodCIDRClaim CRD ({PLURAL}.{GROUP}) is not installed: install it with `kubectl apply --server-side -f charts/netcm/crds/podcidrclaims.yaml` (Helm installs crds/ only on install, never on upgrade), or run with --pod-cidr-claims=false")]
    NotInstalled,
    /// The claim of a block was deleted between its create (409) and this leader's adoption of it.
    #[error("the PodCIDRClaim of {0} was deleted while this leader took it into use; it is claimed again on the next sync")]
    Vanished(IpNet),
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
            Self::NotInstalled | Self::Malformed { .. } | Self::Vanished(_) => {
                netcm_manager::sync_metrics::REASON_ERROR
            }
        }
    }
}

/// A failed list or create of PodCIDRClaims. Neither names an existing object, so a 404 can only mean the
/// resource is not served: a Status naming it while the group exists, or a bare `404 page not found`
/// (which the client reports as unparsable) once no CRD of the group is left.
fn api_error(e: kube::Error) -> ClaimError {
    match &e {
        kube::Error::Api(s) if s.code == 404 => ClaimError::NotInstalled,
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

    /// Claims the block `block` for the leader's `term`.
    pub async fn claim_block(&self, block: &IpNet, term: &str) -> Result<BlockClaim, ClaimError> {
        let obj = DynamicObject {
            types: Some(kube::core::TypeMeta {
                api_version: format!("{GROUP}/{VERSION}"),
                kind: KIND.to_string(),
            }),
            metadata: ObjectMeta {
                name: Some(claim_name(block)),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "netcm".to_string(),
                    )]
                    .into(),
                ),
                annotations: Some([(TERM_ANNOTATION.to_string(), term.to_string())].into()),
                ..Default::default()
            },
            data: serde_json::json!({ "spec": { "cidr": block.trunc().to_string() } }),
        };
        match netcm_manager::client::unread::create_unread(&self.api, &PostParams::default(), &obj)
            .await
        {
            Ok(_) => Ok(BlockClaim::Created),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(BlockClaim::Existed),
            Err(e) => Err(api_error(e)),
        }
    }

    /// Sets (or with `None` removes) the annotation `key` on the claim of `block`: a JSON merge patch of
    /// one key, so writers of other keys never conflict.
    pub async fn annotate(
        &self,
        block: &IpNet,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), ClaimError> {
        let patch = serde_json::json!({ "metadata": { "annotations": { key: value } } });
        self.patch(block, &kube::api::Patch::Merge(&patch))
            .await
            .map_err(ClaimError::Api)
    }

    /// Sends `patch` to the claim of `block`, reading nothing back.
    async fn patch<P: serde::Serialize + std::fmt::Debug>(
        &self,
        block: &IpNet,
        patch: &kube::api::Patch<P>,
    ) -> Result<(), kube::Error> {
        netcm_manager::client::unread::patch_unread(
            &self.api,
            &claim_name(block),
            &kube::api::PatchParams::default(),
            patch,
        )
        .await
    }

    /// `op` as a JSON Patch, or why it could not be built.
    fn json_patch(
        block: &IpNet,
        op: serde_json::Value,
        what: &str,
    ) -> Result<kube::api::Patch<()>, ClaimError> {
        let patch: json_patch::Patch =
            serde_json::from_value(op).map_err(|e| ClaimError::Malformed {
                name: claim_name(block),
                why: format!("{what} could not be built: {e}"),
            })?;
        Ok(kube::api::Patch::Json(patch))
    }

    /// Takes the existing claim of `block` into use for `term`: names the term and clears an idle mark, so
    /// an idle mark of an earlier term that lands late is refused ([`Claims::mark_idle`]). With `named`
    /// (the term the claim named when this leader listed or marked it) the write is a JSON Patch that first
    /// tests the claim still names it and still carries the idle mark `idle_since` (or none): a claim
    /// another term wrote since is [`ClaimWrite::Refused`], not taken over.
    pub async fn adopt(
        &self,
        block: &IpNet,
        term: &str,
        named: Option<&str>,
        idle_since: Option<&str>,
    ) -> Result<ClaimWrite, ClaimError> {
        let sent = match named {
            None => {
                let patch = serde_json::json!({
                    "metadata": { "annotations": { TERM_ANNOTATION: term, IDLE_ANNOTATION: null } }
                });
                self.patch(block, &kube::api::Patch::Merge(&patch)).await
            }
            Some(named) => {
                let op = adoption_patch(named, idle_since, term);
                let patch = Self::json_patch(block, op, "the adoption")?;
                self.patch(block, &patch).await
            }
        };
        written(sent)
    }

    /// Marks the claim of `block` idle for `term`, only while it still names `named` (this term's own
    /// block, or the term this leader listed on it): a JSON Patch whose test the API server refuses (422)
    /// once a later leader adopted the block. The mark renames the claim to `term`, so the next leader,
    /// which trusts only its predecessor's marks, can tell it from an older one.
    pub async fn mark_idle(
        &self,
        block: &IpNet,
        named: &str,
        term: &str,
        since: &str,
    ) -> Result<ClaimWrite, ClaimError> {
        let patch = Self::json_patch(block, idle_patch(named, term, since), "the idle mark")?;
        written(self.patch(block, &patch).await)
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
}

/// What a write to an existing claim found, from the API's answer.
fn written(sent: Result<(), kube::Error>) -> Result<ClaimWrite, ClaimError> {
    match sent {
        Ok(()) => Ok(ClaimWrite::Landed),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(ClaimWrite::NotLanded),
        Err(kube::Error::Api(s)) if s.code == 422 => Ok(ClaimWrite::Refused),
        Err(e) => Err(ClaimError::Api(e)),
    }
}

/// The adoption of a claim this leader knew: if it still names `named` and carries the idle mark
/// `idle_since` (`None`: it is not tested), name `term` and clear the mark. The mark is set before it is
/// removed, since JSON Patch cannot remove a key that may be absent.
fn adoption_patch(named: &str, idle_since: Option<&str>, term: &str) -> serde_json::Value {
    let mut ops = vec![serde_json::json!({ "op": "test", "path": TERM_POINTER, "value": named })];
    if let Some(since) = idle_since {
        ops.push(serde_json::json!({ "op": "test", "path": IDLE_POINTER, "value": since }));
    }
    ops.extend([
        serde_json::json!({ "op": "add", "path": TERM_POINTER, "value": term }),
        serde_json::json!({ "op": "add", "path": IDLE_POINTER, "value": "" }),
        serde_json::json!({ "op": "remove", "path": IDLE_POINTER }),
    ]);
    serde_json::Value::Array(ops)
}

/// The idle mark: if the claim still names `named`, name `term` and set [`IDLE_ANNOTATION`] to `since`.
fn idle_patch(named: &str, term: &str, since: &str) -> serde_json::Value {
    serde_json::json!([
        { "op": "test", "path": TERM_POINTER, "value": named },
        { "op": "add", "path": TERM_POINTER, "value": term },
        { "op": "add", "path": IDLE_POINTER, "value": since },
    ])
}

fn parse(obj: &DynamicObject) -> Result<Claim, ClaimError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let malformed = |why: &str| ClaimError::Malformed {
        name: name.clone(),
        why: why.to_string(),
    };
    let spec = obj.data.get("spec").ok_or_else(|| malformed("no spec"))?;
    let cidr: IpNet = spec
        .get("cidr")
        .and_then(|v| v.as_str())
        .ok_or_else(|| malformed("no spec.cidr"))?
        .parse()
        .map_err(|_| malformed("spec.cidr is not a CIDR"))?;
    if claim_name(&cidr) != name {
        return Err(malformed(
            "its name is not the one netcm derives from spec.cidr",
        ));
    }
    Ok(Claim {
        cidr: cidr.trunc(),
        annotations: obj.metadata.annotations.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
