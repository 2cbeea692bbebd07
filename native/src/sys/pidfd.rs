//! pidfds: open one for a task, take a duplicate of its fd through it, check it lives,
//! read its credentials.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::{Errno, last_errno, owned};
use crate::abi;

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

/// ioctl(PIDFD_GET_INFO, PIDFD_INFO_CREDS): the pidfd's thread's ruid, rgid, euid, egid,
/// suid, sgid, fsuid and fsgid, as the kernel holds them now (ESRCH once it has exited;
/// ENOTTY or EINVAL before 6.13).
pub fn pidfd_creds(pidfd: BorrowedFd<'_>) -> Result<[u32; 8], Errno> {
    let mut info = [0u8; abi::PIDFD_INFO_SIZE_VER0];
    info[..8].copy_from_slice(&abi::PIDFD_INFO_CREDS.to_ne_bytes());
    // SAFETY: the ioctl reads and writes exactly the 64 bytes its number encodes.
    let ret = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            abi::PIDFD_GET_INFO as _,
            info.as_mut_ptr(),
        )
    };
    if ret < 0 {
        return Err(last_errno());
    }
    let mask = u64::from_ne_bytes(info[..8].try_into().unwrap_or_default());
    if mask & abi::PIDFD_INFO_CREDS == 0 {
        return Err(libc::EINVAL);
    }
    let mut ids = [0u32; 8];
    for (i, id) in ids.iter_mut().enumerate() {
        let at = 28 + 4 * i;
        *id = u32::from_ne_bytes(info[at..at + 4].try_into().unwrap_or_default());
    }
    Ok(ids)
}
