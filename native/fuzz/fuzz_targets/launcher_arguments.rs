#![no_main]
//! cargo fuzz run launcher_arguments: see native/launcher/src/fuzzing.rs `arguments` for what it checks.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fhmon_launch::fuzzing::arguments(data));
