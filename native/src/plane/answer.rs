//! One call, from the notification received to the answer sent: which syscall it is, its
//! work under catch_unwind (a `Call` through the uid check to its handler), then the one
//! place a call is answered (SEND, ADDFD|SEND, or the Python reference through Fallback),
//! counted and, refused with a reason, audited. The handlers only decide (an Outcome).
//!
//! Reference: monitor/calls.py Answerer, monitor/handlers/registry.py (the dispatch: a
//! handler that raises is answered EIO), monitor/handlers/reply.py (the one answerer) and
//! monitor/plane/audit.py.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::MutexGuard;
#[cfg(feature = "test-hooks")]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::abi::{self, Notification};
use crate::creds::Baseline;
use crate::sys;

use super::call::{Call, Settings};
use super::outcome::{Outcome, err};
use super::spare::lock;
use super::stats::{Audit, BUCKETS, Counters, GONE, MAX_ERRNO};
use super::target::Target;
use super::{n2h, obh};

/// A call the Python reference answers instead (target id, the raw notification).
pub type Fallback = dyn Fn(u64, &[u8; abi::SECCOMP_NOTIF_SIZE]) + Send + Sync;

/// errnos whose refusal with a reason is audited (monitor/plane/audit.py _POLICY_ERRNOS)
const POLICY_ERRNOS: [i32; 5] = [
    libc::EACCES,
    libc::ESTALE,
    libc::EOPNOTSUPP,
    libc::ENOSYS,
    libc::ELOOP,
];

/// What answers every call of the plane: the settings its handlers see, the counters and
/// the audit queue it counts into, and the Python reference it defers to.
pub(super) struct Answerer {
    pub(super) settings: Settings,
    pub(super) counters: Counters,
    pub(super) audit: Audit,
    fallback: Box<Fallback>,
    /// test hook (monitor._native.Plane.panic_next_calls): this many coming calls panic in their work
    #[cfg(feature = "test-hooks")]
    panic_next: AtomicU64,
}

impl Answerer {
    pub(super) fn new(
        accepted_flags: i32,
        signing: bool,
        buckets: [f64; BUCKETS],
        fallback: Box<Fallback>,
    ) -> Answerer {
        Answerer {
            settings: Settings::new(accepted_flags, signing),
            counters: Counters::new(buckets),
            audit: Audit::new(),
            fallback,
            #[cfg(feature = "test-hooks")]
            panic_next: AtomicU64::new(0),
        }
    }

    /// Test hook: the next `n` calls answered natively panic inside their work.
    #[cfg(feature = "test-hooks")]
    pub(super) fn panic_next_calls(&self, n: u64) {
        self.panic_next.store(n, Ordering::SeqCst);
    }

    /// The test hook's panic, inside a call's work, while panic_next_calls asks for one.
    #[cfg(feature = "test-hooks")]
    fn panic_if_asked(&self) {
        if self.panic_next.load(Ordering::Relaxed) > 0
            && self
                .panic_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("injected by the test hook Plane.panic_next_calls");
        }
    }

    /// One call: its work under catch_unwind (a panic answers it EIO, as the reference's
    /// registry does when a handler raises, and is counted); Err(()) after a panic.
    pub(super) fn answer(
        &self,
        target: &Target,
        raw: &[u8; abi::SECCOMP_NOTIF_SIZE],
        base: Option<&Baseline>,
        start: Instant,
        mut working: Option<MutexGuard<'_, ()>>,
    ) -> Result<(), ()> {
        let notif = Notification::parse(raw);
        let syscall = match (notif.arch, notif.nr) {
            (abi::AUDIT_ARCH_X86_64, abi::SYS_NAME_TO_HANDLE_AT) => Some(0),
            (abi::AUDIT_ARCH_X86_64, abi::SYS_OPEN_BY_HANDLE_AT) if base.is_some() => Some(1),
            _ => None,
        };
        let work = || {
            #[cfg(feature = "test-hooks")]
            self.panic_if_asked();
            outcome(
                &mut Call::new(target, &notif, base, &self.settings),
                syscall,
            )
        };
        let (outcome, panicked) = match guarded(work) {
            Some(outcome) => (outcome, false),
            None => {
                self.counters.panicked();
                (err(libc::EIO), true)
            }
        };
        let syscall = syscall.unwrap_or(0);
        if !matches!(outcome, Outcome::Defer) {
            // the work is done: the answer is the target's to wait for, not the plane's
            // CPU, and holding the lock over it made the other thread, woken by the
            // target's next call, wait for this one (n2h p50 9.6 against 6.3 us)
            working.take();
        }
        let result = match outcome {
            Outcome::Defer => {
                // Python code runs on this thread next: with the thread's own fsgid and
                // groups (creds.rs Lingering), never a target's
                if base.is_some_and(|b| b.settle().is_err()) {
                    let resp = abi::encode_response(notif.id, 0, libc::EIO);
                    let _ = sys::notif_send(target.listener.as_fd(), &resp);
                    self.counters
                        .record(target, syscall, libc::EIO as usize, start);
                    return Ok(());
                }
                let _serial = lock(&target.fallback_lock);
                (self.fallback)(target.id, raw);
                return Ok(()); // the Python reference counts its own calls
            }
            Outcome::Gone => GONE,
            Outcome::Inject(fd, newfd_flags) => inject(target, &notif, fd, newfd_flags),
            Outcome::Return(val) => {
                let resp = abi::encode_response(notif.id, val, 0);
                let _ = sys::notif_send(target.listener.as_fd(), &resp);
                0
            }
            Outcome::Error(errno, reason) => {
                if let Some(reason) = reason.filter(|_| POLICY_ERRNOS.contains(&errno)) {
                    if !matches!(
                        sys::notif_id_valid(target.listener.as_fd(), notif.id),
                        Ok(true)
                    ) {
                        self.counters.record(target, syscall, GONE, start);
                        return Ok(());
                    }
                    self.audit
                        .refused(target, syscall, errno, reason, notif.pid);
                }
                let resp = abi::encode_response(notif.id, 0, errno);
                let _ = sys::notif_send(target.listener.as_fd(), &resp);
                (errno as usize).min(MAX_ERRNO)
            }
        };
        self.counters.record(target, syscall, result, start);
        if panicked { Err(()) } else { Ok(()) }
    }
}

/// What to answer: the uid check, then the handler (syscall None: not one of ours).
fn outcome(call: &mut Call, syscall: Option<usize>) -> Outcome {
    match syscall {
        Some(which) => match call.owned_by_peer() {
            Ok(true) if which == 0 => n2h::answer(call),
            Ok(true) => match call.base {
                Some(base) => obh::answer(call, base),
                None => Outcome::Defer,
            },
            Ok(false) => Outcome::Defer, // the reference refuses it (EPERM + audit)
            Err(outcome) => outcome,
        },
        None => Outcome::Defer,
    }
}

/// ADDFD|SEND: the fd lands in the target and the call returns its number, atomically.
fn inject(target: &Target, n: &Notification, fd: OwnedFd, newfd_flags: u32) -> usize {
    let addfd = abi::encode_addfd(
        n.id,
        fd.as_raw_fd(),
        newfd_flags,
        abi::SECCOMP_ADDFD_FLAG_SEND,
    );
    // no signal may interrupt ADDFD|SEND once the kernel marked the call answered
    let mask = sys::block_all_signals();
    let added = sys::notif_addfd(target.listener.as_fd(), &addfd);
    sys::restore_signals(&mask);
    drop(fd);
    match added {
        Ok(_) => 0,
        Err(libc::ENOENT) => GONE,
        Err(e) => {
            // e.g. EMFILE in the target: the call still waits for an answer
            let resp = abi::encode_response(n.id, 0, e);
            let _ = sys::notif_send(target.listener.as_fd(), &resp);
            (e as usize).min(MAX_ERRNO)
        }
    }
}

/// Run a call's work, catching a panic (None): the thread survives to answer the call and
/// the next ones. Locks a panic leaves poisoned are taken over by lock(); the credentials
/// guard (creds::ActingAs) switches back as it unwinds.
fn guarded<T>(work: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(work)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_the_work_is_caught_and_the_next_call_runs() {
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let first = guarded(|| -> i32 { panic!("a handler bug") });
        let second = guarded(|| 7);
        std::panic::set_hook(quiet);
        assert!(first.is_none());
        assert_eq!(second, Some(7));
    }
}
