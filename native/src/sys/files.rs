//! Opening our own files: paths, /proc links and reopens of our fds; the fd calls that
//! go with them (dup, F_GETFL, readlink of an fd, kcmp of a target's fd against ours).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use super::{Errno, last_errno, own_fd_link, owned, write_decimal};
use crate::abi;

/// openat(dir, "..", O_PATH | O_DIRECTORY | O_CLOEXEC): the parent the kernel's own '..'
/// gives (ENOENT for a dentry outside what its bind mount shows).
pub fn open_parent(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: the path is a NUL-terminated literal; openat returns a new fd or -1.
    owned(unsafe { libc::openat(dir.as_raw_fd(), c"..".as_ptr(), flags) } as libc::c_long)
}

/// readlink("/proc/self/fd/N") into buf: the path the kernel prints for one of our fds.
pub fn fd_path<'b>(fd: BorrowedFd<'_>, buf: &'b mut [u8]) -> Result<&'b [u8], Errno> {
    let link = own_fd_link(fd);
    // SAFETY: link is NUL-terminated within its 32 bytes; buf is exclusively borrowed and
    // readlink writes at most buf.len() bytes into it.
    let ret = unsafe { libc::readlink(link.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    if ret < 0 {
        return Err(last_errno());
    }
    if ret as usize >= buf.len() {
        return Err(libc::ENAMETOOLONG); // may be cut short: never compare a prefix
    }
    Ok(&buf[..ret as usize])
}

/// Read /proc/TID/status into buf (one read: the file is generated whole); its length.
pub fn read_proc_status(tid: u32, buf: &mut [u8]) -> Result<usize, Errno> {
    use std::io::Read;
    let mut path = [0u8; 32];
    let prefix = b"/proc/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut at = prefix.len();
    at += write_decimal(tid, &mut path[at..]);
    path[at..at + 7].copy_from_slice(b"/status");
    at += 7;
    let name = std::ffi::OsStr::from_bytes(&path[..at]);
    let mut file = std::fs::File::open(name).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    file.read(buf)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

/// A duplicate of one of our fds (F_DUPFD_CLOEXEC), owned by the caller.
pub fn dup(fd: RawFd) -> Result<OwnedFd, Errno> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes integers and returns a new fd or -1; an fd
    // number that is not open gives EBADF.
    owned(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) } as libc::c_long)
}

/// open("/proc/self/fd/N", flags): a new open file for what fd names, with an open's
/// permission checks (linux.reopen).
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> Result<OwnedFd, Errno> {
    let link = own_fd_link(fd);
    // SAFETY: link is NUL-terminated within its 32 bytes.
    owned(unsafe { libc::open(link.as_ptr().cast(), flags, 0) } as libc::c_long)
}

/// openat(fd_dir, "N", flags) with fd_dir an open /proc/self/fd: reopen() walking one
/// path component instead of four (as monitor/linux.py reopen), same permission checks.
pub fn reopen_in(fd_dir: BorrowedFd<'_>, fd: BorrowedFd<'_>, flags: i32) -> Result<OwnedFd, Errno> {
    let mut name = [0u8; 12];
    write_decimal(fd.as_raw_fd() as u32, &mut name);
    // SAFETY: name holds at most 10 digits and stays NUL-terminated within its 12 bytes.
    owned(
        unsafe { libc::openat(fd_dir.as_raw_fd(), name.as_ptr().cast(), flags, 0) } as libc::c_long,
    )
}

/// open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC): for reopen_in.
pub fn open_own_fd_dir() -> Result<OwnedFd, Errno> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: the path is a NUL-terminated literal; open returns a new fd or -1.
    owned(unsafe { libc::open(c"/proc/self/fd".as_ptr(), flags) } as libc::c_long)
}

/// kcmp(pid, getpid(), KCMP_FILE, fd, ours) == 0: whether task `pid`'s fd is the very
/// open file our fd `ours` duplicates. False too when the task or its fd is gone (ESRCH,
/// EBADF) or kcmp is missing or refused (ENOSYS, EPERM): the caller then asks the long way.
pub fn is_open_file_of(pid: i32, fd: i32, our_pid: i32, ours: BorrowedFd<'_>) -> bool {
    // SAFETY: kcmp takes integers only and touches no memory of ours.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            our_pid,
            abi::KCMP_FILE,
            fd as libc::c_ulong,
            ours.as_raw_fd() as libc::c_ulong,
        )
    };
    ret == 0
}

/// openat2(dirfd, path, {flags, 0, resolve}).
pub fn openat2(
    dirfd: BorrowedFd<'_>,
    path: &CStr,
    flags: i32,
    resolve: u64,
) -> Result<OwnedFd, Errno> {
    let how: [u64; 3] = [flags as u32 as u64, 0, resolve];
    // SAFETY: path is NUL-terminated; how is a live struct open_how (flags, mode, resolve:
    // three u64) and its size is passed.
    owned(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            path.as_ptr(),
            how.as_ptr(),
            std::mem::size_of_val(&how),
        )
    })
}

/// open(path, O_PATH | O_CLOEXEC) of a path of ours.
pub fn open_path(path: &CStr) -> Result<OwnedFd, Errno> {
    // SAFETY: path is NUL-terminated.
    owned(unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) } as libc::c_long)
}

/// open("/proc/TID/<name>", O_PATH): the target thread's cwd or root.
pub fn open_proc_link(tid: u32, name: &[u8]) -> Result<OwnedFd, Errno> {
    let mut path = [0u8; 48];
    let prefix = b"/proc/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut at = prefix.len();
    at += write_decimal(tid, &mut path[at..]);
    path[at] = b'/';
    at += 1;
    let name = &name[..name.len().min(path.len() - at - 1)];
    path[at..at + name.len()].copy_from_slice(name);
    // SAFETY: path is NUL-terminated (its last byte is never written).
    owned(
        unsafe { libc::open(path.as_ptr().cast(), libc::O_PATH | libc::O_CLOEXEC) } as libc::c_long,
    )
}

pub fn fcntl_getfl(fd: BorrowedFd<'_>) -> Result<i32, Errno> {
    // SAFETY: F_GETFL takes no pointer.
    let ret = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if ret < 0 { Err(last_errno()) } else { Ok(ret) }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn an_fd_of_ours_is_reached_through_its_proc_self_fd_link() {
        let fd = open_path(c"/proc").unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(fd_path(fd.as_fd(), &mut buf), Ok(&b"/proc"[..]));
        let again = reopen(fd.as_fd(), libc::O_PATH | libc::O_CLOEXEC).unwrap();
        assert_eq!(fd_path(again.as_fd(), &mut buf), Ok(&b"/proc"[..]));
        let mut tiny = [0u8; 5];
        assert_eq!(fd_path(fd.as_fd(), &mut tiny), Err(libc::ENAMETOOLONG));
    }
}
