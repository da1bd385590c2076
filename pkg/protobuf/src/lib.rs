//! The API server's protobuf, read for netcm's informer.
//!
//! kube-apiserver encodes a Node in protobuf for about a third of the CPU JSON costs it, and the encoding
//! is smaller (see `WATCH_JSON=1` and `--kube-api-content-type` in `hack/bench.sh allocation`). kube-rs
//! reads only JSON, so netcm's informer asks for protobuf and
//! this crate turns each answer into the JSON of just the fields the informer's wire type decodes
//! (`WireNode` in netcm-manager): name, uid, resourceVersion, deletion, labels, annotations, pod CIDRs,
//! taints, unschedulable, providerID, addresses and conditions, and of `managedFields` which manager
//! owns which annotation (a field set that names no annotations is not parsed). Everything else —
//! images, nodeInfo, capacity — is skipped by its length without being read. The JSON follows the API
//! server's own rules for it (`omitempty` fields left out when empty), so a Node decodes the same
//! either way.
//!
//! Start at [`transcode_object`] (a list or a single answer) and [`WatchFrames`] (a watch stream).
//! [`wire`] reads protobuf's wire format; [`node`] knows the field numbers of `k8s.io/api/core/v1`;
//! [`entries`] defines the address, condition and taint every other crate's Node form shares.

pub mod entries;
mod envelope;
mod frames;
mod json;
pub mod node;
pub mod wire;

pub use entries::{Address, Condition, Taint};
pub use envelope::{transcode_object, transcode_watch_event};
pub use frames::WatchFrames;

/// The content type the API server answers protobuf in (a watch adds `;stream=watch`).
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Why an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    /// The bytes end inside a field.
    #[error("protobuf ends inside a field")]
    Truncated,
    /// A varint longer than ten bytes.
    #[error("protobuf varint longer than 10 bytes")]
    VarintTooLong,
    /// A wire type protobuf 3 does not use (groups) or that does not exist.
    #[error("protobuf wire type {0} is not supported")]
    WireType(u8),
    /// A field that must be a string or a message has another wire type.
    #[error("protobuf field {field} of {message} has wire type {found}, not {expected}")]
    FieldType {
        /// The message being read.
        message: &'static str,
        /// Its field number.
        field: u32,
        /// The wire type expected.
        expected: &'static str,
        /// The wire type found.
        found: &'static str,
    },
    /// A string that is not UTF-8.
    #[error("protobuf string in {0} is not UTF-8")]
    NotUtf8(&'static str),
    /// The answer lacks the `k8s\0` prefix of a Kubernetes protobuf object.
    #[error("answer lacks the Kubernetes protobuf prefix k8s\\0")]
    NoMagic,
    /// The envelope names a content encoding (none is used by the API server today).
    #[error("protobuf envelope has content encoding {0:?}")]
    ContentEncoding(String),
    /// An object of a kind this crate does not read.
    #[error("unexpected kind {0:?} in a protobuf answer")]
    UnexpectedKind(String),
    /// A watch frame longer than the limit.
    #[error("watch frame of {0} bytes exceeds the limit")]
    FrameTooLong(usize),
    /// A managed-fields entry whose field set is not JSON.
    #[error("managedFields entry's fieldsV1 is not a JSON field set: {0}")]
    FieldSet(String),
    /// A timestamp out of range.
    #[error("timestamp {0} s is out of range")]
    Timestamp(i64),
}
