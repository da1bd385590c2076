//! Tests of the claim API's pure parts: error meaning, the idle mark and the adoption patches.

use super::*;

#[test]
fn a_404_to_a_list_or_create_means_the_crd_is_not_installed_whatever_its_body() {
    let status = |message: &str, reason: &str, code: u16| {
        kube::Error::Api(
            kube::core::Status::failure(message, reason)
                .with_code(code)
                .boxed(),
        )
    };
    for e in [
        status("404 page not found", "Failed to parse error data", 404),
        status(
            "the server could not find the requested resource",
            "NotFound",
            404,
        ),
    ] {
        assert!(matches!(api_error(e), ClaimError::NotInstalled));
    }
    let forbidden = status("forbidden", "Forbidden", 403);
    assert!(matches!(api_error(forbidden), ClaimError::Api(_)));
}

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

#[test]
fn the_idle_mark_tests_the_term_listed_then_names_the_marking_term_and_sets_the_annotation() {
    let p = idle_patch("a@1", "b_2", "2026-11-26T00:00:00Z");
    assert_eq!(
        p[0],
        serde_json::json!({"op": "test", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": "a@1"})
    );
    assert_eq!(
        p[1],
        serde_json::json!({"op": "add", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": "b_2"})
    );
    assert_eq!(
        p[2],
        serde_json::json!({"op": "add", "path": "/metadata/annotations/ipam.netcm.io~1idle-since", "value": "2026-11-26T00:00:00Z"})
    );
    let parsed: Result<json_patch::Patch, _> = serde_json::from_value(p);
    assert!(parsed.is_ok(), "{parsed:?}");
}

#[test]
fn an_adoption_tests_the_term_and_idle_mark_it_knew_then_names_its_term_and_clears_any_mark() {
    let p = adoption_patch("a_1", Some("2026-11-29T09:00:00Z"), "b_2");
    let ops = p.as_array().expect("a JSON Patch");
    assert_eq!(
        ops[..2],
        [
            serde_json::json!({"op": "test", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": "a_1"}),
            serde_json::json!({"op": "test", "path": "/metadata/annotations/ipam.netcm.io~1idle-since", "value": "2026-11-29T09:00:00Z"}),
        ]
    );
    let mut claim = serde_json::json!({"metadata": {"annotations": {
        TERM_ANNOTATION: "a_1", IDLE_ANNOTATION: "2026-11-29T09:00:00Z"
    }}});
    let patch: json_patch::Patch = serde_json::from_value(p).expect("patch");
    json_patch::patch(&mut claim, &patch).expect("applies to the claim it knew");
    assert_eq!(
        claim,
        serde_json::json!({"metadata": {"annotations": {TERM_ANNOTATION: "b_2"}}})
    );
    let mut no_mark = serde_json::json!({"metadata": {"annotations": {TERM_ANNOTATION: "a_1"}}});
    let untested: json_patch::Patch =
        serde_json::from_value(adoption_patch("a_1", None, "b_2")).expect("patch");
    json_patch::patch(&mut no_mark, &untested).expect("a claim without a mark is adopted too");
    assert_eq!(
        no_mark,
        serde_json::json!({"metadata": {"annotations": {TERM_ANNOTATION: "b_2"}}})
    );
    let mut taken = serde_json::json!({"metadata": {"annotations": {TERM_ANNOTATION: "a_1"}}});
    assert!(
        json_patch::patch(&mut taken, &patch).is_err(),
        "a claim whose idle mark was cleared since is not adopted"
    );
}

#[test]
fn only_the_term_that_marked_a_claim_idle_is_trusted_with_it() {
    let claim = |annotations: &[(&str, &str)]| Claim {
        cidr: net("10.0.0.0/18"),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let idle = claim(&[
        (TERM_ANNOTATION, "a_1"),
        (IDLE_ANNOTATION, "2026-11-27T00:00:00Z"),
    ]);
    assert!(idle.is_idle_by(Some("a_1")));
    assert!(
        !idle.is_idle_by(Some("b_2")),
        "a leader between a_1 and this one may have used the block"
    );
    assert!(
        !idle.is_idle_by(None),
        "an unknown predecessor vouches for nothing"
    );
    let open = claim(&[(TERM_ANNOTATION, "a_1")]);
    assert!(!open.is_idle_by(Some("a_1")));
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
