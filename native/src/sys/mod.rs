//! The crate's only `unsafe` code: raw syscalls and the locked key memory.
//!
//! Every function here takes and returns plain Rust values (slices, arrays, OwnedFd) and
//! reports failure as an errno value: callers stay in safe code. Each unsafe block says which
//! invariant makes it sound.
//!
//! One file per domain; this one holds what they share (the errno, taking ownership of a new
//! fd, decimal numbers in paths) and names every function `sys::name`, whatever its file.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

mod cpus;
mod creds;
mod files;
mod handles;
mod inotify;
pub mod launch;
mod locked;
mod memory;
mod notif;
mod pidfd;
mod poll;
mod signals;
mod socket;
mod stat;

pub use cpus::cpus_allowed;
pub use creds::{
    capget_thread, capget_tid, capset_thread, euid_egid, getgroups, setfsgid, setfsuid,
    setgroups_thread,
};
pub use files::{
    dup, fcntl_getfl, fd_path, is_open_file_of, open_own_fd_dir, open_parent, open_path,
    open_proc_link, openat2, read_proc_status, reopen, reopen_in,
};
pub use handles::{name_to_handle_at, name_to_handle_at_of_fd, open_by_handle_at};
pub use inotify::{drain_events, inotify_new, watch_moves};
pub use locked::LockedBox;
pub use memory::{read_target, write_target};
pub use notif::{notif_addfd, notif_id_valid, notif_recv, notif_send, notif_set_sync_wakeup};
pub use pidfd::{PIDFD_THREAD, pidfd_alive, pidfd_creds, pidfd_getfd, pidfd_open};
pub use poll::poll_many;
pub use signals::{
    block_all_signals, block_signals_but_wake, install_wake_handler, restore_signals, wake_thread,
};
pub use socket::recv_with_fd;
pub use stat::{
    fstat_dev_ino, fstat_dev_uid, fstatfs_type_flags, inode_flags, statx_identity, statx_mode_mount,
};

/// A positive errno.
pub type Errno = i32;

fn last_errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Take ownership of a new fd the kernel just returned (ret >= 0), or the errno.
fn owned(ret: libc::c_long) -> Result<OwnedFd, Errno> {
    if ret < 0 {
        return Err(last_errno());
    }
    let fd = RawFd::try_from(ret).map_err(|_| libc::EBADF)?;
    // SAFETY: the kernel returned a fresh fd number that nothing else in this process owns
    // (every fd-returning syscall in this module goes through here exactly once).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// n in decimal at the start of out (which has room for 10 digits); how many were written.
fn write_decimal(n: u32, out: &mut [u8]) -> usize {
    let mut digits = [0u8; 10];
    let mut n = n;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        out[i] = digits[len - 1 - i];
    }
    len
}

/// "/proc/self/fd/N" for one of our fds, NUL-terminated within its 32 bytes: the magic link
/// through which a path call reaches the open file itself.
fn own_fd_link(fd: BorrowedFd<'_>) -> [u8; 32] {
    let mut link = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    link[..prefix.len()].copy_from_slice(prefix);
    write_decimal(fd.as_raw_fd() as u32, &mut link[prefix.len()..]);
    link
}
