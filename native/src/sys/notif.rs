//! The seccomp listener's ioctls: receive a notification, answer it, check that its caller
//! still waits, inject an fd into it, set the listener's flags.

use std::os::fd::{AsRawFd, BorrowedFd};

use super::{Errno, last_errno};
use crate::abi;

/// SECCOMP_IOCTL_NOTIF_RECV into `buf` (zeroed first: the kernel demands it). Blocks.
pub fn notif_recv(
    listener: BorrowedFd<'_>,
    buf: &mut [u8; abi::SECCOMP_NOTIF_SIZE],
) -> Result<(), Errno> {
    buf.fill(0);
    // SAFETY: buf is a live, exclusively borrowed 80-byte buffer, the size of struct
    // seccomp_notif that this ioctl number encodes; the kernel writes only within it.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_RECV as _,
            buf.as_mut_ptr(),
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// SECCOMP_IOCTL_NOTIF_SEND with an encoded seccomp_notif_resp.
pub fn notif_send(
    listener: BorrowedFd<'_>,
    resp: &[u8; abi::SECCOMP_NOTIF_RESP_SIZE],
) -> Result<(), Errno> {
    let mut copy = *resp;
    // SAFETY: copy is a live 24-byte buffer, the size of struct seccomp_notif_resp that
    // this ioctl number encodes.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_SEND as _,
            copy.as_mut_ptr(),
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// SECCOMP_IOCTL_NOTIF_ID_VALID: Ok(true) while the notifying thread still waits.
pub fn notif_id_valid(listener: BorrowedFd<'_>, id: u64) -> Result<bool, Errno> {
    let mut id = id;
    // SAFETY: the ioctl reads one u64 through the pointer, which points at a live u64.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_ID_VALID as _,
            &mut id as *mut u64,
        )
    };
    match ret {
        0.. => Ok(true),
        _ if last_errno() == libc::ENOENT => Ok(false),
        _ => Err(last_errno()),
    }
}

/// SECCOMP_IOCTL_NOTIF_ADDFD with an encoded seccomp_notif_addfd: the target's fd number.
pub fn notif_addfd(
    listener: BorrowedFd<'_>,
    addfd: &[u8; abi::SECCOMP_NOTIF_ADDFD_SIZE],
) -> Result<i32, Errno> {
    let mut copy = *addfd;
    // SAFETY: copy is a live 24-byte buffer, the size of struct seccomp_notif_addfd that
    // this ioctl number encodes; the kernel only reads it.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_ADDFD as _,
            copy.as_mut_ptr(),
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(ret) }
}

/// SECCOMP_IOCTL_NOTIF_SET_FLAGS(SYNC_WAKE_UP): the flag goes by value, not by pointer.
pub fn notif_set_sync_wakeup(listener: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: this ioctl takes its argument by value; no memory is passed.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_SET_FLAGS as _,
            abi::SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP,
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}
