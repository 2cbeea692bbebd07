//! poll(): waiting until fds are ready.

use std::os::fd::{AsRawFd, BorrowedFd};

use super::{Errno, last_errno};

/// poll(fd, POLLIN, timeout_ms): Some(revents) or None on timeout.
pub fn poll_in(fd: BorrowedFd<'_>, timeout_ms: i32) -> Result<Option<i16>, Errno> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, and nfds says one.
    let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    match ret {
        0 => Ok(None),
        1.. => Ok(Some(pfd.revents)),
        _ => Err(last_errno()),
    }
}

/// poll() over several fds: how many have revents set (0 on timeout).
pub fn poll_many(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, Errno> {
    // SAFETY: fds is a live, exclusively borrowed slice of pollfd and nfds is its length.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if ret < 0 {
        Err(last_errno())
    } else {
        Ok(ret as usize)
    }
}
