//! name_to_handle_at, ported step by step from monitor/handlers/name_to_handle_at.py:
//! the target's own lookup (with its credentials), the share check, the kernel's call,
//! the signed handle written back.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::abi;
use crate::creds::ActingAs;
use crate::handle::{self, MAX_HANDLE_SZ, MAX_KERNEL_HANDLE_SIZE};
use crate::policy::{self, PATH_MAX};
use crate::refusals;
use crate::sys;

use super::call::Call;
use super::outcome::{Outcome, err, refused};
use super::target_thread::{open_proc_link, read_path, take_fd, write};

/// name_to_handle_at(dirfd, pathname, handle, mount_id, flags) for the call's thread.
pub(super) fn answer(call: &mut Call) -> Outcome {
    let (target, n) = (call.target, call.notif);
    let tid = n.pid as i32;
    let dirfd = abi::arg_int(n.args[0]);
    let path_ptr = abi::arg_ptr(n.args[1]);
    let handle_ptr = abi::arg_ptr(n.args[2]);
    let mount_id_ptr = abi::arg_ptr(n.args[3]);
    let flags = abi::arg_int(n.args[4]);

    if flags & !call.settings.accepted_flags != 0 {
        return err(libc::EINVAL);
    }
    if flags & abi::AT_HANDLE_CONNECTABLE != 0
        && flags & (abi::AT_HANDLE_FID | abi::AT_EMPTY_PATH) != 0
    {
        return err(libc::EINVAL);
    }
    // getname(), then the walk (resolve) as the target
    let mut path_buf = [0u8; PATH_MAX];
    let path_len = match read_path(tid, path_ptr, &mut path_buf) {
        Ok(len) => len,
        Err(outcome) => return outcome,
    };
    if path_len == 0 && flags & abi::AT_EMPTY_PATH == 0 {
        return err(libc::ENOENT);
    }
    let follow = flags & abi::AT_SYMLINK_FOLLOW != 0;
    let obj = match resolve(call, dirfd, &path_buf[..=path_len], follow) {
        Ok(fd) => fd,
        Err(outcome) => return outcome,
    };
    let Ok(id) = policy::Identity::of(obj.as_fd()) else {
        return err(libc::EIO);
    };
    if let Err(refusal) = policy::check_resolved(&target.share.root(), obj.as_fd(), &id) {
        return Outcome::Error(refusal.errno, refusal.reason);
    }
    let passthrough = flags & (abi::AT_HANDLE_FID | abi::AT_HANDLE_MNT_ID_UNIQUE);
    let mut kernel_bytes = [0u8; MAX_HANDLE_SZ];
    let kernel_handle = if flags & abi::AT_HANDLE_CONNECTABLE != 0 {
        sys::name_to_handle_at_of_fd(
            obj.as_fd(),
            passthrough | abi::AT_HANDLE_CONNECTABLE | abi::AT_SYMLINK_FOLLOW,
            &mut kernel_bytes,
        )
    } else {
        sys::name_to_handle_at(
            obj.as_fd(),
            c"",
            passthrough | abi::AT_EMPTY_PATH,
            &mut kernel_bytes,
        )
    };
    let (handle_type, len, mnt) = match kernel_handle {
        Ok(v) => v,
        Err(e) => return err(if e == 0 { libc::EINVAL } else { e }),
    };
    drop(obj);
    let file_type = id.mode & libc::S_IFMT;
    if file_type != libc::S_IFDIR && file_type != libc::S_IFREG {
        return refused(&refusals::FILE_TYPE_NO_HANDLE);
    }
    if len > MAX_KERNEL_HANDLE_SIZE {
        return refused(&refusals::HANDLE_TOO_LARGE);
    }
    // the header, as read_exact(handle_ptr, 8)
    if handle_ptr == 0 || handle_ptr.checked_add(8).is_none() {
        return err(libc::EFAULT);
    }
    let mut header = [0u8; handle::HEADER_SIZE];
    match sys::read_target(tid, handle_ptr, &mut header) {
        Ok(8) => {}
        Ok(_) => return err(libc::EFAULT),
        Err(libc::ESRCH) => return Outcome::Gone,
        Err(_) => return err(libc::EIO),
    }
    let Some(header) = handle::Header::parse(&header) else {
        return err(libc::EFAULT);
    };
    if header.handle_bytes as usize > MAX_HANDLE_SZ {
        return err(libc::EINVAL);
    }
    let mut out = [0u8; handle::HEADER_SIZE + MAX_HANDLE_SZ];
    let f_len = if call.settings.signing {
        let Some(keys) = call.keys() else {
            return err(libc::EIO);
        };
        let mut signed = [0u8; MAX_HANDLE_SZ];
        let Some(n) = keys.sign(
            &target.share.share_id,
            handle_type,
            &kernel_bytes[..len],
            &mut signed,
        ) else {
            return err(libc::EIO);
        };
        out[8..8 + n].copy_from_slice(&signed[..n]);
        n
    } else {
        out[8..8 + len].copy_from_slice(&kernel_bytes[..len]);
        len
    };
    let mount_u64 = mnt.to_le_bytes();
    let mount_i32 = (mnt as u32).to_le_bytes();
    let mount_bytes: &[u8] = if flags & abi::AT_HANDLE_MNT_ID_UNIQUE != 0 {
        &mount_u64
    } else {
        &mount_i32
    };
    if f_len > header.handle_bytes as usize {
        let overflow = handle::Header {
            handle_bytes: f_len as u32,
            handle_type: handle::FILEID_INVALID,
        }
        .encode();
        return match write(
            target,
            n,
            &[(mount_id_ptr, mount_bytes), (handle_ptr, &overflow)],
        ) {
            Ok(()) => err(libc::EOVERFLOW),
            Err(outcome) => outcome,
        };
    }
    out[..8].copy_from_slice(
        &handle::Header {
            handle_bytes: f_len as u32,
            handle_type,
        }
        .encode(),
    );
    match write(
        target,
        n,
        &[(mount_id_ptr, mount_bytes), (handle_ptr, &out[..8 + f_len])],
    ) {
        Ok(()) => Outcome::Return(0),
        Err(outcome) => outcome,
    }
}

/// name_to_handle_at.resolve: what the target's own lookup of `path` (NUL-terminated)
/// would find, as an O_PATH fd of ours; the walk runs with the target's credentials and
/// refuses magic links (they would resolve in fhmon's context).
fn resolve(call: &mut Call, dirfd: i32, path: &[u8], follow: bool) -> Result<OwnedFd, Outcome> {
    use crate::abi::{RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
    let (target, n) = (call.target, call.notif);
    let mut resolve_flags = RESOLVE_NO_MAGICLINKS;
    let start = if path.first() == Some(&b'/') {
        let root = open_proc_link(target, n, b"root")?;
        if !same_root_as_ours(call.settings.our_root, root.as_fd()) {
            resolve_flags |= RESOLVE_IN_ROOT;
        }
        root
    } else if dirfd == abi::AT_FDCWD {
        open_proc_link(target, n, b"cwd")?
    } else {
        if dirfd < 0 {
            return Err(err(libc::EBADF));
        }
        take_fd(target, n, dirfd)?
    };
    if path.len() <= 1 {
        return Ok(start); // the empty path: the start itself
    }
    let Some(base) = call.base else {
        return Err(Outcome::Defer);
    };
    let status = call.status()?;
    let cpath = std::ffi::CStr::from_bytes_with_nul(path).map_err(|_| err(libc::EFAULT))?;
    let open_flags = libc::O_PATH | libc::O_CLOEXEC | if follow { 0 } else { libc::O_NOFOLLOW };
    let _acting = ActingAs::full(base, &status.creds).map_err(|_| err(libc::EIO))?;
    sys::openat2(start.as_fd(), cpath, open_flags, resolve_flags)
        .map_err(|e| err(if e == 0 { libc::EINVAL } else { e }))
}

/// _same_root_as_ours: the target's root is fhmon's own (same inode and mount).
fn same_root_as_ours(ours: Option<(u64, u64, u64)>, root: BorrowedFd<'_>) -> bool {
    let Some(ours) = ours else {
        return false;
    };
    let Ok(dev_ino) = sys::fstat_dev_ino(root) else {
        return false;
    };
    let Ok((_, mnt)) = sys::statx_mode_mount(root) else {
        return false;
    };
    (dev_ino.0, dev_ino.1, mnt) == ours
}
