//! PodCIDRMigrations: one line each — where it stands, and while it runs, that every other pool gives
//! out nothing new (so Nodes that register elsewhere wait), with the Nodes a stall names and why.

use netcm_api::pod_cidr_migration::{Migration, MigrationPhase};

use super::report::Finding;
use super::snapshot::Snapshot;

const RENUMBERING: &str = "docs/renumbering.md";

/// A line per migration; none when there is none.
pub fn check(s: &Snapshot) -> Vec<Finding> {
    let migrations = match &s.migrations {
        Ok(m) => m,
        Err(e) => {
            return vec![Finding::skip(
                "migrations",
                format!("cannot list PodCIDRMigrations: {e}"),
            )]
        }
    };
    migrations.iter().map(finding).collect()
}

fn finding(m: &Migration) -> Finding {
    let name = &m.name;
    let spec = match &m.spec {
        Ok(spec) => spec,
        Err(e) => {
            return Finding::fail(
                "migrations",
                format!("PodCIDRMigration {name}: its {e}"),
                format!("kubectl edit podcidrmigration {name} ({RENUMBERING})"),
            )
        }
    };
    let status = match &m.status {
        Ok(status) => status,
        Err(e) => {
            return Finding::fail(
                "migrations",
                format!("PodCIDRMigration {name}: its {e}; the controller does nothing to it until it reads"),
                format!("kubectl edit podcidrmigration {name} --subresource=status ({RENUMBERING})"),
            )
        }
    };
    let dest = &spec.destination;
    let counts = format!(
        "{} done, {} waiting, {} draining, {} registering again, {} failed",
        status.done, status.waiting, status.draining, status.registering, status.failed
    );
    let message = status.message.clone().unwrap_or_default();
    match status.phase {
        Some(MigrationPhase::Complete) => Finding::ok(
            "migrations",
            format!("PodCIDRMigration {name}: complete, every Node on pool {dest}"),
        ),
        Some(MigrationPhase::Progressing) => Finding::warn(
            "migrations",
            format!("PodCIDRMigration {name}: moving Nodes to pool {dest} ({counts}); no other pool gives out CIDRs meanwhile"),
            format!("kubectl get podcidrmigration {name} -w"),
        ),
        Some(MigrationPhase::Stalled) => {
            let failed: Vec<String> = status
                .nodes
                .iter()
                .filter(|(_, n)| n.reason.is_some() && n.toward == *dest)
                .map(|(node, n)| format!("{node} ({})", n.reason.as_deref().unwrap_or_default()))
                .collect();
            Finding::fail(
                "migrations",
                format!("PodCIDRMigration {name}: stalled moving Nodes to pool {dest} ({counts}): {}; no other pool gives out CIDRs until it completes or is deleted", failed.join(", ")),
                format!("the runbook NetcmPodCIDRMigrationStalled; mend each Node, then remove its entry from status.nodes, or set spec.destination back to roll back ({RENUMBERING})"),
            )
        }
        Some(MigrationPhase::Invalid) => Finding::fail(
            "migrations",
            format!("PodCIDRMigration {name}: invalid: {message}"),
            format!("fix spec.destination (kubectl edit podcidrmigration {name}) or delete it"),
        ),
        Some(MigrationPhase::Pending) => Finding::warn(
            "migrations",
            format!("PodCIDRMigration {name}: pending: {message}"),
            "it starts once the one before it completes".to_string(),
        ),
        None => Finding::warn(
            "migrations",
            format!("PodCIDRMigration {name}: no status: no pod-cidr-migration controller has looked at it"),
            "run the leader with --controllers=*,pod-cidr-migration (chart: podCIDRMigration.enabled=true)".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::super::snapshot::fixtures::snapshot;
    use super::*;
    use kube::api::DynamicObject;
    use serde_json::json;

    fn with(objects: Vec<serde_json::Value>) -> Vec<Finding> {
        let mut s = snapshot("10.244.0.0/16", Vec::new());
        s.migrations = Ok(objects
            .into_iter()
            .map(|data| {
                let obj = DynamicObject::new("m", &netcm_api::pod_cidr_migration::api_resource())
                    .data(data);
                Migration::from_object(&obj)
            })
            .collect());
        check(&s)
    }

    #[test]
    fn no_migration_says_nothing() {
        assert!(with(Vec::new()).is_empty());
    }

    #[test]
    fn a_stalled_migration_fails_naming_each_failed_node_and_its_reason() {
        let f = with(vec![json!({
            "spec": {"destination": "wide"},
            "status": {"phase": "Stalled", "failed": 1, "waiting": 3, "nodes": {
                "n1": {"step": "Failed", "toward": "wide", "since": "2026-01-01T00:00:00Z", "reason": "DrainTimedOut", "podsLeft": 2},
                "n0": {"step": "Failed", "toward": "old", "since": "2026-01-01T00:00:00Z", "reason": "NeverRegistered"}
            }}
        })]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Fail);
        assert!(
            f[0].message.contains("n1 (DrainTimedOut)"),
            "{}",
            f[0].message
        );
        assert!(
            !f[0].message.contains("n0"),
            "a failure toward the old destination is a record"
        );
    }

    #[test]
    fn each_phase_has_its_status_and_a_migration_nobody_looked_at_says_to_enable_the_controller() {
        for (phase, want) in [
            (json!("Complete"), Status::Ok),
            (json!("Progressing"), Status::Warn),
            (json!("Pending"), Status::Warn),
            (json!("Invalid"), Status::Fail),
        ] {
            let f = with(vec![
                json!({"spec": {"destination": "wide"}, "status": {"phase": phase}}),
            ]);
            assert_eq!(f[0].status, want, "{phase}");
        }
        let f = with(vec![json!({"spec": {"destination": "wide"}})]);
        assert_eq!(f[0].status, Status::Warn);
        assert!(
            f[0].fix
                .as_deref()
                .is_some_and(|x| x.contains("pod-cidr-migration")),
            "{:?}",
            f[0].fix
        );
        let f = with(vec![json!({"spec": {"destination": 3}})]);
        assert_eq!(f[0].status, Status::Fail);
    }
}
