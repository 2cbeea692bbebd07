//! `fhmon-launch`: the native `fhmon launch` (docs/kubevirt.md, "The launcher").
//!
//! ```text
//! fork ─ child: drop to --user, NO_NEW_PRIVS, load the filter (NEW_LISTENER), pass the
//!        listener to the parent, close it, wait for "go", exec CMD
//!      └ parent: register the listener with fhmon (HELLO + SCM_RIGHTS), tell the child to
//!        go only after ACCEPT, then stay CMD's parent: forward SIGTERM/SIGINT/SIGHUP, keep
//!        the listener and the connection (re-register if fhmon restarts), exit with CMD's
//!        status.
//! ```
//!
//! The launch is `run` (the entry and the unserved fallback), `child` (the filtered child),
//! `supervise` (the parent, first registration to CMD's exit), `register` (one registration
//! attempt), `stuck_calls` (re-kicking calls after fhmon restarts) and `wait` (the one
//! poll loop). Parsing (arguments, /etc/passwd, the parent-child channel) is safe code in
//! `args`, `users` and `channel`, fuzzed by tests/parsers.rs; every syscall goes through
//! fhmon_native::sys::launch, the one module with `unsafe`.

pub mod args;
pub mod channel;
mod child;
pub mod errnames;
pub mod filter;
#[cfg(feature = "test-hooks")]
pub mod fuzzing;
mod register;
pub mod run;
pub mod stuck_calls;
mod supervise;
pub mod users;
mod wait;
