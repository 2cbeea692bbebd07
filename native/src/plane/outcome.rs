//! What a handler decides for one call (`Outcome`), and the rules that turn a failure on
//! the way into one: answered with its errno while the call still waits, or "gone" (the
//! caller went away: nothing is answered). The handlers decide; only plane/answer.rs sends.
//!
//! Reference: monitor/handlers/base.py (Return, Error, InjectFd) and the errors of
//! monitor/plane/target_thread.py (RESOURCE_ERRNOS, _getfd_error, _resource_error).

use std::os::fd::{AsFd, OwnedFd};

use crate::abi::Notification;
use crate::refusals::Entry;
use crate::sys::{self, Errno};

use super::target::Target;

pub(super) enum Outcome {
    /// answered with this return value
    Return(i64),
    /// answered by ADDFD|SEND of this fd with these newfd flags (answer.rs sends it)
    Inject(OwnedFd, u32),
    /// answered with this errno; the reason, if fhmon refused, is audited (POLICY_ERRNOS)
    Error(i32, Option<&'static str>),
    /// the caller went away: nothing is answered, the call is counted "gone"
    Gone,
    /// answered by the Python reference instead (answer.rs Fallback)
    Defer,
}

/// A refusal of the table (protocol/refusals.toml): its errno, its reason audited.
pub(super) fn refused(entry: &Entry) -> Outcome {
    Outcome::Error(entry.errno, Some(entry.text()))
}

/// An errno answer without a reason to audit.
pub(super) fn err(errno: i32) -> Outcome {
    Outcome::Error(errno, None)
}

/// A failed pidfd_getfd on the notifying thread (TargetThread._getfd_error): EBADF and
/// the resource errnos are the caller's answer while it still waits; anything else, or a
/// notification no longer valid, means it is gone.
pub(super) fn getfd_error(target: &Target, n: &Notification, e: Errno) -> Outcome {
    if !matches!(sys::notif_id_valid(target.listener.as_fd(), n.id), Ok(true)) {
        return Outcome::Gone;
    }
    if e == libc::EBADF || is_resource_errno(e) {
        err(e)
    } else {
        Outcome::Gone
    }
}

/// Out of fds or memory in fhmon (EMFILE, ENFILE, ENOMEM): the kernel's own answer in that
/// state, as the reference's RESOURCE_ERRNOS (monitor/plane/target_thread.py).
fn is_resource_errno(e: Errno) -> bool {
    matches!(e, libc::EMFILE | libc::ENFILE | libc::ENOMEM)
}

/// A failed pidfd_open, /proc open or /proc read: out of fds or memory is answered while
/// the call still waits (never "the caller went away", which answers nothing and leaves
/// the target waiting for good); any other failure means the caller is gone.
pub(super) fn resource_or_gone(target: &Target, n: &Notification, e: Errno) -> Outcome {
    if is_resource_errno(e)
        && matches!(sys::notif_id_valid(target.listener.as_fd(), n.id), Ok(true))
    {
        err(e)
    } else {
        Outcome::Gone
    }
}
