#![no_main]
//! cargo fuzz run launcher_user: see native/launcher/src/fuzzing.rs `user` for what it checks.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fhmon_launch::fuzzing::user(data));
