//! The calling thread as the handlers reach it: its memory (getname's path, what is
//! written back), its fds (through the thread cache's pidfd; the last mount_fd), its /proc
//! links. Everything read from a target is untrusted and can change under us, and a TID
//! may name another thread once the caller died: an ID_VALID (or the ADDFD|SEND, which
//! validates by itself) proves the caller still waits before what was read has an effect.
//!
//! Reference: monitor/plane/target_thread.py TargetThread.

use std::os::fd::{AsFd, OwnedFd};

use crate::abi::{self, Notification};
use crate::policy::PATH_MAX;
use crate::sys;

use super::outcome::{Outcome, err, getfd_error, resource_or_gone};
use super::spare::lock;
use super::target::Target;
use super::thread_cache::{MountFdMemo, remember};

/// TargetThread.take_fd(check=False): a duplicate of the target's fd through a cached
/// pidfd of the calling thread (proved alive by the getfd itself) or a new one.
pub(super) fn take_fd(target: &Target, n: &Notification, fd: i32) -> Result<OwnedFd, Outcome> {
    let mut cache = lock(&target.threads);
    if let Some(e) = cache.get(n.pid) {
        match sys::pidfd_getfd(e.pidfd.as_fd(), fd) {
            Ok(ours) => return Ok(ours),
            Err(err) if sys::pidfd_alive(e.pidfd.as_fd()) => {
                return Err(getfd_error(target, n, err));
            }
            Err(_) => {
                cache.forget(n.pid); // its thread died; the TID names a new one
            }
        }
    }
    let pidfd = match sys::pidfd_open(n.pid as i32, sys::PIDFD_THREAD) {
        Ok(p) => p,
        Err(libc::EINVAL) => return Err(Outcome::Defer), // a kernel before 6.9
        Err(e) => return Err(resource_or_gone(target, n, e)),
    };
    let ours = sys::pidfd_getfd(pidfd.as_fd(), fd).map_err(|e| getfd_error(target, n, e))?;
    remember(&mut cache, n.pid, pidfd, None);
    Ok(ours)
}

/// TargetThread.open_root/open_cwd: /proc/TID/<link>, then ID_VALID.
pub(super) fn open_proc_link(
    target: &Target,
    n: &Notification,
    name: &[u8],
) -> Result<OwnedFd, Outcome> {
    let fd = sys::open_proc_link(n.pid, name).map_err(|e| resource_or_gone(target, n, e))?;
    if !matches!(sys::notif_id_valid(target.listener.as_fd(), n.id), Ok(true)) {
        return Err(Outcome::Gone);
    }
    Ok(fd)
}

/// TargetThread.mount_fd_device: EBADF as the kernel gives it (a bad fd, an O_PATH fd),
/// else the st_dev of the target's mount_fd (of its cwd for AT_FDCWD). Our duplicate is
/// remembered only if it is on the share's filesystem: any other (a socket with
/// SO_LINGER) could make our later close of it, the last one once the target closed its
/// copy, wait. Only an errno depends on it until ADDFD validates the notification.
pub(super) fn mount_fd_device(target: &Target, n: &Notification, fd: i32) -> Result<u64, Outcome> {
    if fd == abi::AT_FDCWD {
        return device_of(&open_proc_link(target, n, b"cwd")?);
    }
    if fd < 0 {
        return Err(err(libc::EBADF));
    }
    if let Some(dev) = known_mount_fd(target, n, fd) {
        return Ok(dev);
    }
    let ours = take_fd(target, n, fd)?;
    match sys::fcntl_getfl(ours.as_fd()) {
        Ok(fl) if fl & libc::O_PATH != 0 => return Err(err(libc::EBADF)),
        Ok(_) => {}
        Err(_) => return Err(err(libc::EIO)),
    }
    let dev = device_of(&ours)?;
    if dev == target.share.facts.dev {
        remember_mount_fd(target, fd, ours, dev); // the previous duplicate closes here
    }
    Ok(dev)
}

/// The st_dev of one of our fds; EIO if fstat fails (it names no caller's error).
fn device_of(fd: &OwnedFd) -> Result<u64, Outcome> {
    sys::fstat_dev_uid(fd.as_fd())
        .map(|(dev, _)| dev)
        .map_err(|_| err(libc::EIO))
}

/// TargetThread._known_mount_fd: the st_dev of the target's fd `fd` if it is still the open
/// file remembered (one kcmp, made under the lock so that the duplicate stays open), else
/// None. Like take_fd, it proves nothing about the notification: ADDFD validates it.
fn known_mount_fd(target: &Target, n: &Notification, fd: i32) -> Option<u64> {
    let memo = lock(&target.mount_fd);
    let known = memo.as_ref()?;
    let same =
        known.fd == fd && sys::is_open_file_of(n.pid as i32, fd, known.our_pid, known.ours.as_fd());
    same.then_some(known.dev)
}

/// TargetThread._remember_mount_fd: keep `ours`, our duplicate of the target's fd `fd` on
/// st_dev `dev`, for known_mount_fd (the previous duplicate is closed here).
fn remember_mount_fd(target: &Target, fd: i32, ours: OwnedFd, dev: u64) {
    *lock(&target.mount_fd) = Some(MountFdMemo {
        fd,
        ours,
        dev,
        our_pid: std::process::id() as i32,
    });
}

/// getname(): a NUL-terminated path of at most PATH_MAX bytes with the NUL, read as
/// TargetThread.read_path (the first page first, where almost every path ends): its length
/// without the NUL (which buf holds at that index).
pub(super) fn read_path(tid: i32, addr: u64, buf: &mut [u8; PATH_MAX]) -> Result<usize, Outcome> {
    const PAGE: u64 = abi::PAGE_SIZE;
    if addr == 0 {
        return Err(err(libc::EFAULT));
    }
    let read = |at: u64, into: &mut [u8]| match sys::read_target(tid, at, into) {
        Ok(got) => Ok(got),
        Err(libc::ESRCH) => Err(Outcome::Gone),
        Err(_) => Err(err(libc::EIO)),
    };
    let first = (PATH_MAX as u64).min(PAGE - addr % PAGE) as usize;
    let got = read(addr, &mut buf[..first])?;
    if let Some(nul) = buf[..got].iter().position(|&b| b == 0) {
        return Ok(nul);
    }
    if got < first {
        return Err(err(libc::EFAULT));
    }
    let after = u128::from(addr) + first as u128;
    let rest = ((PATH_MAX - first) as u128).min((1u128 << 64) - after) as usize;
    let got = if rest == 0 {
        0
    } else {
        read(after as u64, &mut buf[first..first + rest])?
    };
    let total = first + got;
    match buf[..total].iter().position(|&b| b == 0) {
        Some(nul) => Ok(nul),
        None if total < PATH_MAX => Err(err(libc::EFAULT)),
        None => Err(err(libc::ENAMETOOLONG)),
    }
}

/// TargetThread.write: ID_VALID, then one process_vm_writev of the chunks that have a
/// plausible address; EFAULT unless every byte landed.
pub(super) fn write(
    target: &Target,
    n: &Notification,
    chunks: &[(u64, &[u8])],
) -> Result<(), Outcome> {
    match sys::notif_id_valid(target.listener.as_fd(), n.id) {
        Ok(true) => {}
        _ => return Err(Outcome::Gone),
    }
    let mut writable = 0;
    let mut expected = 0;
    for (addr, data) in chunks {
        if *addr == 0 || addr.checked_add(data.len() as u64).is_none() {
            break;
        }
        writable += 1;
        expected += data.len();
    }
    let written = if writable == 0 {
        Ok(0)
    } else {
        sys::write_target(n.pid as i32, &chunks[..writable])
    };
    match written {
        Ok(count) if count == expected && writable == chunks.len() => Ok(()),
        Ok(_) => Err(err(libc::EFAULT)),
        Err(libc::ESRCH) => Err(Outcome::Gone),
        Err(_) => Err(err(libc::EIO)),
    }
}

/// The thread group of a TID, for the audit log (monitor/plane/audit.py _tgid).
pub(super) fn read_tgid(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Tgid:"))?;
    line["Tgid:".len()..].trim().parse().ok()
}
