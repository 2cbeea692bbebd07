//! Unix sockets: receiving bytes with an fd (SCM_RIGHTS).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{Errno, last_errno};

/// recvmsg on a unix stream socket: bytes into buf and at most one SCM_RIGHTS fd.
pub fn recv_with_fd(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> Result<(usize, Option<OwnedFd>), Errno> {
    // room for one cmsghdr with up to 4 fds (any extra fds are closed below)
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid "no name, no control" value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at the live iovec (into the exclusively borrowed buf) and the live
    // control buffer, with their true lengths.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(last_errno());
    }
    let mut first: Option<OwnedFd> = None;
    // SAFETY: CMSG_FIRSTHDR/NXTHDR walk the control buffer the kernel just filled, within
    // msg_controllen; each SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0)) / 4 fds.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                let data = libc::CMSG_DATA(cmsg).cast::<i32>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    if first.is_none() {
                        first = Some(fd);
                    } // else: dropped, closed
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, first))
}
