//! The target's memory: process_vm_readv and process_vm_writev, never a pointer of ours.

use super::{Errno, last_errno};
use crate::abi;

/// process_vm_readv of [addr, addr + buf.len()) in `pid` into buf, cut at page boundaries
/// so that the readable prefix comes back (the kernel stops at the first fault): the count.
pub fn read_target(pid: i32, addr: u64, buf: &mut [u8]) -> Result<usize, Errno> {
    const PAGE: u64 = abi::PAGE_SIZE;
    const MAX_IOV: usize = 4;
    if buf.is_empty() {
        return Ok(0);
    }
    let mut remote = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_IOV];
    let mut count = 0;
    let mut at = addr;
    let end = addr.saturating_add(buf.len() as u64);
    while at < end && count < MAX_IOV {
        let chunk = ((at / PAGE + 1) * PAGE).min(end) - at;
        remote[count] = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: chunk as usize,
        };
        count += 1;
        at += chunk;
    }
    let wanted = (at - addr) as usize;
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: wanted,
    };
    // SAFETY: the local iovec covers `wanted` <= buf.len() bytes of the exclusively borrowed
    // buf; the remote iovecs name the target's memory, which the kernel checks (EFAULT or a
    // short count), never ours.
    let ret = unsafe { libc::process_vm_readv(pid, &local, 1, remote.as_ptr(), count as _, 0) };
    if ret < 0 {
        let err = last_errno();
        return if err == libc::EFAULT { Ok(0) } else { Err(err) };
    }
    Ok(ret as usize)
}

/// process_vm_writev of each (addr, bytes) in order: the number of bytes written (it stops
/// at the first page it cannot write, as copy_to_user would).
pub fn write_target(pid: i32, chunks: &[(u64, &[u8])]) -> Result<usize, Errno> {
    const MAX_IOV: usize = 4;
    if chunks.len() > MAX_IOV {
        return Err(libc::EINVAL);
    }
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut local = [empty; MAX_IOV];
    let mut remote = [empty; MAX_IOV];
    for (i, (addr, data)) in chunks.iter().enumerate() {
        // the kernel only reads local buffers for a write; the cast to *mut is its ABI
        local[i] = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        remote[i] = libc::iovec {
            iov_base: *addr as *mut libc::c_void,
            iov_len: data.len(),
        };
    }
    let n = chunks.len() as libc::c_ulong;
    // SAFETY: local iovecs point into the borrowed chunk slices (read only by the kernel for
    // a writev); remote ones name the target's memory, which the kernel checks.
    let ret = unsafe { libc::process_vm_writev(pid, local.as_ptr(), n, remote.as_ptr(), n, 0) };
    if ret < 0 {
        let err = last_errno();
        return if err == libc::EFAULT { Ok(0) } else { Err(err) };
    }
    Ok(ret as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_unmapped_target_memory_is_a_short_count() {
        let me = std::process::id() as i32;
        let mut buf = [0u8; 16];
        assert_eq!(read_target(me, 8, &mut buf), Ok(0));
        let src = [1u8, 2, 3, 4];
        assert_eq!(read_target(me, src.as_ptr() as u64, &mut buf[..4]), Ok(4));
        assert_eq!(&buf[..4], &src);
    }
}
