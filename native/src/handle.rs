//! `struct file_handle` and fhmon's signed trailer, parsed from target bytes in safe code.
//! Layouts as protocol/kernel.py and protocol/signed_handle.py define them.

pub use crate::abi::{FILE_HANDLE_HEADER_SIZE as HEADER_SIZE, FILEID_INVALID, MAX_HANDLE_SZ};
use crate::abi::{FILEID_USER_FLAGS_MASK, FILEID_VALID_USER_FLAGS};

pub const KEY_ID_SIZE: usize = 4;
pub const MAC_SIZE: usize = 16;
pub const TRAILER_SIZE: usize = KEY_ID_SIZE + MAC_SIZE;
pub const MAX_KERNEL_HANDLE_SIZE: usize = MAX_HANDLE_SZ - TRAILER_SIZE;
pub const SHARE_ID_SIZE: usize = 32;

/// u32 handle_bytes; i32 handle_type (little endian, as the target's memory holds them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub handle_bytes: u32,
    pub handle_type: i32,
}

impl Header {
    /// None when fewer than 8 bytes were readable (the kernel's EFAULT).
    pub fn parse(raw: &[u8]) -> Option<Header> {
        let head: &[u8; HEADER_SIZE] = raw.get(..HEADER_SIZE)?.try_into().ok()?;
        let (bytes, kind) = head.split_at(4);
        Some(Header {
            handle_bytes: u32::from_le_bytes(bytes.try_into().ok()?),
            handle_type: i32::from_le_bytes(kind.try_into().ok()?),
        })
    }

    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[..4].copy_from_slice(&self.handle_bytes.to_le_bytes());
        out[4..].copy_from_slice(&self.handle_type.to_le_bytes());
        out
    }
}

/// The type check open_by_handle_at makes before it looks at the filesystem.
pub fn handle_type_is_valid(handle_type: i32) -> bool {
    if handle_type < 0 {
        return false;
    }
    let user_flags = (handle_type as u32) & FILEID_USER_FLAGS_MASK;
    user_flags & !FILEID_VALID_USER_FLAGS == 0
}

/// Why a presented handle is refused before the filesystem is asked (the kernel's errnos).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleError {
    /// the header or the handle bytes were not all readable
    Fault,
    /// handle_bytes 0 or above MAX_HANDLE_SZ, or a bad handle_type
    Invalid,
}

impl HandleError {
    pub fn errno(self) -> i32 {
        match self {
            HandleError::Fault => libc::EFAULT,
            HandleError::Invalid => libc::EINVAL,
        }
    }
}

/// open_by_handle_at's checks of a handle in the kernel's order, over the readable prefix
/// `raw` of the target's 8 + MAX_HANDLE_SZ bytes: header EFAULT, handle_bytes EINVAL,
/// handle_type EINVAL, handle bytes EFAULT. Returns the header and f_handle.
pub fn parse_presented(raw: &[u8]) -> Result<(Header, &[u8]), HandleError> {
    let header = Header::parse(raw).ok_or(HandleError::Fault)?;
    let n = header.handle_bytes as usize;
    if n == 0 || n > MAX_HANDLE_SZ {
        return Err(HandleError::Invalid);
    }
    if !handle_type_is_valid(header.handle_type) {
        return Err(HandleError::Invalid);
    }
    let f_handle = raw
        .get(HEADER_SIZE..HEADER_SIZE + n)
        .ok_or(HandleError::Fault)?;
    Ok((header, f_handle))
}

/// A presented f_handle cut into (kernel bytes, key id bytes, mac); None when it is too short
/// to be one of fhmon's (protocol/signed_handle.split).
pub fn split_trailer(f_handle: &[u8]) -> Option<(&[u8], [u8; KEY_ID_SIZE], &[u8])> {
    if f_handle.len() <= TRAILER_SIZE {
        return None;
    }
    let n = f_handle.len() - TRAILER_SIZE;
    let (kernel_bytes, trailer) = f_handle.split_at(n);
    let (key_id, mac) = trailer.split_at(KEY_ID_SIZE);
    Some((kernel_bytes, key_id.try_into().ok()?, mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_order_of_checks() {
        assert_eq!(parse_presented(&[0; 7]), Err(HandleError::Fault));
        let mut raw = [0u8; 8 + MAX_HANDLE_SZ];
        assert_eq!(parse_presented(&raw), Err(HandleError::Invalid)); // handle_bytes 0
        raw[0] = 129;
        assert_eq!(parse_presented(&raw), Err(HandleError::Invalid));
        raw[0] = 8;
        raw[4..8].copy_from_slice(&(-1i32).to_le_bytes());
        assert_eq!(parse_presented(&raw), Err(HandleError::Invalid));
        raw[4..8].copy_from_slice(&1i32.to_le_bytes());
        assert_eq!(parse_presented(&raw[..15]), Err(HandleError::Fault));
        let (h, f) = parse_presented(&raw[..16]).unwrap();
        assert_eq!((h.handle_bytes, h.handle_type, f.len()), (8, 1, 8));
    }

    #[test]
    fn type_check_matches_the_kernel() {
        assert!(handle_type_is_valid(1));
        assert!(handle_type_is_valid(0x1_0001));
        assert!(handle_type_is_valid(0x3_00ff));
        assert!(!handle_type_is_valid(0x4_0001));
        assert!(!handle_type_is_valid(i32::MIN));
    }

    #[test]
    fn trailer_needs_kernel_bytes() {
        assert!(split_trailer(&[0; TRAILER_SIZE]).is_none());
        let f: Vec<u8> = (0..28).collect();
        let (k, id, mac) = split_trailer(&f).unwrap();
        assert_eq!((k.len(), id, mac.len()), (8, [8, 9, 10, 11], MAC_SIZE));
    }
}
