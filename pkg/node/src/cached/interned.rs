//! Strings many Nodes repeat word for word — annotation and label keys, the field managers that own
//! annotations, address types, condition types, statuses and reasons, taint keys and effects — stored
//! once per process instead of once in every Node's buffer: a [`Span`] whose `start` has
//! [`INTERNED`] set names an entry of this table. At most [`CAPACITY`] strings are ever interned (leaked
//! once, a few KiB); past that, or for a string longer than any annotation key, a Node keeps its own
//! copy, so no input grows the table without bound.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use super::Span;

/// The bit of [`Span::start`] that says "an index into this table", not an offset into the buffer.
pub(super) const INTERNED: u32 = 1 << 31;
/// How many distinct strings are ever interned.
const CAPACITY: usize = 256;
/// The longest string interned: an annotation key's longest (a 253-byte prefix, "/", a 63-byte name).
const MAX_LEN: usize = 317;

/// The strings, by index; written once each, read without a lock.
static TABLE: [OnceLock<&'static str>; CAPACITY] = [const { OnceLock::new() }; CAPACITY];
/// Each interned string's index; taken only while a Node is built.
static INDEX: OnceLock<Mutex<HashMap<&'static str, u32>>> = OnceLock::new();

/// The span naming `s` in the table, interning it if there is room; `None` when the Node must keep it.
pub(super) fn intern(s: &str) -> Option<Span> {
    if s.len() > MAX_LEN {
        return None;
    }
    let len = u32::try_from(s.len()).ok()?;
    let mut index = INDEX
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(&i) = index.get(s) {
        return Some(Span {
            start: INTERNED | i,
            len,
        });
    }
    let i = index.len();
    let slot = TABLE.get(i)?;
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    let leaked = *slot.get_or_init(|| leaked);
    let i = u32::try_from(i).ok()?;
    index.insert(leaked, i);
    Some(Span {
        start: INTERNED | i,
        len,
    })
}

/// The interned string `span` names, if it names one.
pub(super) fn get(span: Span) -> Option<&'static str> {
    if span.start & INTERNED == 0 {
        return None;
    }
    let i = usize::try_from(span.start & !INTERNED).ok()?;
    TABLE.get(i)?.get().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_is_interned_once_and_read_back_from_its_span() {
        let a = intern("interned-test.example.com/key").expect("room");
        let b = intern("interned-test.example.com/key").expect("room");
        assert_eq!(a, b);
        assert_eq!(get(a), Some("interned-test.example.com/key"));
        assert_eq!(
            get(Span { start: 3, len: 2 }),
            None,
            "a buffer span is not interned"
        );
    }

    #[test]
    fn a_string_longer_than_any_annotation_key_is_not_interned() {
        assert!(intern(&"k".repeat(MAX_LEN + 1)).is_none());
    }
}
