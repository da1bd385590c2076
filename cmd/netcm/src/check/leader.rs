//! The leader Lease: who leads, since when, last renewal, transitions; no leader → why.

use super::report::Finding;
use super::snapshot::{ago, LeaseState, Snapshot};

/// The pod name in a holder identity (`<hostname>_<uuid>`; in a pod the hostname is the pod's name).
pub fn holder_pod(identity: &str) -> &str {
    identity
        .rsplit_once('_')
        .map(|(h, _)| h)
        .unwrap_or(identity)
}

/// One finding about the Lease.
pub fn check(s: &Snapshot) -> Finding {
    let ns = &s.lease_namespace;
    let lease_ref = format!("{ns}/{}", s.lease_name);
    let pods = format!("kubectl -n {ns} get pods -l app.kubernetes.io/name=netcm -o wide");
    let lease = match &s.lease {
        LeaseState::Found(l) => l,
        LeaseState::NotFound => {
            return Finding::fail(
                "leader",
                format!("no leader: Lease {lease_ref} does not exist, so no netcm has ever led here (or it runs with another --leader-elect-resource-namespace/-name)"),
                format!("install or start netcm (helm install netcm charts/netcm -n {ns}), or pass netcm check the Lease it uses: --leader-elect-resource-namespace/--leader-elect-resource-name"),
            )
        }
        LeaseState::Unreadable(e) => {
            return Finding::fail(
                "leader",
                format!("cannot read Lease {lease_ref}: {e}"),
                format!("run netcm check as a user who may get leases in {ns} (kubectl auth can-i get leases -n {ns})"),
            )
        }
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    let duration = spec.lease_duration_seconds.unwrap_or(15);
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let renewed_text = renewed
        .map(|t| format!("{} ago", ago(s.now, t)))
        .unwrap_or_else(|| "never".into());
    let holder = s.holder().map(str::to_string);
    match holder {
        None => Finding::fail(
            "leader",
            format!("no leader: the last leader released Lease {lease_ref} {renewed_text} (it shut down) and no replica took it over: no netcm replica is running, or none can reach the API server"),
            format!("start a replica (kubectl -n {ns} scale deployment/netcm --replicas=2), then see why the others stopped: {pods}"),
        ),
        Some(h) if !s.has_leader() => Finding::fail(
            "leader",
            format!("no leader: {h} last renewed Lease {lease_ref} {renewed_text}, more than its {duration}s duration: that process is gone or cut off from the API server, and no standby took over (none is running)"),
            format!("start netcm or see why it stopped: {pods}; kubectl -n {ns} logs {} --previous", holder_pod(&h)),
        ),
        Some(h) => {
            let since = spec
                .acquire_time
                .as_ref()
                .map(|t| format!("since {} ({} ago)", t.0.strftime("%Y-%m-%dT%H:%M:%SZ"), ago(s.now, t.0)))
                .unwrap_or_else(|| "since an unknown time".into());
            Finding::ok(
                "leader",
                format!("{h} leads Lease {lease_ref} {since}, renewed {renewed_text}, {transitions} transition(s)"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::super::snapshot::fixtures::*;
    use super::*;

    #[test]
    fn a_fresh_lease_names_its_holder_since_when_and_its_transitions() {
        let s = snapshot("10.244.0.0/16", vec![]);
        let f = check(&s);
        assert_eq!(f.status, Status::Ok);
        assert!(f.message.contains("leader_1 leads"), "{}", f.message);
        assert!(
            f.message.contains("10m ago") && f.message.contains("renewed 1s ago"),
            "{}",
            f.message
        );
        assert!(f.message.contains("0 transition"), "{}", f.message);
    }

    #[test]
    fn a_missing_lease_means_netcm_never_led_here() {
        let mut s = snapshot("10.244.0.0/16", vec![]);
        s.lease = LeaseState::NotFound;
        let f = check(&s);
        assert_eq!(f.status, Status::Fail);
        assert!(f.message.contains("does not exist"));
        assert!(f
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("helm install"));
    }

    #[test]
    fn an_expired_lease_names_the_silent_holder_and_its_pod() {
        let mut s = snapshot("10.244.0.0/16", vec![]);
        s.lease = LeaseState::Found(Box::new(lease("netcm-7d9f-abcde_1234", 40, 2)));
        let f = check(&s);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.message.contains("netcm-7d9f-abcde_1234 last renewed")
                && f.message.contains("40s ago"),
            "{}",
            f.message
        );
        assert!(f
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("logs netcm-7d9f-abcde --previous"));
    }

    #[test]
    fn a_released_lease_means_no_replica_is_standing_by() {
        let mut s = snapshot("10.244.0.0/16", vec![]);
        s.lease = LeaseState::Found(Box::new(lease("", 5, 2)));
        let f = check(&s);
        assert_eq!(f.status, Status::Fail);
        assert!(f.message.contains("released"), "{}", f.message);
        assert!(f.fix.as_deref().unwrap_or_default().contains("scale"));
    }
}
