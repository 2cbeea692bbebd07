//! inotify: hearing of a directory being moved or removed, for the memo of directories
//! known to be inside a share (crate::inside_memo).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::{Errno, last_errno, own_fd_link, owned};

/// A new inotify instance whose reads never block.
pub fn inotify_new() -> Result<OwnedFd, Errno> {
    // SAFETY: no pointers; inotify_init1 returns a new fd or -1.
    owned(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) } as libc::c_long)
}

/// Watch the directory one of our fds holds for being renamed (anywhere, by anyone) or
/// removed; the kernel also reports its unmount and a queue overflow unasked.
pub fn watch_moves(inotify: BorrowedFd<'_>, dir: BorrowedFd<'_>) -> Result<(), Errno> {
    let link = own_fd_link(dir);
    let mask = libc::IN_MOVE_SELF | libc::IN_DELETE_SELF | libc::IN_ONLYDIR;
    // SAFETY: link is NUL-terminated within its 32 bytes; the magic link is followed to
    // the open directory itself (no IN_DONT_FOLLOW).
    let ret = unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), link.as_ptr().cast(), mask) };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// Read (and drop) every event queued on the instance: whether there was any. An error
/// but "nothing queued" counts as an event (the caller then forgets what it knew).
pub fn drain_events(inotify: BorrowedFd<'_>) -> bool {
    let mut buf = [0u8; 4096];
    let mut any = false;
    loop {
        // SAFETY: buf is a live, exclusively borrowed buffer of buf.len() bytes.
        let ret = unsafe { libc::read(inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if ret > 0 {
            any = true;
            continue;
        }
        if ret < 0 && last_errno() == libc::EAGAIN {
            return any;
        }
        return true; // EOF or an error: nothing known can be trusted
    }
}
