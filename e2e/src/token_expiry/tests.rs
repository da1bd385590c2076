use super::*;

const EXP: &str = "2026-11-26T10:10:00Z";

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn probe(created: &str, took: Option<f64>) -> Probe {
    Probe {
        name: format!("token-expiry-{created}"),
        created: ts(created),
        took,
    }
}

fn lease(holder: &str, transitions: i64) -> LeaseState {
    LeaseState {
        holder: holder.into(),
        transitions,
    }
}

/// A run that passes: every probe answered, one before and one after the exp, netcm on its second token.
fn passing() -> Findings {
    Findings {
        first_exp: ts(EXP),
        probes: vec![
            probe("2026-11-26T10:09:30Z", Some(0.4)),
            probe("2026-11-26T10:10:30Z", Some(0.6)),
        ],
        restart_count: 0,
        lease_start: lease("netcm-abc_1", 1),
        lease_end: lease("netcm-abc_1", 1),
        tokens_in_file: 2,
        jtis: 2,
        later_token_successes_after_exp: 5,
        first_token_after_exp: Vec::new(),
        first_id: "JTI=one".into(),
        first_token_audited: true,
    }
}

/// The names of the failed checks and the message the campaign exits 1 with.
fn failed(f: &Findings) -> (Vec<&'static str>, String) {
    let v = verdict(f);
    let names = v.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    (names, v.failure_message().unwrap_or_default())
}

#[test]
fn a_run_that_kept_working_passes_with_every_check_ok() {
    let v = verdict(&passing());
    assert_eq!(v.checks.len(), 7);
    assert!(v.checks.iter().all(|c| c.ok), "{v:?}");
    assert_eq!(v.failure_message(), None);
    assert_eq!(
        v.checks[0].row(),
        "| probe Nodes got pod CIDRs within 30 s | ok: 2 of 2 (1 created after the first token's exp), slowest 0.6 s |"
    );
}

#[test]
fn a_probe_node_without_cidrs_fails() {
    let mut f = passing();
    f.probes.push(probe("2026-11-26T10:11:00Z", None));
    let (names, message) = failed(&f);
    assert_eq!(names, ["probe Nodes got pod CIDRs within 30 s"]);
    assert_eq!(
        message,
        "token-expiry FAILED:\n  probe Nodes got pod CIDRs within 30 s: 2 of 3 (1 created after the first token's exp), slowest 0.6 s"
    );
}

#[test]
fn no_probe_nodes_at_all_fails() {
    let mut f = passing();
    f.probes.clear();
    let (names, message) = failed(&f);
    assert_eq!(names, ["probe Nodes got pod CIDRs within 30 s"]);
    assert!(message.contains("0 of 0"), "{message}");
}

#[test]
fn a_restarted_container_fails() {
    let mut f = passing();
    f.restart_count = 1;
    let (names, message) = failed(&f);
    assert_eq!(names, ["netcm container restarts"]);
    assert!(
        message.ends_with("netcm container restarts: restartCount 1"),
        "{message}"
    );
}

#[test]
fn a_pod_gone_at_the_end_fails_as_a_restart() {
    let mut f = passing();
    f.restart_count = -1;
    assert_eq!(failed(&f).0, ["netcm container restarts"]);
}

#[test]
fn a_lease_that_changed_hands_fails() {
    let mut f = passing();
    f.lease_end = lease("netcm-def_2", 2);
    let (names, message) = failed(&f);
    assert_eq!(names, ["Lease holder and transitions unchanged"]);
    assert!(
        message.ends_with("start netcm-abc_1 / 1, end netcm-def_2 / 2"),
        "{message}"
    );
}

#[test]
fn netcm_on_a_single_token_fails() {
    let mut f = passing();
    f.jtis = 1;
    let (names, message) = failed(&f);
    assert_eq!(names, ["distinct tokens (JTIs) netcm authenticated with"]);
    assert!(message.ends_with(": 1 (2 in the file)"), "{message}");
}

#[test]
fn no_successful_request_with_a_later_token_after_the_exp_fails() {
    let mut f = passing();
    f.later_token_successes_after_exp = 0;
    assert_eq!(
        failed(&f).0,
        ["successful requests with a later token after the first token's exp"]
    );
}

#[test]
fn a_request_with_the_first_token_after_its_exp_fails_and_names_three() {
    let mut f = passing();
    f.first_token_after_exp = (1..=4)
        .map(|s| format!("2026-11-26T10:10:0{s}Z Some(401)"))
        .collect();
    let (names, message) = failed(&f);
    assert_eq!(names, ["requests with the first token after its exp"]);
    assert!(
        message.ends_with(
            ": 4 [\"2026-11-26T10:10:01Z Some(401)\", \"2026-11-26T10:10:02Z Some(401)\", \"2026-11-26T10:10:03Z Some(401)\"]"
        ),
        "{message}"
    );
}

#[test]
fn a_first_token_missing_from_the_audit_log_fails() {
    let mut f = passing();
    f.first_token_audited = false;
    let (names, message) = failed(&f);
    assert_eq!(names, ["the first token's requests are in the audit log"]);
    assert!(message.ends_with(": JTI=one"), "{message}");
}

#[test]
fn every_failure_is_named_one_per_line() {
    let mut f = passing();
    f.restart_count = 2;
    f.jtis = 1;
    let (names, message) = failed(&f);
    assert_eq!(names.len(), 2);
    assert_eq!(message.lines().count(), 3, "{message}");
}

fn request(at: &str, jti: &str, code: u16) -> AuditEvent {
    serde_json::from_str(&format!(
        r#"{{"auditID":"{at}{jti}","stage":"ResponseComplete","verb":"update","requestReceivedTimestamp":"{at}",
        "user":{{"username":"system:serviceaccount:kube-system:netcm",
        "extra":{{"authentication.kubernetes.io/credential-id":["JTI={jti}"]}}}},
        "responseStatus":{{"code":{code}}}}}"#
    ))
    .unwrap()
}

#[test]
fn token_use_counts_later_successes_and_first_token_requests_after_the_exp() {
    let events = [
        request("2026-11-26T10:09:00Z", "one", 200),
        request("2026-11-26T10:09:30Z", "two", 200),
        request("2026-11-26T10:10:30Z", "two", 200),
        request("2026-11-26T10:10:40Z", "two", 409),
        request("2026-11-26T10:10:50Z", "one", 401),
    ];
    let ours: Vec<&AuditEvent> = events.iter().collect();
    let used = TokenUse::of(
        &ours,
        "system:serviceaccount:kube-system:netcm",
        "JTI=one",
        ts(EXP),
    );
    assert_eq!(used.jtis(), 2);
    assert_eq!(used.later_token_successes_after_exp, 1);
    assert_eq!(
        used.first_token_after_exp,
        ["2026-11-26T10:10:50Z Some(401)"]
    );
}

#[test]
fn log_lines_about_probe_nodes_are_not_about_tokens() {
    assert!(!about_tokens(
        "allocated 10.0.3.0/24 to Node token-expiry-1764-03"
    ));
    assert!(about_tokens("HTTP 401 Unauthorized"));
    assert!(about_tokens("reloading the ServiceAccount token"));
}

#[test]
fn rows_give_times_of_day_and_seconds_from_the_first_exp() {
    let claims = Claims {
        iat: ts("2026-11-26T10:08:20Z").as_second(),
        exp: ts("2026-11-26T10:18:20Z").as_second(),
        jti: "two".into(),
        sub: "system:serviceaccount:kube-system:netcm".into(),
        pod: Some("netcm-abc".into()),
    };
    assert_eq!(
        token_row(ts("2026-11-26T10:08:30Z"), &claims, ts(EXP)),
        "| two | 10:08:20 | 10:18:20 | 10:08:30 (-90 s from the first exp) |"
    );
    let used = CredentialUse {
        first: ts("2026-11-26T10:09:07Z"),
        last: ts("2026-11-26T10:12:00Z"),
        count: 3,
        codes: [(200, 2), (409, 1)].into(),
        pods: Default::default(),
    };
    assert_eq!(
        credential_row("JTI=two", &used, Some(at(claims.exp)), true, ts(EXP)),
        "| JTI=two | 10:18:20 | 10:09:07 (-53 s) | 10:12:00 (+120 s) | 3 | 200×2, 409×1 |"
    );
    assert_eq!(
        credential_row("", &used, None, false, ts(EXP)),
        "| (none) (earlier pod) | (not this pod's) | 10:09:07 (-53 s) | 10:12:00 (+120 s) | 3 | 200×2, 409×1 |"
    );
}
