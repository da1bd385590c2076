//! A protobuf watch stream as the informer's client reads it: the HTTP body's chunks split it anywhere
//! (here where the first byte's generator says), and the events must come out the same as from the
//! whole stream at once; every event line is JSON that kube's watch decoder reads, every Node in it
//! cached as a full Node would be.

use kube::core::WatchEvent;
use netcm_manager::node_fields::WireNode;
use netcm_protobuf::WatchFrames;
use serde_json::Value;

/// The lengths of the chunks `stream` is cut into, from a small generator seeded by `seed`.
fn chunks(seed: u8, stream: &[u8]) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 1;
    let mut out = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = if seed & 1 == 0 {
            (state % 7) as usize
        } else {
            (state % 64) as usize + 1
        };
        let (head, tail) = rest.split_at(n.min(rest.len()));
        out.push(head);
        rest = tail;
    }
    out
}

fn check_line(line: &[u8]) {
    let v: Value = serde_json::from_slice(line).expect("each event is one JSON line");
    let kind = v["object"]["kind"].as_str();
    let decodes = match (v["type"].as_str(), kind) {
        (Some("ADDED" | "MODIFIED" | "DELETED"), Some("Node")) => true,
        // kube's bookmark needs the resourceVersion, which the API server always sends.
        (Some("BOOKMARK"), Some("Node")) => v["object"]["metadata"]["resourceVersion"].is_string(),
        (Some("ERROR"), Some("Status")) => crate::kube_reads_status(&v["object"]),
        _ => false,
    };
    if decodes {
        serde_json::from_slice::<WatchEvent<WireNode>>(line).unwrap_or_else(|e| {
            panic!(
                "kube cannot decode the watch event {}: {e}",
                String::from_utf8_lossy(line)
            )
        });
    }
    match kind {
        Some("Node") => {
            crate::check_informer_node(v["object"].to_string().as_bytes());
        }
        Some("Status") => crate::check_status(&v["object"]),
        other => panic!("the transcoder wrote an event of kind {other:?}"),
    }
}

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let mut whole = WatchFrames::new();
    let at_once = whole
        .push(stream)
        .and_then(|out| whole.finish().map(|()| out));

    let mut split = WatchFrames::new();
    let mut events = Vec::new();
    let mut failed = None;
    for chunk in chunks(seed, stream) {
        match split.push(chunk) {
            Ok(out) => events.extend_from_slice(&out),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let in_chunks = match failed {
        Some(e) => Err(e),
        None => split.finish().map(|()| events.clone()),
    };
    match (&at_once, &in_chunks) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "events differ when the stream is split"),
        // The whole push returns no event once one frame fails; the split one returned those before.
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("whole: {at_once:?}, split: {in_chunks:?}"),
    }
    assert!(events.is_empty() || events.ends_with(b"\n"));
    for line in events.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        check_line(line);
    }
}
