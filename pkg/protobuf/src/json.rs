//! Just enough of a JSON writer for the transcoder: objects, arrays, escaped strings.

/// Appends `s` as a JSON string.
pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0..=0x1f => None,
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        match escape {
            Some(e) => out.extend_from_slice(e),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// A JSON object being written: members are separated as they come.
pub(crate) struct Object<'o> {
    out: &'o mut Vec<u8>,
    empty: bool,
}

impl<'o> Object<'o> {
    /// Opens an object.
    pub(crate) fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
    }

    /// Writes the key of the next member and returns the buffer for its value.
    pub(crate) fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        string(self.out, key);
        self.out.push(b':');
        self.out
    }

    /// A string member.
    pub(crate) fn str(&mut self, key: &str, value: &str) {
        string(self.key(key), value);
    }

    /// A string member left out when empty (the API server's `omitempty`).
    pub(crate) fn str_nonempty(&mut self, key: &str, value: &str) {
        if !value.is_empty() {
            self.str(key, value);
        }
    }

    /// A number member.
    pub(crate) fn int(&mut self, key: &str, value: i64) {
        let text = value.to_string();
        self.key(key).extend_from_slice(text.as_bytes());
    }

    /// An array member whose elements `each` writes.
    pub(crate) fn array<T>(&mut self, key: &str, items: &[T], each: impl Fn(&mut Vec<u8>, &T)) {
        let out = self.key(key);
        out.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            each(out, item);
        }
        out.push(b']');
    }

    /// A map of strings.
    pub(crate) fn map(&mut self, key: &str, pairs: &[(&str, &str)]) {
        let mut map = Object::open(self.key(key));
        for (k, v) in pairs {
            map.str(k, v);
        }
        map.close();
    }

    /// Closes the object.
    pub(crate) fn close(self) {
        self.out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_string_comes_back_from_serde_json_as_it_went_in() {
        for s in [
            "",
            "plain",
            "a \"quoted\" \\ path",
            "tab\tnl\ncr\r",
            "\u{1}\u{1f}",
            "z\u{e9}\u{1F600}",
        ] {
            let mut out = Vec::new();
            string(&mut out, s);
            let back: String = serde_json::from_slice(&out).expect("valid JSON");
            assert_eq!(back, s);
        }
    }

    #[test]
    fn objects_separate_their_members_and_leave_out_empty_omitempty_strings() {
        let mut out = Vec::new();
        let mut o = Object::open(&mut out);
        o.str("a", "1");
        o.str_nonempty("skipped", "");
        o.int("n", -3);
        o.array("l", &["x", "y"], |out, s| string(out, s));
        o.map("m", &[("k", "")]);
        o.close();
        assert_eq!(
            std::str::from_utf8(&out).expect("utf8"),
            r#"{"a":"1","n":-3,"l":["x","y"],"m":{"k":""}}"#
        );
    }
}
