//! A protobuf watch stream cut into events: each frame is a 4-byte big-endian length, then that many
//! bytes of a `metav1.WatchEvent` (client-go's `LengthDelimitedFramer`). Chunks of the HTTP body split
//! frames anywhere, so the partial frame is kept until the rest arrives.

use crate::envelope::transcode_watch_event;
use crate::ProtobufError;

/// The largest frame accepted: far above any Node (etcd refuses objects over 1.5 MiB by default), low
/// enough that a corrupt length cannot make the process allocate gigabytes.
pub const MAX_FRAME: usize = 16 << 20;

/// Turns the chunks of a protobuf watch into JSON lines, one per event.
#[derive(Debug, Default)]
pub struct WatchFrames {
    pending: Vec<u8>,
}

impl WatchFrames {
    /// A stream with nothing read yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `chunk` and returns the JSON lines of every event it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, ProtobufError> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(header) = self.pending.get(start..start + 4) {
            let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
            if len > MAX_FRAME {
                return Err(ProtobufError::FrameTooLong(len));
            }
            let Some(frame) = self.pending.get(start + 4..start + 4 + len) else {
                break;
            };
            transcode_watch_event(frame, &mut out)?;
            start += 4 + len;
        }
        self.pending.drain(..start);
        Ok(out)
    }

    /// Whether the stream ended between frames; a stream that ends inside one was cut short.
    pub fn finish(&self) -> Result<(), ProtobufError> {
        if self.pending.is_empty() {
            Ok(())
        } else {
            Err(ProtobufError::Truncated)
        }
    }
}
