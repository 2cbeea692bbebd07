//! File handles: name_to_handle_at and open_by_handle_at with the kernel's struct
//! file_handle laid out in a buffer of ours.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use super::{Errno, last_errno, own_fd_link, owned};
use crate::abi;

/// name_to_handle_at(dirfd, path, ..., flags) with a MAX_HANDLE_SZ buffer: (type, length,
/// mount id) with the kernel bytes in out[..length].
pub fn name_to_handle_at(
    dirfd: BorrowedFd<'_>,
    path: &CStr,
    flags: i32,
    out: &mut [u8; crate::handle::MAX_HANDLE_SZ],
) -> Result<(i32, usize, u64), Errno> {
    name_to_handle_at_raw(dirfd.as_raw_fd(), path, flags, out)
}

/// name_to_handle_at(AT_FDCWD, "/proc/self/fd/N", flags): a handle of what one of our fds
/// names, through the magic link (AT_HANDLE_CONNECTABLE needs a path walk).
pub fn name_to_handle_at_of_fd(
    fd: BorrowedFd<'_>,
    flags: i32,
    out: &mut [u8; crate::handle::MAX_HANDLE_SZ],
) -> Result<(i32, usize, u64), Errno> {
    let link = own_fd_link(fd);
    let path = CStr::from_bytes_until_nul(&link).map_err(|_| libc::EINVAL)?;
    name_to_handle_at_raw(abi::AT_FDCWD, path, flags, out)
}

fn name_to_handle_at_raw(
    dirfd: RawFd,
    path: &CStr,
    flags: i32,
    out: &mut [u8; crate::handle::MAX_HANDLE_SZ],
) -> Result<(i32, usize, u64), Errno> {
    let mut buf = [0u8; 8 + crate::handle::MAX_HANDLE_SZ];
    buf[..4].copy_from_slice(&(crate::handle::MAX_HANDLE_SZ as u32).to_le_bytes());
    let mut mount_id = [0u8; 8]; // a u64 with AT_HANDLE_MNT_ID_UNIQUE, else an int
    // SAFETY: buf holds a struct file_handle header announcing exactly the MAX_HANDLE_SZ
    // bytes that follow it; mount_id has room for the u64 form; path is NUL-terminated.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            dirfd,
            path.as_ptr(),
            buf.as_mut_ptr(),
            mount_id.as_mut_ptr(),
            flags,
        )
    };
    if ret < 0 {
        return Err(last_errno());
    }
    let header = crate::handle::Header::parse(&buf).ok_or(libc::EIO)?;
    let len = (header.handle_bytes as usize).min(crate::handle::MAX_HANDLE_SZ);
    out[..len].copy_from_slice(&buf[8..8 + len]);
    let mnt = if flags & abi::AT_HANDLE_MNT_ID_UNIQUE != 0 {
        u64::from_le_bytes(mount_id)
    } else {
        let low: [u8; 4] = [mount_id[0], mount_id[1], mount_id[2], mount_id[3]];
        u32::from_le_bytes(low) as u64
    };
    Ok((header.handle_type, len, mnt))
}

/// open_by_handle_at(mount_fd, {len(kernel_bytes), handle_type, kernel_bytes}, flags).
pub fn open_by_handle_at(
    mount_fd: BorrowedFd<'_>,
    handle_type: i32,
    kernel_bytes: &[u8],
    flags: i32,
) -> Result<OwnedFd, Errno> {
    let n = kernel_bytes.len().min(crate::handle::MAX_HANDLE_SZ);
    let mut buf = [0u8; 8 + crate::handle::MAX_HANDLE_SZ];
    buf[..8].copy_from_slice(
        &crate::handle::Header {
            handle_bytes: n as u32,
            handle_type,
        }
        .encode(),
    );
    buf[8..8 + n].copy_from_slice(&kernel_bytes[..n]);
    // SAFETY: buf is a complete struct file_handle whose header announces n bytes, all
    // present in the buffer; the kernel only reads it.
    owned(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            buf.as_ptr(),
            flags,
        )
    })
}
