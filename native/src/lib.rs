//! fhmon's per-call data plane, as a Python extension module (`monitor._native`) and as a
//! library (its own tests, the fuzz targets, bench/refmon).
//!
//! Layout: `abi` and `handle` decode target bytes (safe code, errors as values), `mac` signs
//! and verifies, `policy` decides inside-the-share (refusing with the table of `refusals`,
//! compiled from protocol/refusals.toml by build.rs), `sys` is the only module with `unsafe`.

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod creds;
#[cfg(feature = "test-hooks")]
pub mod fuzzing;
pub mod handle;
pub mod inside_memo;
pub mod intake;
pub mod mac;
pub mod plane;
pub mod policy;
pub mod refusals;
pub mod status;
#[allow(unsafe_code)] // the one module allowed to: the syscalls and the locked key memory
pub mod sys;

/// errno values and kernel types for the crate's users (bench/refmon)
pub use libc;

#[cfg(feature = "python")]
mod py;
