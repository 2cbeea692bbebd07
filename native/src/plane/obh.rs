//! open_by_handle_at, ported step by step from monitor/handlers/open_by_handle_at.py:
//! verify the signed handle, check mount_fd, the kernel's open, the share check, the
//! reopen with the target's credentials, ADDFD|SEND.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::abi;
use crate::creds::{ActingAs, Baseline};
use crate::handle::{self, MAX_HANDLE_SZ};
use crate::policy;
use crate::refusals;
use crate::sys;

use super::call::Call;
use super::outcome::{Outcome, err, refused};
use super::target_thread::mount_fd_device;

/// open_by_handle_at(mount_fd, handle, flags) for the call's thread.
pub(super) fn answer(call: &mut Call, base: &Baseline) -> Outcome {
    let (target, n) = (call.target, call.notif);
    let tid = n.pid as i32;
    let mount_fd = abi::arg_int(n.args[0]);
    let handle_ptr = abi::arg_ptr(n.args[1]);
    let flags = abi::arg_int(n.args[2]);

    let mut raw = [0u8; handle::HEADER_SIZE + MAX_HANDLE_SZ];
    let got = if handle_ptr == 0 {
        0
    } else {
        let room = (u64::MAX - handle_ptr + 1).min(raw.len() as u64) as usize;
        match sys::read_target(tid, handle_ptr, &mut raw[..room]) {
            Ok(got) => got,
            Err(libc::ESRCH) => return Outcome::Gone,
            Err(_) => return err(libc::EIO),
        }
    };
    let (header, f_handle) = match handle::parse_presented(&raw[..got]) {
        Ok(v) => v,
        Err(e) => return err(e.errno()),
    };
    let mount_dev = match mount_fd_device(target, n, mount_fd) {
        Ok(dev) => dev,
        Err(outcome) => return outcome,
    };
    let kernel_bytes = if call.settings.signing {
        let Some(keys) = call.keys() else {
            return err(libc::EIO);
        };
        match keys.verify(&target.share.share_id, header.handle_type, f_handle) {
            Some(k) => {
                let mut copy = [0u8; MAX_HANDLE_SZ];
                copy[..k.len()].copy_from_slice(k);
                (copy, k.len())
            }
            None => return refused(&refusals::MAC_INVALID),
        }
    } else {
        let mut copy = [0u8; MAX_HANDLE_SZ];
        copy[..f_handle.len()].copy_from_slice(f_handle);
        (copy, f_handle.len())
    };
    if mount_dev != target.share.facts.dev {
        return refused(&refusals::MOUNT_FD_FOREIGN);
    }
    let obj = match sys::open_by_handle_at(
        target.share.dir_fd.as_fd(),
        header.handle_type,
        &kernel_bytes.0[..kernel_bytes.1],
        libc::O_PATH | libc::O_CLOEXEC,
    ) {
        Ok(fd) => fd,
        Err(0) => return err(libc::ESTALE),
        Err(e) => return err(e),
    };
    let Ok(id) = policy::Identity::of(obj.as_fd()) else {
        return err(libc::EIO);
    };
    let is_dir = id.is_dir();
    if !(is_dir || id.mode & libc::S_IFMT == libc::S_IFREG) {
        return refused(&refusals::FILE_TYPE_REFUSED);
    }
    if let Err(refusal) = policy::check_opened(&target.share.root(), obj.as_fd(), &id) {
        return Outcome::Error(refusal.errno, refusal.reason);
    }
    let opened = match reopen_as_target(call, base, obj.as_fd(), flags, is_dir) {
        Ok(fd) => fd,
        Err(outcome) => return outcome,
    };
    drop(obj);
    let newfd_flags = if flags & abi::O_CLOEXEC != 0 {
        abi::O_CLOEXEC as u32
    } else {
        0
    };
    Outcome::Inject(opened, newfd_flags)
}

/// _reopen_as_target: the open the target asked for, with its own credentials; O_PATH
/// becomes a real read-only (else write-only) open, or a read-only fd fhmon opens when
/// the target's own chmod(2) could give itself read access right now
/// (policy::chmod_would_succeed); otherwise the first attempt's errno (EACCES).
fn reopen_as_target(
    call: &mut Call,
    base: &Baseline,
    obj: BorrowedFd<'_>,
    flags: i32,
    is_dir: bool,
) -> Result<OwnedFd, Outcome> {
    let status = call.status()?;
    let creds = &status.creds;
    let strip = abi::O_CLOEXEC | libc::O_NOFOLLOW | abi::O_PATH;
    let mut attempts = [0i32; 2];
    let count;
    if flags & abi::O_PATH != 0 {
        if flags & libc::O_DIRECTORY != 0 && !is_dir {
            return Err(err(libc::ENOTDIR));
        }
        if is_dir {
            attempts[0] = libc::O_RDONLY | libc::O_DIRECTORY;
            count = 1;
        } else {
            attempts = [libc::O_RDONLY, libc::O_WRONLY];
            count = 2;
        }
    } else {
        attempts[0] = (flags & !strip) | libc::O_NOCTTY;
        count = 1;
    }
    let mut first_error = 0;
    {
        let _acting = ActingAs::reopen_only(base, creds).map_err(|_| err(libc::EIO))?;
        for attempt in &attempts[..count] {
            match base.reopen(obj, attempt | abi::O_CLOEXEC) {
                Ok(fd) => return Ok(fd),
                Err(e) => {
                    if first_error == 0 {
                        first_error = if e == 0 { libc::EACCES } else { e };
                    }
                }
            }
        }
    }
    if flags & abi::O_PATH != 0
        && first_error == libc::EACCES
        && policy::chmod_would_succeed(obj, creds.fsuid)
    {
        // The target could chmod itself read access right now and then open it, so a
        // read-only fd grants it nothing new; opened by fhmon (CAP_DAC_READ_SEARCH
        // passes the read check), then the open file is asked once more.
        let fd = base
            .reopen(obj, attempts[0] | abi::O_CLOEXEC)
            .map_err(|e| {
                let failure = policy::failed(e);
                err(failure.errno)
            })?;
        if policy::chmod_would_succeed(fd.as_fd(), creds.fsuid) {
            return Ok(fd);
        }
    }
    Err(err(first_error))
}
