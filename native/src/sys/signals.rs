//! Signal masks of the calling thread, and the wake signal that interrupts a data-plane
//! thread blocked in RECV.

use super::{Errno, last_errno};

/// The signal that interrupts a data-plane thread's RECV (EINTR): a real-time signal no
/// Python code uses, with a handler that does nothing and no SA_RESTART.
fn wake_signal() -> i32 {
    libc::SIGRTMIN() + 6
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Install the do-nothing handler for wake_signal() (process-wide; idempotent).
pub fn install_wake_handler() -> Result<(), Errno> {
    // SAFETY: sigaction is plain old data; zeroed is a valid empty mask and no flags.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = ignore_signal as *const () as libc::sighandler_t;
    // SAFETY: a live sigaction whose handler is an extern "C" fn that touches nothing
    // (async-signal-safe); no old action is requested.
    let ret = unsafe { libc::sigaction(wake_signal(), &action, std::ptr::null_mut()) };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// Block every signal on the calling thread but wake_signal(): Python's signals go to its
/// own threads, and a data-plane thread never runs a handler mid-call except the no-op one.
pub fn block_signals_but_wake() {
    // SAFETY: sigset_t is plain old data, filled by sigfillset/sigdelset before use; the
    // mask change affects the calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::sigdelset(&mut set, wake_signal());
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Send wake_signal() to a thread of this process (by its pthread_t, from JoinHandle).
pub fn wake_thread(thread: libc::pthread_t) {
    // SAFETY: the caller passes the pthread_t of a thread it has not joined yet (the
    // JoinHandle is still held), so the id names a live or zombie-but-unjoined thread.
    unsafe { libc::pthread_kill(thread, wake_signal()) };
}

/// Block every signal on the calling thread; the previous mask, for restore_signals.
pub fn block_all_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data filled by sigfillset; the old mask is written by
    // pthread_sigmask into a live sigset_t. Affects the calling thread only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    }
}

pub fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: old is a mask returned by block_all_signals.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}
