//! The envelope every protobuf answer comes in (`k8s\0`, then a `runtime.Unknown` naming the kind),
//! and the objects in it the informer asks for: a NodeList, a Node, a Status, and watch events.

use crate::json::Object;
use crate::node::read_node;
use crate::wire::{self, Value};
use crate::ProtobufError;

const MAGIC: &[u8] = b"k8s\0";

/// The kind and the bytes of the object in an envelope.
fn open_envelope(body: &[u8]) -> Result<(&str, &[u8]), ProtobufError> {
    let unknown = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let (mut kind, mut raw) = ("", &[][..]);
    for field in wire::fields(unknown) {
        match field? {
            (1, v) => {
                for f in wire::fields(v.bytes("Unknown", 1)?) {
                    if let (2, k) = f? {
                        kind = k.str("TypeMeta", 2)?;
                    }
                }
            }
            (2, v) => raw = v.bytes("Unknown", 2)?,
            (3, v) => {
                let encoding = v.str("Unknown", 3)?;
                if !encoding.is_empty() {
                    return Err(ProtobufError::ContentEncoding(encoding.to_string()));
                }
            }
            _ => {}
        }
    }
    Ok((kind, raw))
}

/// Turns a whole protobuf answer — a NodeList (a list page), a Node or a Status (an error) — into the
/// JSON the informer decodes.
pub fn transcode_object(body: &[u8]) -> Result<Vec<u8>, ProtobufError> {
    let (kind, raw) = open_envelope(body)?;
    let mut out = Vec::with_capacity(256);
    match kind {
        "NodeList" => write_node_list(raw, &mut out)?,
        "Node" => read_node(raw)?.write_json(&mut out)?,
        "Status" => write_status(raw, &mut out)?,
        other => return Err(ProtobufError::UnexpectedKind(other.to_string())),
    }
    Ok(out)
}

/// Appends one protobuf watch event (a frame's payload: a `metav1.WatchEvent`) as a JSON line.
pub fn transcode_watch_event(frame: &[u8], out: &mut Vec<u8>) -> Result<(), ProtobufError> {
    let (mut type_, mut object) = ("", &[][..]);
    for field in wire::fields(frame) {
        match field? {
            (1, v) => type_ = v.str("WatchEvent", 1)?,
            (2, v) => {
                for f in wire::fields(v.bytes("WatchEvent", 2)?) {
                    if let (1, raw) = f? {
                        object = raw.bytes("RawExtension", 1)?;
                    }
                }
            }
            _ => {}
        }
    }
    let (kind, raw) = open_envelope(object)?;
    // Written to a scratch buffer first, so a bad event leaves `out` as it was.
    let mut line = Vec::with_capacity(256);
    let mut event = Object::open(&mut line);
    event.str("type", type_);
    match kind {
        "Node" => read_node(raw)?.write_json(event.key("object"))?,
        "Status" => write_status(raw, event.key("object"))?,
        other => return Err(ProtobufError::UnexpectedKind(other.to_string())),
    }
    event.close();
    line.push(b'\n');
    out.extend_from_slice(&line);
    Ok(())
}

/// A `ListMeta`: resourceVersion = 2, continue = 3, remainingItemCount = 4.
fn write_list_meta(raw: &[u8], out: &mut Vec<u8>) -> Result<(), ProtobufError> {
    let (mut rv, mut cont, mut remaining) = ("", "", None);
    for field in wire::fields(raw) {
        match field? {
            (2, v) => rv = v.str("ListMeta", 2)?,
            (3, v) => cont = v.str("ListMeta", 3)?,
            (4, v) => remaining = Some(v.varint("ListMeta", 4)? as i64),
            _ => {}
        }
    }
    let mut meta = Object::open(out);
    meta.str_nonempty("resourceVersion", rv);
    meta.str_nonempty("continue", cont);
    if let Some(n) = remaining {
        meta.int("remainingItemCount", n);
    }
    meta.close();
    Ok(())
}

/// A `NodeList`: metadata = 1, items = 2.
fn write_node_list(raw: &[u8], out: &mut Vec<u8>) -> Result<(), ProtobufError> {
    let mut meta: &[u8] = &[];
    let mut items: Vec<&[u8]> = Vec::new();
    for field in wire::fields(raw) {
        match field? {
            (1, v) => meta = v.bytes("NodeList", 1)?,
            (2, v) => items.push(v.bytes("NodeList", 2)?),
            _ => {}
        }
    }
    let mut list = Object::open(out);
    list.str("apiVersion", "v1");
    list.str("kind", "NodeList");
    write_list_meta(meta, list.key("metadata"))?;
    let out = list.key("items");
    out.push(b'[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        read_node(item)?.write_json(out)?;
    }
    out.push(b']');
    list.close();
    Ok(())
}

/// A `metav1.Status`: status = 2, message = 3, reason = 4, code = 6 (details are not read).
fn write_status(raw: &[u8], out: &mut Vec<u8>) -> Result<(), ProtobufError> {
    let (mut status, mut message, mut reason, mut code) = ("", "", "", 0i64);
    for field in wire::fields(raw) {
        match field? {
            (2, v) => status = v.str("Status", 2)?,
            (3, v) => message = v.str("Status", 3)?,
            (4, v) => reason = v.str("Status", 4)?,
            (6, Value::Varint(c)) => code = i64::from(c as i32),
            _ => {}
        }
    }
    let mut o = Object::open(out);
    o.str("apiVersion", "v1");
    o.str("kind", "Status");
    Object::open(o.key("metadata")).close();
    // All four are `omitempty` in the API server's JSON (kube's Status cannot read `"status":""`).
    o.str_nonempty("status", status);
    o.str_nonempty("message", message);
    o.str_nonempty("reason", reason);
    if code != 0 {
        o.int("code", code);
    }
    o.close();
    Ok(())
}

#[cfg(test)]
mod tests;
