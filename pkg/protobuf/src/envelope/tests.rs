use super::*;
use crate::WatchFrames;
use serde_json::{json, Map, Value as Json};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn pick(from: &Json, keys: &[&str]) -> Map<String, Json> {
    keys.iter()
        .filter_map(|k| from.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
}

fn pick_each(list: Option<&Json>, keys: &[&str]) -> Option<Json> {
    let items = list?.as_array()?;
    Some(Json::Array(
        items.iter().map(|i| Json::Object(pick(i, keys))).collect(),
    ))
}

/// What the transcoder must write for a Node the API server wrote as `node` in JSON: the same values
/// for every field the informer decodes, nothing else.
fn expected_node(node: &Json) -> Json {
    let meta = pick(
        &node["metadata"],
        &[
            "name",
            "uid",
            "resourceVersion",
            "deletionTimestamp",
            "labels",
            "annotations",
        ],
    );
    let mut meta = meta;
    if let Some(owners) = annotation_owners(&node["metadata"]) {
        meta.insert("managedFields".into(), owners);
    }
    let mut spec = pick(
        &node["spec"],
        &["podCIDR", "podCIDRs", "providerID", "unschedulable"],
    );
    if let Some(t) = pick_each(node["spec"].get("taints"), &["key", "value", "effect"]) {
        spec.insert("taints".into(), t);
    }
    let mut status = pick(&node["status"], &["addresses"]);
    let conditions = pick_each(
        node["status"].get("conditions"),
        &["type", "status", "reason", "message"],
    );
    if let Some(c) = conditions {
        status.insert("conditions".into(), c);
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec, "status": status})
}

/// Of the API server's `managedFields`, the entries that own annotations: manager and those keys.
fn annotation_owners(meta: &Json) -> Option<Json> {
    let owners: Vec<Json> = meta
        .get("managedFields")?
        .as_array()?
        .iter()
        .filter_map(|e| {
            let keys: Map<String, Json> = e["fieldsV1"]["f:metadata"]["f:annotations"]
                .as_object()?
                .keys()
                .filter(|k| k.starts_with("f:"))
                .map(|k| (k.clone(), json!({})))
                .collect();
            (!keys.is_empty()).then(|| {
                json!({"manager": e["manager"], "fieldsV1": {"f:metadata": {"f:annotations": keys}}})
            })
        })
        .collect();
    (!owners.is_empty()).then_some(Json::Array(owners))
}

#[test]
fn a_node_comes_out_as_the_api_servers_own_json_of_the_fields_read() {
    let server: Json = serde_json::from_slice(&fixture("node-deleting.json")).expect("JSON");
    let ours: Json = serde_json::from_slice(
        &transcode_object(&fixture("node-deleting.pb")).expect("transcoded"),
    )
    .expect("valid JSON");
    assert_eq!(ours, expected_node(&server));
    // Not vacuous: the fixture has what the comparison is about.
    assert!(ours["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        ours["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:annotations"]
            .as_object()
            .map(Map::len),
        Some(3)
    );
    // Two taints sent, and the one the API server adds to an unschedulable Node.
    assert_eq!(ours["spec"]["taints"].as_array().map(Vec::len), Some(3));
    assert!(ours["metadata"]["annotations"]["multi"]
        .as_str()
        .is_some_and(|s| s.contains('\u{1}') && s.contains('\n')));
}

#[test]
fn a_list_page_keeps_its_resource_version_continue_token_and_items() {
    let server: Json = serde_json::from_slice(&fixture("list-page.json")).expect("JSON");
    let ours: Json =
        serde_json::from_slice(&transcode_object(&fixture("list-page.pb")).expect("transcoded"))
            .expect("valid JSON");
    assert_eq!(ours["kind"], "NodeList");
    assert_eq!(
        ours["metadata"],
        Json::Object(pick(
            &server["metadata"],
            &["resourceVersion", "continue", "remainingItemCount"]
        ))
    );
    assert!(ours["metadata"]["continue"].is_string());
    let items: Vec<Json> = server["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(expected_node)
        .collect();
    assert_eq!(ours["items"], Json::Array(items));
}

#[test]
fn a_watch_split_anywhere_gives_the_api_servers_events_line_by_line() {
    let bytes = fixture("watch.pb");
    let server: Vec<Json> = fixture("watch.json")
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("a JSON event"))
        .collect();
    assert_eq!(server.len(), 3, "two ADDED and the end bookmark");
    for chunk in [1, 3, 7, 100, bytes.len()] {
        let mut frames = WatchFrames::new();
        let mut out = Vec::new();
        for piece in bytes.chunks(chunk) {
            out.extend(frames.push(piece).expect("well formed"));
        }
        frames.finish().expect("ends between frames");
        let ours: Vec<Json> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("a JSON line"))
            .collect();
        let want: Vec<Json> = server
            .iter()
            .map(|e| json!({"type": e["type"], "object": expected_node(&e["object"])}))
            .collect();
        assert_eq!(ours, want, "chunks of {chunk}");
    }
}

#[test]
fn errors_come_out_as_statuses_with_their_code_and_reason() {
    let gone = fixture("watch-gone.pb");
    let out = WatchFrames::new().push(&gone).expect("one event");
    let event: Json = serde_json::from_slice(&out).expect("JSON");
    assert_eq!(event["type"], "ERROR");
    assert_eq!(
        (
            event["object"]["code"].as_i64(),
            event["object"]["reason"].as_str()
        ),
        (Some(410), Some("Expired"))
    );
    let missing: Json =
        serde_json::from_slice(&transcode_object(&fixture("status-404.pb")).expect("transcoded"))
            .expect("JSON");
    assert_eq!(
        (missing["code"].as_i64(), missing["reason"].as_str()),
        (Some(404), Some("NotFound"))
    );
    assert_eq!(missing["kind"], "Status");
}

/// A Status answer in its envelope: status = 2, message = 3, reason = 4, code = 6, each left out when
/// empty (as protobuf leaves them out).
fn status_answer(status: &str, message: &str, reason: &str, code: u64) -> Vec<u8> {
    let mut type_meta = Vec::new();
    wire::encode::bytes(&mut type_meta, 1, b"v1");
    wire::encode::bytes(&mut type_meta, 2, b"Status");
    let mut raw = Vec::new();
    for (field, value) in [(2, status), (3, message), (4, reason)] {
        if !value.is_empty() {
            wire::encode::bytes(&mut raw, field, value.as_bytes());
        }
    }
    if code != 0 {
        wire::encode::uint(&mut raw, 6, code);
    }
    let mut unknown = Vec::new();
    wire::encode::bytes(&mut unknown, 1, &type_meta);
    wire::encode::bytes(&mut unknown, 2, &raw);
    [MAGIC, &unknown].concat()
}

// Found by fuzz/fuzz_targets/protobuf_object.rs: an empty status came out as `"status":""`, which the
// API server leaves out (`omitempty`) and kube's Status cannot decode (not Success or Failure).
#[test]
fn a_status_leaves_out_its_empty_fields_as_the_api_servers_json_does() {
    let json = |body: &[u8]| -> Json {
        serde_json::from_slice(&transcode_object(body).expect("transcoded")).expect("JSON")
    };
    assert_eq!(
        json(&status_answer("", "", "", 0)),
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}})
    );
    assert_eq!(
        json(&status_answer("Failure", "gone", "", 410)),
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
               "message": "gone", "code": 410})
    );
    let mut frame = Vec::new();
    let mut raw_extension = Vec::new();
    wire::encode::bytes(&mut raw_extension, 1, &status_answer("", "", "Expired", 0));
    wire::encode::bytes(&mut frame, 1, b"ERROR");
    wire::encode::bytes(&mut frame, 2, &raw_extension);
    let mut line = Vec::new();
    transcode_watch_event(&frame, &mut line).expect("an event");
    let event: Json = serde_json::from_slice(&line).expect("JSON");
    assert_eq!(
        event["object"],
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "reason": "Expired"})
    );
}

#[test]
fn garbage_is_an_error_and_a_stream_cut_inside_a_frame_is_noticed() {
    assert_eq!(
        transcode_object(b"{\"kind\":\"Node\"}"),
        Err(ProtobufError::NoMagic)
    );
    let node = fixture("node-deleting.pb");
    assert_eq!(
        transcode_object(&node[..node.len() - 3]),
        Err(ProtobufError::Truncated)
    );
    let watch = fixture("watch.pb");
    let mut frames = WatchFrames::new();
    let out = frames
        .push(&watch[..watch.len() - 1])
        .expect("complete frames are read");
    assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 2);
    assert_eq!(frames.finish(), Err(ProtobufError::Truncated));
    let mut huge = WatchFrames::new();
    assert_eq!(
        huge.push(&[0xff, 0xff, 0xff, 0xff]),
        Err(ProtobufError::FrameTooLong(0xffff_ffff))
    );
}

#[test]
fn an_object_of_another_kind_is_refused_by_name() {
    let mut type_meta = Vec::new();
    wire::encode::bytes(&mut type_meta, 1, b"v1");
    wire::encode::bytes(&mut type_meta, 2, b"Pod");
    let mut unknown = Vec::new();
    wire::encode::bytes(&mut unknown, 1, &type_meta);
    wire::encode::bytes(&mut unknown, 2, b"");
    let body = [MAGIC, &unknown].concat();
    assert_eq!(
        transcode_object(&body),
        Err(ProtobufError::UnexpectedKind("Pod".into()))
    );
}
