//! A bounded, stable-toolchain property loop over the launcher's parsers (src/fuzzing.rs),
//! as native/tests/parsers.rs does for the plane's. FHMON_FUZZ_ITERATIONS sets the count.

use fhmon_launch::fuzzing;
use fhmon_native::fuzzing::{XorShift, iterations};

/// Inputs built from `words` (real option names, separators) and random bytes, so that the
/// deep branches are reached as well as the shallow refusals.
fn run(seed: u64, words: &[&[u8]], target: fn(&[u8])) {
    for edge in [&b""[..], b"\0", b"\0\0\0", b"--", b"launch\0--"] {
        target(edge);
    }
    let mut rng = XorShift(seed);
    let mut buf = Vec::new();
    for _ in 0..iterations() {
        buf.clear();
        for _ in 0..rng.next() % 12 {
            if rng.next() % 3 == 0 {
                for _ in 0..rng.next() % 6 {
                    buf.push(rng.next() as u8);
                }
            } else {
                buf.extend_from_slice(words[(rng.next() % words.len() as u64) as usize]);
            }
        }
        target(&buf);
    }
}

#[test]
fn arguments() {
    let words: [&[u8]; 16] = [
        b"\0",
        b"launch\0",
        b"served-argv\0",
        b"--socket\0/s\0",
        b"--share=/d\0",
        b"--user\x00107:107\0",
        b"--fail-open\0",
        b"--virtiofsd-handles=prefer\0",
        b"--virtiofsd-handles\0mandatory\0",
        b"--virtiofsd-migration=file-handles\0",
        b"--registration-timeout=1.5\0",
        b"--\0",
        b"virtiofsd\0",
        b"--inode-file-handles=never\0",
        b"--inode-file-handles\0",
        b"--migration-mode\0find-paths\0",
    ];
    run(0x0bad_cafe_dead_beef, &words, fuzzing::arguments);
}

#[test]
fn user() {
    let words: [&[u8]; 10] = [
        b"\0",
        b":",
        b"\n",
        b"qemu",
        b"107",
        b"4294967296",
        b"qemu:x:107:107::/:/bin/false\n",
        b"kvm:x:36:qemu\n",
        b"x",
        b"0",
    ];
    run(0x1234_5678_9abc_def0, &words, fuzzing::user);
}

#[test]
fn channel() {
    let words: [&[u8]; 8] = [
        b"A",
        b"P",
        b"X",
        b"R",
        b"\0",
        b"\x03\0\0\0",
        b"13\0/usr/libexec/virtiofsd",
        b") S 1 2",
    ];
    run(0x5eed_0000_1111_2222, &words, fuzzing::channel_bytes);
}
