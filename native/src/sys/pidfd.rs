//! pidfds: open one for a task, take a duplicate of its fd through it, check it lives.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::{Errno, owned};

pub use crate::abi::PIDFD_THREAD;

pub fn pidfd_open(pid: i32, flags: u32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) })
}

/// A duplicate of the target's fd `fd` through its pidfd.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, fd: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_getfd takes integers only and returns a new fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0u32) })
}

/// Whether a pidfd's task still lives (signal 0 through it), as linux.pidfd_alive.
pub fn pidfd_alive(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: pidfd_send_signal with signal 0 and no siginfo only checks the target.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    ret == 0
}
