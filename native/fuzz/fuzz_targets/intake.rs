#![no_main]
//! cargo fuzz run intake: see native/src/fuzzing.rs for what it checks.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fhmon_native::fuzzing::intake(data));
