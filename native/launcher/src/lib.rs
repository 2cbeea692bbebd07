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
//! Parsing (arguments, /etc/passwd, the parent-child channel) is safe code in `args`,
//! `users` and `channel`, fuzzed by tests/parsers.rs; every syscall goes through
//! fhmon_native::sys::launch, the one module with `unsafe`.

pub mod args;
pub mod channel;
pub mod errnames;
pub mod filter;
#[cfg(feature = "test-hooks")]
pub mod fuzzing;
pub mod run;
pub mod users;
