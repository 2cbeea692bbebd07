//! The calling thread's credentials: capabilities, fsuid/fsgid, supplementary groups.

use super::{Errno, last_errno};
use crate::abi;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// (effective, permitted, inheritable) of the calling thread, as 64-bit masks.
pub fn capget_thread() -> Result<(u64, u64, u64), Errno> {
    capget(0)
}

/// capget of another thread by TID: (effective, permitted). The TID is a number: only a
/// liveness proof through the thread's pidfd after the call shows it named that thread.
pub fn capget_tid(tid: u32) -> Result<(u64, u64), Errno> {
    let pid = i32::try_from(tid).map_err(|_| libc::ESRCH)?;
    capget(pid).map(|(effective, permitted, _)| (effective, permitted))
}

/// capget(2) of `pid` (0: the calling thread): its three sets as 64-bit masks.
fn capget(pid: i32) -> Result<(u64, u64, u64), Errno> {
    let mut header = CapHeader {
        version: abi::LINUX_CAPABILITY_VERSION_3,
        pid,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: a version-3 header and the two data structs that version reads and writes.
    let ret = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if ret < 0 {
        return Err(last_errno());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
        join(data[0].inheritable, data[1].inheritable),
    ))
}

/// capset on the calling thread only (the raw syscall; pid 0 = this thread).
pub fn capset_thread(effective: u64, permitted: u64, inheritable: u64) -> Result<(), Errno> {
    let mut header = CapHeader {
        version: abi::LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: effective as u32,
            permitted: permitted as u32,
            inheritable: inheritable as u32,
        },
        CapData {
            effective: (effective >> 32) as u32,
            permitted: (permitted >> 32) as u32,
            inheritable: (inheritable >> 32) as u32,
        },
    ];
    // SAFETY: a version-3 header and the two data structs that version reads.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// (euid, egid) of the process.
pub fn euid_egid() -> (u32, u32) {
    // SAFETY: geteuid/getegid take nothing and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// setfsuid/setfsgid: per-thread by nature; they return the previous id.
pub fn setfsuid(uid: u32) -> u32 {
    // SAFETY: takes an integer, touches no memory.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid) as u32 }
}

pub fn setfsgid(gid: u32) -> u32 {
    // SAFETY: takes an integer, touches no memory.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid) as u32 }
}

/// setgroups for the calling thread only (the raw syscall; glibc's wrapper would change
/// every thread of the process).
pub fn setgroups_thread(groups: &[u32]) -> Result<(), Errno> {
    // SAFETY: the kernel reads groups.len() gid_t (u32) values from the slice.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// The calling thread's supplementary groups, into buf: how many.
pub fn getgroups(buf: &mut [u32]) -> Result<usize, Errno> {
    // SAFETY: the kernel writes at most buf.len() gid_t values into buf.
    let ret = unsafe { libc::getgroups(buf.len() as i32, buf.as_mut_ptr()) };
    if ret < 0 {
        Err(last_errno())
    } else {
        Ok(ret as usize)
    }
}
