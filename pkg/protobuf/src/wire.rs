//! Protobuf's wire format, read without a schema: each field is a number, a wire type and a value,
//! and a length-delimited value (string, bytes, message) is a slice of the input, never copied.

use crate::ProtobufError;

/// One field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0: ints, bools, enums.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: strings, bytes, messages, packed repeats.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

impl<'a> Value<'a> {
    fn wire_name(&self) -> &'static str {
        match self {
            Value::Varint(_) => "varint",
            Value::Fixed64(_) => "fixed64",
            Value::Bytes(_) => "length-delimited",
            Value::Fixed32(_) => "fixed32",
        }
    }

    /// The bytes of a string, bytes or message field.
    pub fn bytes(self, message: &'static str, field: u32) -> Result<&'a [u8], ProtobufError> {
        match self {
            Value::Bytes(b) => Ok(b),
            other => Err(other.mismatch(message, field, "length-delimited")),
        }
    }

    /// A string field.
    pub fn str(self, message: &'static str, field: u32) -> Result<&'a str, ProtobufError> {
        std::str::from_utf8(self.bytes(message, field)?)
            .map_err(|_| ProtobufError::NotUtf8(message))
    }

    /// A varint field (int32, int64, bool, enum).
    pub fn varint(self, message: &'static str, field: u32) -> Result<u64, ProtobufError> {
        match self {
            Value::Varint(v) => Ok(v),
            other => Err(other.mismatch(message, field, "varint")),
        }
    }

    fn mismatch(&self, message: &'static str, field: u32, expected: &'static str) -> ProtobufError {
        ProtobufError::FieldType {
            message,
            field,
            expected,
            found: self.wire_name(),
        }
    }
}

/// The fields of one message, in the order written.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

/// Reads the fields of `message`.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut value = 0u64;
        for (i, byte) in self.rest.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Ok(value);
            }
        }
        if self.rest.len() < 10 {
            Err(ProtobufError::Truncated)
        } else {
            Err(ProtobufError::VarintTooLong)
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtobufError> {
        if self.rest.len() < n {
            return Err(ProtobufError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn field(&mut self) -> Result<(u32, Value<'a>), ProtobufError> {
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| ProtobufError::VarintTooLong)?;
        let value = match (key & 7) as u8 {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                Value::Fixed64(u64::from_le_bytes(
                    b.try_into().map_err(|_| ProtobufError::Truncated)?,
                ))
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| ProtobufError::Truncated)?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes(
                    b.try_into().map_err(|_| ProtobufError::Truncated)?,
                ))
            }
            other => return Err(ProtobufError::WireType(other)),
        };
        Ok((number, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), ProtobufError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let item = self.field();
        if item.is_err() {
            // Nothing after a malformed field can be trusted.
            self.rest = &[];
        }
        Some(item)
    }
}

/// Writes protobuf, for tests here and in other crates that need an API server's bytes without one.
pub mod encode {
    /// Appends a varint.
    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Appends a length-delimited field (string, bytes or message).
    pub fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
        varint(out, u64::from(field) << 3 | 2);
        varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }

    /// Appends a varint field.
    pub fn uint(out: &mut Vec<u8>, field: u32, value: u64) {
        varint(out, u64::from(field) << 3);
        varint(out, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_back_as_written_and_unknown_wire_types_are_read_past() {
        let mut m = Vec::new();
        encode::bytes(&mut m, 1, b"name");
        encode::uint(&mut m, 7, 300);
        m.extend_from_slice(&[(3 << 3) | 1, 1, 2, 3, 4, 5, 6, 7, 8]);
        m.extend_from_slice(&[(4 << 3) | 5, 9, 9, 9, 9]);
        encode::bytes(&mut m, 200, b"");
        let got: Vec<_> = fields(&m).collect::<Result<_, _>>().expect("well formed");
        assert_eq!(
            got,
            vec![
                (1, Value::Bytes(b"name")),
                (7, Value::Varint(300)),
                (3, Value::Fixed64(0x0807_0605_0403_0201)),
                (4, Value::Fixed32(0x0909_0909)),
                (200, Value::Bytes(b"")),
            ]
        );
    }

    #[test]
    fn a_message_cut_short_is_an_error_and_nothing_after_it_is_read() {
        let mut m = Vec::new();
        encode::bytes(&mut m, 1, b"a long value");
        let cut = &m[..m.len() - 1];
        let mut it = fields(cut);
        assert_eq!(it.next(), Some(Err(ProtobufError::Truncated)));
        assert_eq!(it.next(), None);
        assert_eq!(fields(&[0x80]).next(), Some(Err(ProtobufError::Truncated)));
        assert_eq!(
            fields(&[0xff; 11]).next(),
            Some(Err(ProtobufError::VarintTooLong))
        );
        assert_eq!(
            fields(&[(1 << 3) | 3]).next(),
            Some(Err(ProtobufError::WireType(3)))
        );
    }

    #[test]
    fn a_string_must_be_utf8_and_length_delimited() {
        assert_eq!(
            Value::Bytes(&[0xff]).str("Node", 1),
            Err(ProtobufError::NotUtf8("Node"))
        );
        assert!(matches!(
            Value::Varint(1).str("Node", 1),
            Err(ProtobufError::FieldType {
                found: "varint",
                ..
            })
        ));
        assert_eq!(Value::Bytes(b"ok").str("Node", 1), Ok("ok"));
    }
}
