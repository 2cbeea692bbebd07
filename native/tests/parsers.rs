//! A bounded, stable-toolchain run of the fuzz targets' bodies (src/fuzzing.rs): seeded
//! pseudo-random inputs plus edge cases, so `cargo test` covers every parser of target bytes
//! even where cargo-fuzz (nightly) is unavailable. FHMON_FUZZ_ITERATIONS sets the count.

use fhmon_native::fuzzing::{self, XorShift, iterations};

/// Inputs shaped like the real ones often enough to reach the deep branches: a plausible
/// handle header (handle_bytes near the limits, valid types) in about half of them.
fn input(rng: &mut XorShift, buf: &mut Vec<u8>) {
    buf.clear();
    let len = (rng.next() % 160) as usize;
    for _ in 0..len {
        buf.push(rng.next() as u8);
    }
    if len >= 8 && rng.next() % 2 == 0 {
        let n = [0u32, 1, 8, 20, 21, 28, 127, 128, 129][(rng.next() % 9) as usize];
        buf[..4].copy_from_slice(&n.to_le_bytes());
        buf[4..8].copy_from_slice(&((rng.next() % 3) as i32).to_le_bytes());
    }
}

fn run(seed: u64, target: fn(&[u8])) {
    let edges: [&[u8]; 5] = [&[], &[0; 7], &[0; 8], &[0xff; 80], &[0xff; 200]];
    for e in edges {
        target(e);
    }
    let mut rng = XorShift(seed);
    let mut buf = Vec::with_capacity(200);
    for _ in 0..iterations() {
        input(&mut rng, &mut buf);
        target(&buf);
    }
}

#[test]
fn notification() {
    run(0x9e37_79b9_7f4a_7c15, fuzzing::notification);
}

#[test]
fn presented_handle() {
    run(0xdead_beef_cafe_f00d, fuzzing::presented_handle);
}

#[test]
fn trailer() {
    run(0x0123_4567_89ab_cdef, fuzzing::trailer);
}

#[test]
fn proc_status() {
    run(0x5555_aaaa_1234_4321, fuzzing::proc_status);
    // shaped inputs: real field names with junk values
    let mut rng = XorShift(77);
    let names: [&[u8]; 7] = [
        b"Tgid:",
        b"Uid:",
        b"Gid:",
        b"CapEff:",
        b"CapPrm:",
        b"CapAmb:",
        b"NoNewPrivs:",
    ];
    let mut buf = Vec::new();
    for _ in 0..iterations() / 4 {
        buf.clear();
        for _ in 0..(rng.next() % 12) {
            buf.extend_from_slice(names[(rng.next() % 7) as usize]);
            for _ in 0..(rng.next() % 24) {
                let alphabet = b"0123456789abcdef \t\n-+x";
                buf.push(alphabet[(rng.next() % alphabet.len() as u64) as usize]);
            }
            buf.push(b'\n');
        }
        fuzzing::proc_status(&buf);
    }
}

#[test]
fn intake() {
    run(0x1357_9bdf_2468_ace0, fuzzing::intake);
    // shaped inputs: a valid header (magic, version 1, a real kind, a plausible length)
    let mut rng = XorShift(2025);
    let mut buf = Vec::new();
    for _ in 0..iterations() {
        buf.clear();
        let len = (rng.next() % 96) as u32;
        buf.extend_from_slice(b"FHMN\0\x01");
        buf.extend_from_slice(&((rng.next() % 9) as u16).to_be_bytes());
        buf.extend_from_slice(&len.to_be_bytes());
        for _ in 0..(len + (rng.next() % 3) as u32).saturating_sub(1) {
            buf.push(if rng.next() % 4 == 0 {
                0
            } else {
                rng.next() as u8
            });
        }
        fuzzing::intake(&buf);
    }
}
