//! poll(): waiting until fds are ready.

use super::{Errno, last_errno};

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
