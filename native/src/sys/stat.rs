//! What an fd is: statx, fstat, fstatfs and the inode flags.

use std::os::fd::{AsRawFd, BorrowedFd};

use super::{Errno, last_errno};
use crate::abi;

/// statx(fd, "", AT_EMPTY_PATH): (st_mode, unique mount id) as linux.statx_mode_mount.
pub fn statx_mode_mount(fd: BorrowedFd<'_>) -> Result<(u32, u64), Errno> {
    let stx = statx_with_mount(fd, libc::STATX_TYPE | libc::STATX_MODE)?;
    Ok((u32::from(stx.stx_mode), stx.stx_mnt_id))
}

/// statx(fd, "", AT_EMPTY_PATH) for `mask` and the unique mount id; EOPNOTSUPP from a
/// kernel that reports no mount id at all.
fn statx_with_mount(fd: BorrowedFd<'_>, mask: u32) -> Result<libc::statx, Errno> {
    // SAFETY: statx is plain old data; all-zero is a valid value to be overwritten.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a NUL-terminated literal and stx a live struct statx.
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            mask | libc::STATX_MNT_ID_UNIQUE,
            &mut stx,
        )
    };
    if ret < 0 {
        return Err(last_errno());
    }
    if stx.stx_mask & (libc::STATX_MNT_ID_UNIQUE | libc::STATX_MNT_ID) == 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(stx)
}

/// statx(fd, "", AT_EMPTY_PATH): (st_mode, st_dev, st_ino, unique mount id), as
/// linux.statx_identity: what the inside-the-share walk compares at each level.
pub fn statx_identity(fd: BorrowedFd<'_>) -> Result<(u32, u64, u64, u64), Errno> {
    let stx = statx_with_mount(fd, libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_INO)?;
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    Ok((u32::from(stx.stx_mode), dev, stx.stx_ino, stx.stx_mnt_id))
}

/// fstatfs: (f_type, f_flags) of the filesystem an fd (O_PATH too) is on, as
/// linux.fstatfs; f_flags has ST_RDONLY when the mount or the superblock is read-only.
pub fn fstatfs_type_flags(fd: BorrowedFd<'_>) -> Result<(i64, i64), Errno> {
    // struct statfs on x86_64 is 15 longs (120 bytes): f_type [0], f_flags [10]; the libc
    // crate's struct hides f_flags, so the raw syscall fills a buffer of the same layout.
    let mut buf = [0i64; 15];
    // SAFETY: buf is a live, exclusively borrowed, suitably aligned 120-byte buffer, the
    // size of the kernel's struct statfs on this architecture; the kernel writes only it.
    let ret = unsafe { libc::syscall(libc::SYS_fstatfs, fd.as_raw_fd(), buf.as_mut_ptr()) };
    if ret < 0 {
        return Err(last_errno());
    }
    Ok((buf[0], buf[10]))
}

/// fstat: (st_dev, st_ino).
pub fn fstat_dev_ino(fd: BorrowedFd<'_>) -> Result<(u64, u64), Errno> {
    // SAFETY: stat is plain old data, written whole by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live struct stat.
    let ret = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    if ret < 0 {
        return Err(last_errno());
    }
    Ok((st.st_dev, st.st_ino))
}

/// fstat: (st_dev, st_uid).
pub fn fstat_dev_uid(fd: BorrowedFd<'_>) -> Result<(u64, u32), Errno> {
    // SAFETY: stat is plain old data, written whole by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live struct stat.
    let ret = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    if ret < 0 {
        return Err(last_errno());
    }
    Ok((st.st_dev, st.st_uid))
}

/// FS_IOC_GETFLAGS: the inode flags (immutable, append-only...).
pub fn inode_flags(fd: BorrowedFd<'_>) -> Result<i32, Errno> {
    let mut flags: i32 = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer, which points at one.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), abi::FS_IOC_GETFLAGS as _, &mut flags) };
    if ret < 0 {
        Err(last_errno())
    } else {
        Ok(flags)
    }
}
