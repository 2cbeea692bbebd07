#![no_main]
//! cargo fuzz run launcher_channel: see native/launcher/src/fuzzing.rs `channel_bytes` for what it checks.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fhmon_launch::fuzzing::channel_bytes(data));
