//! The bodies of the fuzz targets (fuzz/fuzz_targets/*.rs) and of the bounded property loop
//! in tests/parsers.rs: each feeds arbitrary bytes to one parser of target bytes and checks
//! that it answers with a value (never a panic) that keeps the parser's own promises.

use crate::abi::{self, Notification};
use crate::handle::{self, HandleError};
use crate::mac::KeyRing;

/// abi::Notification::parse_slice and the argument decoders.
pub fn notification(data: &[u8]) {
    match Notification::parse_slice(data) {
        Some(n) => {
            assert_eq!(data.len(), abi::SECCOMP_NOTIF_SIZE);
            assert_eq!(&n.encode()[..], data);
            for arg in n.args {
                assert_eq!(abi::arg_int(arg) as u32 as u64, arg & 0xffff_ffff);
                assert_eq!(abi::arg_ptr(arg), arg);
            }
        }
        None => assert_ne!(data.len(), abi::SECCOMP_NOTIF_SIZE),
    }
}

/// handle::parse_presented: the kernel's order of checks over a readable prefix.
pub fn presented_handle(data: &[u8]) {
    let data = &data[..data.len().min(8 + handle::MAX_HANDLE_SZ)];
    match handle::parse_presented(data) {
        Ok((header, f_handle)) => {
            assert_eq!(f_handle.len(), header.handle_bytes as usize);
            assert!((1..=handle::MAX_HANDLE_SZ).contains(&f_handle.len()));
            assert!(handle::handle_type_is_valid(header.handle_type));
            assert_eq!(&header.encode()[..], &data[..8]);
        }
        Err(HandleError::Fault) => {
            let short_header = data.len() < 8;
            let short_bytes = handle::Header::parse(data)
                .is_some_and(|h| data.len() < 8 + h.handle_bytes as usize);
            assert!(short_header || short_bytes);
        }
        Err(HandleError::Invalid) => {
            let h = handle::Header::parse(data).expect("EINVAL needs a header");
            assert!(
                h.handle_bytes == 0
                    || h.handle_bytes as usize > handle::MAX_HANDLE_SZ
                    || !handle::handle_type_is_valid(h.handle_type)
            );
        }
    }
}

/// handle::split_trailer and KeyRing::verify on a presented f_handle: arbitrary bytes never
/// verify, and a handle signed here always does.
pub fn trailer(data: &[u8]) {
    const KEY: [u8; 32] = [0x5a; 32];
    let ring = KeyRing::new([(1u32, &KEY[..])], 1).expect("a valid ring");
    let share = [7u8; 32];
    let (handle_type, f_handle) = match data.split_first_chunk::<4>() {
        Some((t, rest)) => (i32::from_le_bytes(*t), rest),
        None => (0, data),
    };
    let f_handle = &f_handle[..f_handle.len().min(handle::MAX_HANDLE_SZ)];
    if let Some((kernel_bytes, _, mac)) = handle::split_trailer(f_handle) {
        assert_eq!(mac.len(), handle::MAC_SIZE);
        assert_eq!(kernel_bytes.len() + handle::TRAILER_SIZE, f_handle.len());
    }
    // a forgery succeeds with probability 2^-128: a verified input is one we signed
    if let Some(kernel_bytes) = ring.verify(&share, handle_type, f_handle) {
        let mut again = [0u8; handle::MAX_HANDLE_SZ];
        let n = ring
            .sign(&share, handle_type, kernel_bytes, &mut again)
            .expect("fits");
        assert_eq!(&again[..n], f_handle);
    }
    let kernel_bytes = &f_handle[..f_handle.len().min(handle::MAX_KERNEL_HANDLE_SIZE)];
    if !kernel_bytes.is_empty() {
        let mut signed = [0u8; handle::MAX_HANDLE_SZ];
        let n = ring
            .sign(&share, handle_type, kernel_bytes, &mut signed)
            .expect("fits");
        assert_eq!(
            ring.verify(&share, handle_type, &signed[..n]),
            Some(kernel_bytes)
        );
    }
}

/// status::parse over arbitrary /proc/TID/status text (the target names itself).
pub fn proc_status(data: &[u8]) {
    if let Some(s) = crate::status::parse(data) {
        // a frozen thread has one uid: its real uid is the one checked
        let _ = (s.tgid, s.uid, s.frozen);
    }
}

/// intake::decode_one and FrameDecoder over arbitrary bytes (what fhmon answers the
/// launcher): a decoded message re-encodes to the same bytes (but for the two non-canonical
/// forms: a REFUSE reason over 4000 characters, which encoding cuts, and an explicit
/// STATUS of 0); fed in two pieces, the decoder yields what it yields in one, or more where
/// the whole refused at once a bad header it could only see later in pieces.
pub fn intake(data: &[u8]) {
    use crate::intake::{self, FrameDecoder, Message};
    if let Ok(message) = intake::decode_one(data) {
        let again = intake::encode(&message).expect("a decoded message encodes");
        let canonical = match &message {
            Message::Refuse { reason, .. } => reason.chars().count() <= 4000,
            Message::StatusRequest { after: 0 } => data.len() == intake::HEADER_SIZE,
            _ => true,
        };
        if canonical {
            assert_eq!(&again[..], data);
        }
        let back = intake::decode_one(&again).expect("what encode made decodes");
        if canonical {
            assert_eq!(back, message);
        }
    }
    let whole = drain(&[data]);
    let cut = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    let pieces = drain(&[&data[..cut], &data[cut..]]);
    assert!(pieces.starts_with(&whole), "{pieces:?} vs {whole:?}");

    fn drain(pieces: &[&[u8]]) -> Vec<Message> {
        let mut decoder = FrameDecoder::new();
        let mut out = Vec::new();
        for piece in pieces {
            if decoder.feed(piece).is_err() {
                return out;
            }
            while let Ok(Some(m)) = decoder.next_message() {
                out.push(m);
            }
        }
        out
    }
}

/// The property loops' pseudo-random source (xorshift64: seeded, so a failure repeats),
/// shared by tests/parsers.rs and the launcher's.
pub struct XorShift(pub u64);

impl XorShift {
    #[allow(clippy::should_implement_trait)] // an endless generator, not an Iterator
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// How many inputs a property loop runs: FHMON_FUZZ_ITERATIONS, else 20,000.
pub fn iterations() -> u64 {
    std::env::var("FHMON_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}
