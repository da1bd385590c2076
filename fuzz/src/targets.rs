//! One module per fuzz target, named after it, each with the `check` its `fuzz_targets/<name>.rs`
//! runs; [`ALL`] is what `tests/corpus_replay.rs` replays the committed corpus through.

pub mod allocator_flags;
pub mod annotation_prefix;
pub mod cached_node;
pub mod cluster_cidr;
pub mod duration;
pub mod effective_configuration;
pub mod lease_plan;
pub mod node_json;
pub mod protobuf_node;
pub mod protobuf_object;
pub mod watch_frames;

/// A target's checks, on one input as libFuzzer hands it over; they panic where one fails.
pub type Check = fn(&[u8]);

/// Every target's name (its `[[bin]]` in Cargo.toml, its corpus directory) and check. The replay test
/// compares the names with Cargo.toml's, so a target missing here fails it.
pub const ALL: &[(&str, Check)] = &[
    ("allocator_flags", allocator_flags::check),
    ("annotation_prefix", annotation_prefix::check),
    ("cached_node", cached_node::check),
    ("cluster_cidr", cluster_cidr::check),
    ("duration", duration::check),
    ("effective_configuration", effective_configuration::check),
    ("lease_plan", lease_plan::check),
    ("node_json", node_json::check),
    ("protobuf_node", protobuf_node::check),
    ("protobuf_object", protobuf_object::check),
    ("watch_frames", watch_frames::check),
];
