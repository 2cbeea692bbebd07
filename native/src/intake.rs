//! fhmon's native intake protocol, the launcher's side of it: frames to bytes and back.
//!
//! protocol/intake_wire.py is the definition; this module follows it byte for byte (a test,
//! tests/unit/test_intake_codec.py, encodes every message with both and compares, and decodes
//! each one's output with the other). Every frame:
//!
//! ```text
//! magic "FHMN" | version u16 | kind u16 | length u32 | payload[length]     (big endian)
//! ```
//!
//! Safe code only; bad bytes are errors as values, never a panic.

pub const MAGIC: &[u8; 4] = b"FHMN";
pub const PROTOCOL_VERSION: u16 = 1;
pub const MAX_PAYLOAD: usize = 16 * 1024;
pub const HEADER_SIZE: usize = 12;

pub const HELLO_EXPECT_SHARE: u32 = 0x1;
pub const HELLO_TARGET_PIDFD: u32 = 0x2;

pub const KIND_HELLO: u16 = 1;
pub const KIND_ACCEPT: u16 = 2;
pub const KIND_REFUSE: u16 = 3;
pub const KIND_PING: u16 = 4;
pub const KIND_PONG: u16 = 5;
pub const KIND_STATUS: u16 = 6;
pub const KIND_STATUS_REPLY: u16 = 7;

/// One intake message, as protocol/intake_wire.py's dataclasses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hello {
        target_pid: u32,
        share: String,
        client: String,
        /// as sent: HELLO_EXPECT_SHARE is set by `encode` exactly when share_id is given
        flags: u32,
        version: u16,
        share_id: Option<[u8; 32]>,
    },
    Accept {
        target_id: u64,
        share_id: [u8; 32],
        message: String,
    },
    Refuse {
        errno: u32,
        reason: String,
    },
    Ping,
    Pong {
        json: String,
    },
    StatusRequest {
        after: u64,
    },
    StatusReply {
        json: String,
    },
}

impl Message {
    /// The Python class name (for "fhmon answered X, not ACCEPT").
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Accept { .. } => "Accept",
            Message::Refuse { .. } => "Refuse",
            Message::Ping => "Ping",
            Message::Pong { .. } => "Pong",
            Message::StatusRequest { .. } => "StatusRequest",
            Message::StatusReply { .. } => "StatusReply",
        }
    }
}

/// Why bytes are not a valid frame, or a message cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(text: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(text.into()))
}

fn put_text16(out: &mut Vec<u8>, text: &str) -> Result<(), ProtocolError> {
    let len = u16::try_from(text.len())
        .or_else(|_| err(format!("a string of {} bytes exceeds 65535", text.len())))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

fn put_text32(out: &mut Vec<u8>, text: &str) -> Result<(), ProtocolError> {
    let len = u32::try_from(text.len())
        .or_else(|_| err(format!("a string of {} bytes is too long", text.len())))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

/// The longest prefix of `text` of at most `chars` characters (Python's `text[:chars]`).
fn first_chars(text: &str, chars: usize) -> &str {
    match text.char_indices().nth(chars) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// One whole frame for `message`, as protocol/intake_wire.py's `encode`.
pub fn encode(message: &Message) -> Result<Vec<u8>, ProtocolError> {
    let mut payload = Vec::new();
    let (kind, version) = match message {
        Message::Hello {
            target_pid,
            share,
            client,
            flags,
            version,
            share_id,
        } => {
            let mut flags = *flags;
            if share_id.is_some() {
                flags |= HELLO_EXPECT_SHARE;
            } else if flags & HELLO_EXPECT_SHARE != 0 {
                return err("HELLO_EXPECT_SHARE needs a share_id");
            }
            payload.extend_from_slice(&target_pid.to_be_bytes());
            payload.extend_from_slice(&flags.to_be_bytes());
            put_text16(&mut payload, share)?;
            put_text16(&mut payload, client)?;
            if let Some(id) = share_id {
                payload.extend_from_slice(id);
            }
            (KIND_HELLO, *version)
        }
        Message::Accept {
            target_id,
            share_id,
            message,
        } => {
            payload.extend_from_slice(&target_id.to_be_bytes());
            payload.extend_from_slice(share_id);
            put_text16(&mut payload, message)?;
            (KIND_ACCEPT, PROTOCOL_VERSION)
        }
        Message::Refuse { errno, reason } => {
            payload.extend_from_slice(&errno.to_be_bytes());
            put_text16(&mut payload, first_chars(reason, 4000))?;
            (KIND_REFUSE, PROTOCOL_VERSION)
        }
        Message::Ping => (KIND_PING, PROTOCOL_VERSION),
        Message::Pong { json } => {
            put_text32(&mut payload, json)?;
            (KIND_PONG, PROTOCOL_VERSION)
        }
        Message::StatusRequest { after } => {
            if *after != 0 {
                payload.extend_from_slice(&after.to_be_bytes());
            }
            (KIND_STATUS, PROTOCOL_VERSION)
        }
        Message::StatusReply { json } => {
            put_text32(&mut payload, json)?;
            (KIND_STATUS_REPLY, PROTOCOL_VERSION)
        }
    };
    if payload.len() > MAX_PAYLOAD {
        return err(format!(
            "payload of {} bytes exceeds {MAX_PAYLOAD}",
            payload.len()
        ));
    }
    let mut frame = Vec::with_capacity(HEADER_SIZE + payload.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&kind.to_be_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// A cursor over one payload: every read either succeeds or says the payload is short.
struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.data.len() < n {
            return None;
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    fn u32(&mut self) -> Option<u32> {
        self.array::<4>().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.array::<8>().map(u64::from_be_bytes)
    }
    fn text(&mut self, wide: bool) -> Result<String, &'static str> {
        let len = if wide {
            self.u32().ok_or("short")? as usize
        } else {
            u16::from_be_bytes(self.array::<2>().ok_or("short")?) as usize
        };
        let bytes = self.take(len).ok_or("short")?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "not UTF-8")
    }
}

fn kind_name(kind: u16) -> String {
    match kind {
        KIND_HELLO => "HELLO".into(),
        KIND_ACCEPT => "ACCEPT".into(),
        KIND_REFUSE => "REFUSE".into(),
        KIND_PING => "PING".into(),
        KIND_PONG => "PONG".into(),
        KIND_STATUS => "STATUS".into(),
        KIND_STATUS_REPLY => "STATUS_REPLY".into(),
        other => format!("kind {other}"),
    }
}

/// The message one frame's payload holds (the header already checked).
pub fn decode_payload(version: u16, kind: u16, payload: &[u8]) -> Result<Message, ProtocolError> {
    let mut r = Reader { data: payload };
    let malformed =
        |why: &str| ProtocolError(format!("malformed {} payload: {why}", kind_name(kind)));
    let short = || malformed("too short");
    let message = match kind {
        KIND_HELLO => {
            let target_pid = r.u32().ok_or_else(short)?;
            let flags = r.u32().ok_or_else(short)?;
            let share = r.text(false).map_err(malformed)?;
            let client = r.text(false).map_err(malformed)?;
            let share_id = if flags & HELLO_EXPECT_SHARE != 0 {
                Some(r.array::<32>().ok_or_else(short)?)
            } else {
                None
            };
            Message::Hello {
                target_pid,
                share,
                client,
                flags,
                version,
                share_id,
            }
        }
        KIND_ACCEPT => {
            let target_id = r.u64().ok_or_else(short)?;
            let share_id = r.array::<32>().ok_or_else(short)?;
            let message = r.text(false).map_err(malformed)?;
            Message::Accept {
                target_id,
                share_id,
                message,
            }
        }
        KIND_REFUSE => {
            let errno = r.u32().ok_or_else(short)?;
            let reason = r.text(false).map_err(malformed)?;
            Message::Refuse { errno, reason }
        }
        KIND_STATUS if payload.len() == 8 => Message::StatusRequest {
            after: r.u64().ok_or_else(short)?,
        },
        KIND_PING | KIND_STATUS => {
            if !payload.is_empty() {
                return err(if kind == KIND_PING {
                    "this message has no payload"
                } else {
                    "STATUS carries no payload or a u64 target id"
                });
            }
            if kind == KIND_PING {
                Message::Ping
            } else {
                Message::StatusRequest { after: 0 }
            }
        }
        KIND_PONG | KIND_STATUS_REPLY => {
            let json = r.text(true).map_err(malformed)?;
            if kind == KIND_PONG {
                Message::Pong { json }
            } else {
                Message::StatusReply { json }
            }
        }
        other => return err(format!("unknown message kind {other}")),
    };
    if !r.data.is_empty() {
        return err("trailing bytes after the payload");
    }
    Ok(message)
}

/// Accumulates bytes and returns whole messages, refusing bad frames as early as possible
/// (protocol/intake_wire.py's FrameDecoder).
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    pub fn feed(&mut self, data: &[u8]) -> Result<(), ProtocolError> {
        self.buffer.extend_from_slice(data);
        self.check_header()
    }

    fn header(&self) -> Option<(u16, u16, usize)> {
        let h = self.buffer.get(..HEADER_SIZE)?;
        Some((
            u16::from_be_bytes([h[4], h[5]]),
            u16::from_be_bytes([h[6], h[7]]),
            u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize,
        ))
    }

    fn check_header(&self) -> Result<(), ProtocolError> {
        let n = self.buffer.len().min(MAGIC.len());
        if self.buffer[..n] != MAGIC[..n] {
            return err("not an fhmon frame (bad magic)");
        }
        if let Some((version, _, length)) = self.header() {
            if version != PROTOCOL_VERSION {
                return err(format!(
                    "unsupported protocol version {version}; this fhmon speaks [{PROTOCOL_VERSION}]"
                ));
            }
            if length > MAX_PAYLOAD {
                return err(format!(
                    "message of {length} bytes exceeds the limit of {MAX_PAYLOAD}"
                ));
            }
        }
        Ok(())
    }

    /// One complete message, or None if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtocolError> {
        let Some((version, kind, length)) = self.header() else {
            return Ok(None);
        };
        let end = HEADER_SIZE + length;
        if self.buffer.len() < end {
            return Ok(None);
        }
        let payload: Vec<u8> = self.buffer.drain(..end).skip(HEADER_SIZE).collect();
        let message = decode_payload(version, kind, &payload)?;
        if !self.buffer.is_empty() {
            self.check_header()?;
        }
        Ok(Some(message))
    }
}

/// Exactly one whole frame (protocol/intake_wire.py's decode_one).
pub fn decode_one(data: &[u8]) -> Result<Message, ProtocolError> {
    let mut decoder = FrameDecoder::new();
    decoder.feed(data)?;
    match decoder.next_message()? {
        None => err("truncated frame"),
        Some(_) if decoder.buffered() > 0 => err("bytes after the frame"),
        Some(message) => Ok(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_with_and_without_a_share_id() {
        for share_id in [None, Some([9u8; 32])] {
            let hello = Message::Hello {
                target_pid: 42,
                share: "/srv/share".into(),
                client: "fhmon-launch/7".into(),
                flags: HELLO_TARGET_PIDFD,
                version: 1,
                share_id,
            };
            let bytes = encode(&hello).unwrap();
            let back = decode_one(&bytes).unwrap();
            let Message::Hello { flags, .. } = back else {
                panic!("not a hello")
            };
            assert_eq!(flags & HELLO_EXPECT_SHARE != 0, share_id.is_some());
        }
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(decode_one(b"XHMN").is_err());
        assert!(decode_one(b"FHMN\0\x02\0\x04\0\0\0\0").is_err());
        assert!(decode_one(b"FHMN\0\x01\0\x04\0\0\0\x01x").is_err());
        assert_eq!(
            decode_one(b"FHMN\0\x01\0\x04\0\0\0\0").unwrap(),
            Message::Ping
        );
    }
}
