//! A whole protobuf answer (a NodeList page, a Node, a Status) as the informer's client reads it: what
//! the transcoder accepts must come out as JSON that kube and the informer decode, with every Node
//! cached as a full Node of the same JSON would be.

use crate::check_informer_node;
use kube::core::ObjectList;
use netcm_manager::node_fields::WireNode;
use serde_json::Value;

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Ok(json) = netcm_protobuf::transcode_object(data) else {
        return;
    };
    let v: Value = serde_json::from_slice(&json).expect("the transcoder writes JSON");
    match v["kind"].as_str() {
        Some("Node") => {
            check_informer_node(&json);
        }
        Some("NodeList") => {
            let list: ObjectList<WireNode> = serde_json::from_slice(&json)
                .unwrap_or_else(|e| panic!("kube cannot decode the list page {v}: {e}"));
            let items = v["items"].as_array().expect("items");
            assert_eq!(list.items.len(), items.len());
            for item in items {
                check_informer_node(item.to_string().as_bytes());
            }
        }
        Some("Status") => crate::check_status(&v),
        other => panic!("the transcoder wrote kind {other:?}"),
    }
}
