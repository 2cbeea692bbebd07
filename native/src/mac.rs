//! Signing and verifying handles, byte-compatible with monitor/signing.py:
//!
//!   mac = HMAC-SHA256(key, "fhmon/handle/v1\0" || share_id || be_i32(type) || be_u32(n)
//!                          || kernel_bytes || key_id)[..16]
//!   f_handle = kernel_bytes || key_id (u32 big endian) || mac
//!
//! Keyed states live in locked memory (sys::LockedBox) and are wiped when the ring is
//! dropped (a reload builds a new ring; the old one's keys are retired with it). Neither
//! sign nor verify allocates.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::handle::{KEY_ID_SIZE, MAC_SIZE, MAX_HANDLE_SZ, MAX_KERNEL_HANDLE_SIZE, SHARE_ID_SIZE};
use crate::sys::{Errno, LockedBox};

pub const DOMAIN_TAG: &[u8; 16] = b"fhmon/handle/v1\0";
pub const MIN_KEY_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

pub type ShareId = [u8; SHARE_ID_SIZE];

#[derive(Debug, PartialEq, Eq)]
pub enum KeyError {
    TooShort(u32),
    SignerMissing(u32),
    Duplicate(u32),
    Lock(Errno),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::TooShort(id) => write!(f, "key {id:08x} has fewer than 32 bytes"),
            KeyError::SignerMissing(id) => write!(f, "signing key {id:08x} is not among the keys"),
            KeyError::Duplicate(id) => write!(f, "key {id:08x} given twice"),
            KeyError::Lock(e) => write!(f, "cannot lock key memory (errno {e})"),
        }
    }
}

struct Key {
    id: [u8; KEY_ID_SIZE],
    keyed: LockedBox<HmacSha256>,
}

/// An immutable set of keys, one of which signs.
pub struct KeyRing {
    keys: Vec<Key>,
    signer: usize,
}

impl KeyRing {
    pub fn new<'a>(
        keys: impl IntoIterator<Item = (u32, &'a [u8])>,
        signer: u32,
    ) -> Result<Self, KeyError> {
        let mut ring = Vec::new();
        for (id, bytes) in keys {
            if bytes.len() < MIN_KEY_BYTES {
                return Err(KeyError::TooShort(id));
            }
            let id_bytes = id.to_be_bytes();
            if ring.iter().any(|k: &Key| k.id == id_bytes) {
                return Err(KeyError::Duplicate(id));
            }
            // any key length is valid for HMAC: new_from_slice cannot fail here
            let keyed = HmacSha256::new_from_slice(bytes).map_err(|_| KeyError::TooShort(id))?;
            let keyed = LockedBox::new(keyed).map_err(KeyError::Lock)?;
            ring.push(Key {
                id: id_bytes,
                keyed,
            });
        }
        let signer_bytes = signer.to_be_bytes();
        let signer = ring
            .iter()
            .position(|k| k.id == signer_bytes)
            .ok_or(KeyError::SignerMissing(signer))?;
        Ok(KeyRing { keys: ring, signer })
    }

    pub fn signer_id(&self) -> u32 {
        u32::from_be_bytes(self.keys[self.signer].id)
    }

    pub fn key_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.keys.iter().map(|k| u32::from_be_bytes(k.id))
    }

    fn tag(key: &Key, share_id: &ShareId, handle_type: i32, kernel_bytes: &[u8]) -> HmacSha256 {
        let mut h = (*key.keyed).clone();
        h.update(DOMAIN_TAG);
        h.update(share_id);
        h.update(&handle_type.to_be_bytes());
        h.update(&(kernel_bytes.len() as u32).to_be_bytes());
        h.update(kernel_bytes);
        h.update(&key.id);
        h
    }

    /// Write the signed f_handle for kernel_bytes into out; its length. None when the kernel
    /// handle leaves no room for the trailer (the handler answers EOPNOTSUPP).
    pub fn sign(
        &self,
        share_id: &ShareId,
        handle_type: i32,
        kernel_bytes: &[u8],
        out: &mut [u8; MAX_HANDLE_SZ],
    ) -> Option<usize> {
        let n = kernel_bytes.len();
        if n > MAX_KERNEL_HANDLE_SIZE {
            return None;
        }
        let key = &self.keys[self.signer];
        let full = Self::tag(key, share_id, handle_type, kernel_bytes).finalize();
        out[..n].copy_from_slice(kernel_bytes);
        out[n..n + KEY_ID_SIZE].copy_from_slice(&key.id);
        out[n + KEY_ID_SIZE..n + KEY_ID_SIZE + MAC_SIZE]
            .copy_from_slice(&full.into_bytes()[..MAC_SIZE]);
        Some(n + KEY_ID_SIZE + MAC_SIZE)
    }

    /// The kernel bytes of f_handle if its MAC is right for this share under a known key
    /// (compared in constant time), else None.
    pub fn verify<'a>(
        &self,
        share_id: &ShareId,
        handle_type: i32,
        f_handle: &'a [u8],
    ) -> Option<&'a [u8]> {
        let (kernel_bytes, key_id, mac) = crate::handle::split_trailer(f_handle)?;
        let key = self.keys.iter().find(|k| k.id == key_id)?;
        Self::tag(key, share_id, handle_type, kernel_bytes)
            .verify_truncated_left(mac)
            .ok()?;
        Some(kernel_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> KeyRing {
        let a = [1u8; 32];
        let b = [2u8; 40];
        KeyRing::new([(0x11u32, &a[..]), (0x22, &b[..])], 0x22).unwrap()
    }

    #[test]
    fn sign_then_verify() {
        let r = ring();
        let share = [9u8; 32];
        let mut out = [0u8; MAX_HANDLE_SZ];
        let n = r.sign(&share, 1, &[5; 8], &mut out).unwrap();
        assert_eq!(n, 28);
        assert_eq!(&out[8..12], &0x22u32.to_be_bytes());
        assert_eq!(r.verify(&share, 1, &out[..n]), Some(&[5u8; 8][..]));
        assert_eq!(r.verify(&[8u8; 32], 1, &out[..n]), None); // another share
        assert_eq!(r.verify(&share, 2, &out[..n]), None); // another type
        out[n - 1] ^= 1;
        assert_eq!(r.verify(&share, 1, &out[..n]), None);
    }

    #[test]
    fn rejects_bad_rings() {
        let short = [0u8; 31];
        assert_eq!(
            KeyRing::new([(1u32, &short[..])], 1).err(),
            Some(KeyError::TooShort(1))
        );
        let k = [0u8; 32];
        assert_eq!(
            KeyRing::new([(1u32, &k[..])], 2).err(),
            Some(KeyError::SignerMissing(2))
        );
    }

    #[test]
    fn too_large_kernel_handles_are_not_signed() {
        let mut out = [0u8; MAX_HANDLE_SZ];
        assert!(ring().sign(&[0; 32], 1, &[0; 109], &mut out).is_none());
        assert!(ring().sign(&[0; 32], 1, &[0; 108], &mut out).is_some());
    }
}
