//! The socketpair between the launcher and its filtered child, before the child execs.
//!
//! Child to parent: `L` (with the listener, SCM_RIGHTS), `E` text (setup failed),
//! `X` errno NUL command (exec failed), `R` text NUL (a probe's outcome, empty for success).
//! Parent to child: frames of kind u8, length u32 (native endian), payload: `A` (exec this
//! argv, NUL-separated), `P` (probe this share). Closing the parent's end ends the child.

pub const LISTENER: u8 = b'L';
pub const ERROR: u8 = b'E';
pub const EXEC_FAILED: u8 = b'X';
pub const PROBED: u8 = b'R';
pub const GO_WITH: u8 = b'A';
pub const PROBE: u8 = b'P';
pub const FRAME_HEADER: usize = 5;
/// No frame the launcher sends comes near this (argv is limited by the kernel's ARG_MAX).
pub const MAX_FRAME: usize = 4 << 20;

/// A parent-to-child frame.
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_ne_bytes());
    out.extend_from_slice(payload);
    out
}

/// The `A` frame for argv.
pub fn go_with(argv: &[Vec<u8>]) -> Vec<u8> {
    frame(GO_WITH, &argv.join(&b'\0'))
}

/// One parent-to-child frame: its kind, its payload, and how many bytes it took.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub kind: u8,
    pub payload: &'a [u8],
    pub used: usize,
}

/// A frame announcing more than MAX_FRAME bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct TooLong;

/// One whole frame at the start of `data`; None while incomplete.
pub fn parse_frame(data: &[u8]) -> Result<Option<Frame<'_>>, TooLong> {
    let Some(head) = data.get(..FRAME_HEADER) else {
        return Ok(None);
    };
    let length = u32::from_ne_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if length > MAX_FRAME {
        return Err(TooLong);
    }
    Ok(data
        .get(FRAME_HEADER..FRAME_HEADER + length)
        .map(|payload| Frame {
            kind: head[0],
            payload,
            used: FRAME_HEADER + length,
        }))
}

/// The argv of an `A` frame's payload (never empty: an empty payload is one empty arg).
pub fn split_argv(payload: &[u8]) -> Vec<Vec<u8>> {
    payload.split(|&b| b == 0).map(<[u8]>::to_vec).collect()
}

/// The probe's answer once complete: Some("") when both calls succeeded, else why not;
/// None while it is incomplete.
pub fn probe_outcome(data: &[u8]) -> Option<String> {
    let body = data.strip_suffix(b"\0")?;
    match body.split_first() {
        Some((&PROBED, text)) => Some(String::from_utf8_lossy(text).into_owned()),
        _ => Some("the child did not answer the probe".into()),
    }
}

/// What the child's end said after `A`: None if the command runs (the channel closed on
/// exec), else (errno, the command) for a failed exec.
pub fn exec_outcome(data: &[u8]) -> Option<(i32, String)> {
    let body = data.strip_prefix(&[EXEC_FAILED])?;
    let (code, command) = match body.iter().position(|&b| b == 0) {
        Some(at) => (&body[..at], &body[at + 1..]),
        None => (body, &b""[..]),
    };
    let code = std::str::from_utf8(code)
        .ok()
        .filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|c| c.parse().ok())
        .unwrap_or(libc::ENOEXEC);
    Some((code, String::from_utf8_lossy(command).into_owned()))
}

/// The child's failed exec, for exec_outcome.
pub fn exec_failed(code: i32, command: &[u8]) -> Vec<u8> {
    let mut out = vec![EXEC_FAILED];
    out.extend_from_slice(code.to_string().as_bytes());
    out.push(0);
    out.extend_from_slice(command);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let argv = vec![b"virtiofsd".to_vec(), b"".to_vec(), b"with space".to_vec()];
        let bytes = go_with(&argv);
        let Frame {
            kind,
            payload,
            used,
        } = parse_frame(&bytes).unwrap().unwrap();
        assert_eq!((kind, used), (GO_WITH, bytes.len()));
        assert_eq!(split_argv(payload), argv);
        assert_eq!(parse_frame(&bytes[..bytes.len() - 1]), Ok(None));
        assert_eq!(exec_outcome(&exec_failed(2, b"/x")), Some((2, "/x".into())));
        assert_eq!(probe_outcome(b"R\0"), Some(String::new()));
        assert_eq!(probe_outcome(b"R"), None);
    }
}
