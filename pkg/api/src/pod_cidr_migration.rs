//! PodCIDRMigration (`podcidrmigrations.ipam.netcm.io/v1alpha1`, cluster-scoped): an operator's request
//! to move every Node's pod CIDRs to one pool — a new cluster range, a new per-Node size, a second
//! family — and, in its status, how far each Node has come, so a new leader resumes where the last
//! one stopped.
//!
//! ```yaml
//! apiVersion: ipam.netcm.io/v1alpha1
//! kind: PodCIDRMigration
//! metadata: {name: to-10-96}
//! spec:
//!   destination: new-range        # a ClusterCIDR's name, or default-cluster-cidr (--cluster-cidr's pool)
//!   maxUnavailable: 1             # Nodes out of service at once
//!   drainTimeoutSeconds: 600
//!   registerTimeoutSeconds: 600
//! ```
//!
//! Two controllers read it: the `pod-cidr-migration` controller writes its status and moves the Nodes;
//! the `subnet-allocator` gives out no new CIDR from any pool but the destination while a migration it
//! has *accepted* runs ([`open_pool`]). A migration closes the other pools only once that controller
//! accepted it (`status.phase` Progressing or Stalled), so an object nobody acts on — the controller
//! off, a destination that does not exist — never stops allocation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ApiResource, DynamicObject};
use serde::{Deserialize, Serialize};

/// The API group, shared with PodCIDRClaim.
pub const GROUP: &str = "ipam.netcm.io";
/// The served version.
pub const VERSION: &str = "v1alpha1";
/// The finalizer the controller keeps on a migration it runs, so that deleting one mid-way first puts
/// back in service the Nodes it cordoned.
pub const FINALIZER: &str = "ipam.netcm.io/pod-cidr-migration";
/// The kind.
pub const KIND: &str = "PodCIDRMigration";
/// The resource.
pub const PLURAL: &str = "podcidrmigrations";

/// Nodes out of service at once when the spec does not say.
pub const DEFAULT_MAX_UNAVAILABLE: u32 = 1;
/// How long a drain may take when the spec does not say: kubectl drain's habit of minutes, not hours.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: u64 = 600;
/// How long a deleted Node may take to register again when the spec does not say: a kubelet restart
/// with its node-status retries, with room for a slow machine.
pub const DEFAULT_REGISTER_TIMEOUT_SECONDS: u64 = 600;

/// The kind as kube's dynamic API reads it.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

/// What the operator asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationSpec {
    /// The pool every Node moves to: a ClusterCIDR's name, or `default-cluster-cidr` for the pool of
    /// `--cluster-cidr`. A rollback is an edit of this field back to the origin.
    pub destination: String,
    /// Nodes out of service (draining or re-registering) at once; [`DEFAULT_MAX_UNAVAILABLE`] if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<u32>,
    /// Seconds a drain may take before the Node fails and is put back in service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout_seconds: Option<u64>,
    /// Seconds a deleted Node may take to register again and be given CIDRs from the destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub register_timeout_seconds: Option<u64>,
}

/// Where a migration stands, as `status.phase` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationPhase {
    /// Not accepted yet: another migration runs, or the controller has not looked.
    Pending,
    /// Refused: its spec cannot be carried out (`status.message` says why); it closes no pool.
    Invalid,
    /// Nodes are moving or waiting to.
    Progressing,
    /// A Node failed toward the destination; no further Node starts until an operator looks.
    Stalled,
    /// Every Node holds CIDRs from the destination alone; the other pools are open again.
    Complete,
}

impl MigrationPhase {
    /// Whether a migration in this phase closes every pool but its destination.
    pub fn closes_pools(self) -> bool {
        matches!(self, MigrationPhase::Progressing | MigrationPhase::Stalled)
    }
}

/// The step one Node is at, as `status.nodes[name].step` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepName {
    /// Cordoned, its pods being evicted.
    Draining,
    /// Deleted, waiting to register again.
    Registering,
    /// Failed to move.
    Failed,
}

/// One moving or failed Node in the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Where it is.
    pub step: StepName,
    /// The pool it moves (or moved) toward.
    pub toward: String,
    /// When the step started (RFC 3339).
    pub since: String,
    /// Draining: the drained Node's UID; Registering: the deleted Node's UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Whether the Node was cordoned before the migration touched it (it is never uncordoned then).
    #[serde(default)]
    pub was_unschedulable: bool,
    /// Failed: why, one word (DrainTimedOut, NeverRegistered, NotAllocated, OutsideDestination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Failed with DrainTimedOut: the pods left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_left: Option<u64>,
    /// Failed with OutsideDestination: the pools its CIDRs came from (empty string: no known pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<Vec<String>>,
}

/// What the controller reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    /// Where the migration stands; absent until the controller first looks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MigrationPhase>,
    /// Why it is Pending, Invalid or Stalled, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The spec's generation the status is of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes holding CIDRs from elsewhere, not started yet.
    #[serde(default)]
    pub waiting: u64,
    /// Nodes being drained.
    #[serde(default)]
    pub draining: u64,
    /// Nodes deleted and not back with CIDRs from the destination yet.
    #[serde(default)]
    pub registering: u64,
    /// Nodes holding CIDRs from the destination alone.
    #[serde(default)]
    pub done: u64,
    /// Nodes that failed toward the destination.
    #[serde(default)]
    pub failed: u64,
    /// Nodes holding no CIDR yet.
    #[serde(default)]
    pub unallocated: u64,
    /// Every moving or failed Node, by name: the state a new leader resumes from.
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeStatus>,
    /// KEP-1623 conditions, one of each type in [`CONDITION_TYPES`], so that `kubectl wait
    /// --for=condition=Complete` works.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The condition types a migration's status carries.
pub const CONDITION_TYPES: [&str; 3] = ["Progressing", "Stalled", "Complete"];

/// The conditions for `phase` (with `message`), each keeping its `lastTransitionTime` from `previous`
/// while its status is unchanged, so a status that says the same compares equal and is not written.
pub fn conditions_for(
    phase: MigrationPhase,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
    now: Time,
) -> Vec<Condition> {
    let reason = match phase {
        MigrationPhase::Pending => "Pending",
        MigrationPhase::Invalid => "Invalid",
        MigrationPhase::Progressing => "NodesMoving",
        MigrationPhase::Stalled => "NodeFailed",
        MigrationPhase::Complete => "AllNodesMoved",
    };
    CONDITION_TYPES
        .iter()
        .map(|type_| {
            let on = matches!(
                (*type_, phase),
                ("Progressing", MigrationPhase::Progressing)
                    | ("Stalled", MigrationPhase::Stalled)
                    | ("Complete", MigrationPhase::Complete)
            );
            let status = if on { "True" } else { "False" }.to_string();
            let since = previous
                .iter()
                .find(|c| c.type_ == *type_ && c.status == status)
                .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
            Condition {
                type_: (*type_).to_string(),
                status,
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// One PodCIDRMigration read from the API.
#[derive(Debug, Clone, PartialEq)]
pub struct Migration {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.creationTimestamp` (RFC 3339), the first key of which migration runs first.
    pub created: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Whether its deletion started: it runs no more, and closes no pool.
    pub deleting: bool,
    /// The spec, or why it does not parse.
    pub spec: Result<MigrationSpec, String>,
    /// The status, or why it does not parse (someone else wrote it).
    pub status: Result<MigrationStatus, String>,
}

impl Migration {
    /// Reads an object; a spec or status that does not parse is kept as its error, so the controller can
    /// say so on the object and the allocator can ignore it.
    pub fn from_object(obj: &DynamicObject) -> Migration {
        let spec = serde_json::from_value::<MigrationSpec>(obj.data["spec"].clone())
            .map_err(|e| format!("spec: {e}"));
        let status = match &obj.data["status"] {
            serde_json::Value::Null => Ok(MigrationStatus::default()),
            v => serde_json::from_value::<MigrationStatus>(v.clone())
                .map_err(|e| format!("status: {e}")),
        };
        Migration {
            name: obj.metadata.name.clone().unwrap_or_default(),
            created: obj
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            generation: obj.metadata.generation,
            deleting: obj.metadata.deletion_timestamp.is_some(),
            spec,
            status,
        }
    }

    /// The phase its status says, if it parses.
    pub fn phase(&self) -> Option<MigrationPhase> {
        self.status.as_ref().ok().and_then(|s| s.phase)
    }

    /// Whether it was accepted and still runs: it then closes every pool but its destination.
    pub fn closes_pools(&self) -> bool {
        !self.deleting
            && self.spec.is_ok()
            && self.phase().is_some_and(MigrationPhase::closes_pools)
    }
}

/// The migrations in the order they run: the oldest first, by creation time and then name.
pub fn in_run_order(migrations: &mut [Migration]) {
    migrations.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
}

/// The one pool the allocator may give new CIDRs from while migrations run: the destination of the
/// oldest accepted, unfinished migration; `None` when none runs and every pool is open. The controller
/// accepts one migration at a time, so "oldest" only decides between objects a person wrote by hand.
pub fn open_pool(migrations: &[Migration]) -> Option<String> {
    let mut running: Vec<Migration> = migrations
        .iter()
        .filter(|m| m.closes_pools())
        .cloned()
        .collect();
    in_run_order(&mut running);
    running
        .into_iter()
        .next()
        .and_then(|m| m.spec.ok())
        .map(|s| s.destination)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(
        name: &str,
        created: &str,
        spec: serde_json::Value,
        phase: Option<&str>,
    ) -> Migration {
        let mut obj = DynamicObject::new(name, &api_resource()).data(json!({ "spec": spec }));
        obj.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                created.parse().expect("a timestamp"),
            ));
        if let Some(p) = phase {
            obj.data["status"] = json!({ "phase": p });
        }
        Migration::from_object(&obj)
    }

    #[test]
    fn a_migration_closes_pools_only_once_the_controller_accepted_it() {
        let spec = json!({ "destination": "new" });
        for (phase, closes) in [
            (None, false),
            (Some("Pending"), false),
            (Some("Invalid"), false),
            (Some("Progressing"), true),
            (Some("Stalled"), true),
            (Some("Complete"), false),
        ] {
            let m = object("m", "2026-01-01T00:00:00Z", spec.clone(), phase);
            assert_eq!(m.closes_pools(), closes, "{phase:?}");
            assert_eq!(
                open_pool(&[m]),
                closes.then(|| "new".to_string()),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn a_migration_being_deleted_closes_no_pool() {
        let spec = json!({ "destination": "new" });
        let mut obj = DynamicObject::new("m", &api_resource())
            .data(json!({ "spec": spec, "status": {"phase": "Progressing"} }));
        assert!(Migration::from_object(&obj).closes_pools());
        obj.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().expect("a timestamp"),
            ));
        assert!(!Migration::from_object(&obj).closes_pools());
    }

    #[test]
    fn the_oldest_running_migration_names_the_open_pool() {
        let older = object(
            "b",
            "2026-01-01T00:00:00Z",
            json!({ "destination": "old-dest" }),
            Some("Progressing"),
        );
        let newer = object(
            "a",
            "2026-02-01T00:00:00Z",
            json!({ "destination": "new-dest" }),
            Some("Progressing"),
        );
        let done = object(
            "0",
            "2025-01-01T00:00:00Z",
            json!({ "destination": "done-dest" }),
            Some("Complete"),
        );
        assert_eq!(
            open_pool(&[newer, done, older]),
            Some("old-dest".to_string())
        );
    }

    #[test]
    fn a_spec_or_status_written_badly_is_kept_as_its_error_and_closes_nothing() {
        let bad_spec = object(
            "m",
            "2026-01-01T00:00:00Z",
            json!({ "destination": 7 }),
            Some("Progressing"),
        );
        assert!(bad_spec.spec.is_err());
        assert!(!bad_spec.closes_pools());
        let bad_status = object(
            "m",
            "2026-01-01T00:00:00Z",
            json!({ "destination": "new" }),
            Some("Sideways"),
        );
        assert!(bad_status.status.is_err());
        assert!(!bad_status.closes_pools());
    }

    #[test]
    fn conditions_say_the_phase_and_keep_their_transition_time_while_unchanged() {
        let t = |s: &str| Time(s.parse().expect("a time"));
        let first = conditions_for(
            MigrationPhase::Progressing,
            "",
            Some(1),
            &[],
            t("2026-01-01T00:00:00Z"),
        );
        let status = |c: &[Condition], type_: &str| {
            c.iter()
                .find(|c| c.type_ == type_)
                .map(|c| (c.status.clone(), c.last_transition_time.clone()))
        };
        assert_eq!(
            status(&first, "Progressing"),
            Some(("True".into(), t("2026-01-01T00:00:00Z")))
        );
        let later = conditions_for(
            MigrationPhase::Progressing,
            "",
            Some(1),
            &first,
            t("2026-01-01T00:05:00Z"),
        );
        assert_eq!(later, first, "nothing changed, nothing to write");
        let done = conditions_for(
            MigrationPhase::Complete,
            "",
            Some(1),
            &later,
            t("2026-01-01T00:09:00Z"),
        );
        assert_eq!(
            status(&done, "Complete"),
            Some(("True".into(), t("2026-01-01T00:09:00Z")))
        );
        assert_eq!(
            status(&done, "Progressing"),
            Some(("False".into(), t("2026-01-01T00:09:00Z")))
        );
        assert_eq!(
            status(&done, "Stalled"),
            Some(("False".into(), t("2026-01-01T00:00:00Z")))
        );
    }

    #[test]
    fn a_status_reads_back_what_was_written() {
        let mut status = MigrationStatus {
            phase: Some(MigrationPhase::Stalled),
            failed: 1,
            ..Default::default()
        };
        status.nodes.insert(
            "n1".into(),
            NodeStatus {
                step: StepName::Failed,
                toward: "new".into(),
                since: "2026-01-01T00:00:00Z".into(),
                uid: None,
                was_unschedulable: false,
                reason: Some("DrainTimedOut".into()),
                pods_left: Some(2),
                pools: None,
            },
        );
        let wire = serde_json::to_value(&status).expect("serializes");
        assert_eq!(wire["nodes"]["n1"]["podsLeft"], 2);
        assert_eq!(
            serde_json::from_value::<MigrationStatus>(wire).expect("parses"),
            status
        );
    }
}
