#![allow(unsafe_code)] // the one module allowed to (lib.rs denies it elsewhere)

//! The crate's only `unsafe` code: raw syscalls and the locked key memory.
//!
//! Every function here takes and returns plain Rust values (slices, arrays, OwnedFd) and
//! reports failure as an errno value: callers stay in safe code. Each unsafe block says which
//! invariant makes it sound.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::ptr::NonNull;

use crate::abi;

pub mod launch;

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

// --- seccomp listener ioctls ---------------------------------------------------------

/// SECCOMP_IOCTL_NOTIF_RECV into `buf` (zeroed first: the kernel demands it). Blocks.
pub fn notif_recv(
    listener: BorrowedFd<'_>,
    buf: &mut [u8; abi::SECCOMP_NOTIF_SIZE],
) -> Result<(), Errno> {
    buf.fill(0);
    // SAFETY: buf is a live, exclusively borrowed 80-byte buffer, the size of struct
    // seccomp_notif that this ioctl number encodes; the kernel writes only within it.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_RECV as _,
            buf.as_mut_ptr(),
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// SECCOMP_IOCTL_NOTIF_SEND with an encoded seccomp_notif_resp.
pub fn notif_send(
    listener: BorrowedFd<'_>,
    resp: &[u8; abi::SECCOMP_NOTIF_RESP_SIZE],
) -> Result<(), Errno> {
    let mut copy = *resp;
    // SAFETY: copy is a live 24-byte buffer, the size of struct seccomp_notif_resp that
    // this ioctl number encodes.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_SEND as _,
            copy.as_mut_ptr(),
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// SECCOMP_IOCTL_NOTIF_ID_VALID: Ok(true) while the notifying thread still waits.
pub fn notif_id_valid(listener: BorrowedFd<'_>, id: u64) -> Result<bool, Errno> {
    let mut id = id;
    // SAFETY: the ioctl reads one u64 through the pointer, which points at a live u64.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_ID_VALID as _,
            &mut id as *mut u64,
        )
    };
    match ret {
        0.. => Ok(true),
        _ if last_errno() == libc::ENOENT => Ok(false),
        _ => Err(last_errno()),
    }
}

/// SECCOMP_IOCTL_NOTIF_ADDFD with an encoded seccomp_notif_addfd: the target's fd number.
pub fn notif_addfd(
    listener: BorrowedFd<'_>,
    addfd: &[u8; abi::SECCOMP_NOTIF_ADDFD_SIZE],
) -> Result<i32, Errno> {
    let mut copy = *addfd;
    // SAFETY: copy is a live 24-byte buffer, the size of struct seccomp_notif_addfd that
    // this ioctl number encodes; the kernel only reads it.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_ADDFD as _,
            copy.as_mut_ptr(),
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(ret) }
}

/// SECCOMP_IOCTL_NOTIF_SET_FLAGS(SYNC_WAKE_UP): the flag goes by value, not by pointer.
pub fn notif_set_sync_wakeup(listener: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: this ioctl takes its argument by value; no memory is passed.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            abi::SECCOMP_IOCTL_NOTIF_SET_FLAGS as _,
            abi::SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP,
        )
    };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// poll(fd, POLLIN, timeout_ms): Some(revents) or None on timeout.
pub fn poll_in(fd: BorrowedFd<'_>, timeout_ms: i32) -> Result<Option<i16>, Errno> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, and nfds says one.
    let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    match ret {
        0 => Ok(None),
        1.. => Ok(Some(pfd.revents)),
        _ => Err(last_errno()),
    }
}

/// poll() over several fds: how many have revents set (0 on timeout).
pub fn poll_many(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, Errno> {
    // SAFETY: fds is a live, exclusively borrowed slice of pollfd and nfds is its length.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if ret < 0 {
        Err(last_errno())
    } else {
        Ok(ret as usize)
    }
}

/// How many CPUs the calling thread may run on (sched_getaffinity(0)); 1 on an error.
pub fn cpus_allowed() -> usize {
    // SAFETY: cpu_set_t is plain data (all-zero is a valid, empty set); the kernel writes at
    // most size_of::<cpu_set_t>() bytes into it, the size passed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let ret =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if ret != 0 {
        return 1;
    }
    // SAFETY: set is initialised (zeroed, then filled by the kernel).
    (unsafe { libc::CPU_COUNT(&set) }).max(1) as usize
}

// --- target memory -------------------------------------------------------------------

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

// --- fds of the target ----------------------------------------------------------------

pub use crate::abi::PIDFD_THREAD;

pub fn pidfd_open(pid: i32, flags: u32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) })
}

/// A duplicate of the target's fd `fd` through its pidfd.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, fd: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_getfd takes integers only and returns a new fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0u32) })
}

// --- file handles ---------------------------------------------------------------------

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
    let mut link = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    link[..prefix.len()].copy_from_slice(prefix);
    let n = write_decimal(fd.as_raw_fd() as u32, &mut link[prefix.len()..]);
    let path =
        CStr::from_bytes_with_nul(&link[..prefix.len() + n + 1]).map_err(|_| libc::EINVAL)?;
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

// --- files of our own ------------------------------------------------------------------

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

/// openat(dir, "..", O_PATH | O_DIRECTORY | O_CLOEXEC): the parent the kernel's own '..'
/// gives (ENOENT for a dentry outside what its bind mount shows).
pub fn open_parent(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: the path is a NUL-terminated literal; openat returns a new fd or -1.
    owned(unsafe { libc::openat(dir.as_raw_fd(), c"..".as_ptr(), flags) } as libc::c_long)
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

/// readlink("/proc/self/fd/N") into buf: the path the kernel prints for one of our fds.
pub fn fd_path<'b>(fd: BorrowedFd<'_>, buf: &'b mut [u8]) -> Result<&'b [u8], Errno> {
    let mut link = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    link[..prefix.len()].copy_from_slice(prefix);
    write_decimal(fd.as_raw_fd() as u32, &mut link[prefix.len()..]);
    // link[prefix.len() + len] stays 0: the terminating NUL
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

/// Whether a pidfd's task still lives (signal 0 through it), as linux.pidfd_alive.
pub fn pidfd_alive(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: pidfd_send_signal with signal 0 and no siginfo only checks the target.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    ret == 0
}

/// A duplicate of one of our fds (F_DUPFD_CLOEXEC), owned by the caller.
pub fn dup(fd: RawFd) -> Result<OwnedFd, Errno> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes integers and returns a new fd or -1; an fd
    // number that is not open gives EBADF.
    owned(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) } as libc::c_long)
}

// --- waking threads blocked in RECV -------------------------------------------------------

/// The signal that interrupts a data-plane thread's RECV (EINTR): a real-time signal no
/// Python code uses, with a handler that does nothing and no SA_RESTART.
pub fn wake_signal() -> i32 {
    libc::SIGRTMIN() + 6
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Install the do-nothing handler for wake_signal() (process-wide; idempotent).
pub fn install_wake_handler() -> Result<(), Errno> {
    // SAFETY: sigaction is plain old data; zeroed is a valid empty mask and no flags.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = ignore_signal as *const () as libc::sighandler_t;
    // SAFETY: a live sigaction whose handler is an extern "C" fn that touches nothing
    // (async-signal-safe); no old action is requested.
    let ret = unsafe { libc::sigaction(wake_signal(), &action, std::ptr::null_mut()) };
    if ret < 0 { Err(last_errno()) } else { Ok(()) }
}

/// Block every signal on the calling thread but wake_signal(): Python's signals go to its
/// own threads, and a data-plane thread never runs a handler mid-call except the no-op one.
pub fn block_signals_but_wake() {
    // SAFETY: sigset_t is plain old data, filled by sigfillset/sigdelset before use; the
    // mask change affects the calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::sigdelset(&mut set, wake_signal());
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Send wake_signal() to a thread of this process (by its pthread_t, from JoinHandle).
pub fn wake_thread(thread: libc::pthread_t) {
    // SAFETY: the caller passes the pthread_t of a thread it has not joined yet (the
    // JoinHandle is still held), so the id names a live or zombie-but-unjoined thread.
    unsafe { libc::pthread_kill(thread, wake_signal()) };
}

// --- credentials of the calling thread ---------------------------------------------------

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
    let mut header = CapHeader {
        version: abi::LINUX_CAPABILITY_VERSION_3,
        pid: 0,
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

/// capget of another thread by TID: (effective, permitted). The TID is a number: only a
/// liveness proof through the thread's pidfd after the call shows it named that thread.
pub fn capget_tid(tid: u32) -> Result<(u64, u64), Errno> {
    let mut header = CapHeader {
        version: abi::LINUX_CAPABILITY_VERSION_3,
        pid: i32::try_from(tid).map_err(|_| libc::ESRCH)?,
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
    ))
}

/// ioctl(PIDFD_GET_INFO, PIDFD_INFO_CREDS): the pidfd's thread's ruid, rgid, euid, egid,
/// suid, sgid, fsuid and fsgid, as the kernel holds them now (ESRCH once it has exited;
/// ENOTTY or EINVAL before 6.13).
pub fn pidfd_creds(pidfd: BorrowedFd<'_>) -> Result<[u32; 8], Errno> {
    let mut info = [0u8; abi::PIDFD_INFO_SIZE_VER0];
    info[..8].copy_from_slice(&abi::PIDFD_INFO_CREDS.to_ne_bytes());
    // SAFETY: the ioctl reads and writes exactly the 64 bytes its number encodes.
    let ret = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            abi::PIDFD_GET_INFO as _,
            info.as_mut_ptr(),
        )
    };
    if ret < 0 {
        return Err(last_errno());
    }
    let mask = u64::from_ne_bytes(info[..8].try_into().unwrap_or_default());
    if mask & abi::PIDFD_INFO_CREDS == 0 {
        return Err(libc::EINVAL);
    }
    let mut ids = [0u32; 8];
    for (i, id) in ids.iter_mut().enumerate() {
        let at = 28 + 4 * i;
        *id = u32::from_ne_bytes(info[at..at + 4].try_into().unwrap_or_default());
    }
    Ok(ids)
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

/// Block every signal on the calling thread; the previous mask, for restore_signals.
pub fn block_all_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data filled by sigfillset; the old mask is written by
    // pthread_sigmask into a live sigset_t. Affects the calling thread only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    }
}

pub fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: old is a mask returned by block_all_signals.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

// --- our own fds --------------------------------------------------------------------------

/// open("/proc/self/fd/N", flags): a new open file for what fd names, with an open's
/// permission checks (linux.reopen).
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> Result<OwnedFd, Errno> {
    let mut link = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    link[..prefix.len()].copy_from_slice(prefix);
    write_decimal(fd.as_raw_fd() as u32, &mut link[prefix.len()..]);
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

// --- unix sockets ------------------------------------------------------------------------

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

// --- locked memory for keys ------------------------------------------------------------

/// A value in its own anonymous mapping, locked in RAM (mlock: never swapped), left out of
/// core dumps (MADV_DONTDUMP), and overwritten with zeros before it is unmapped.
pub struct LockedBox<T> {
    ptr: NonNull<T>,
    len: usize,
    _owns: PhantomData<T>,
}

// SAFETY: LockedBox owns its T exclusively (like Box<T>), so it is Send/Sync when T is.
unsafe impl<T: Send> Send for LockedBox<T> {}
// SAFETY: as above; shared access only hands out &T.
unsafe impl<T: Sync> Sync for LockedBox<T> {}

impl<T> LockedBox<T> {
    pub fn new(value: T) -> Result<Self, Errno> {
        let page = 4096usize;
        let size = std::mem::size_of::<T>().max(1);
        let len = size.div_ceil(page) * page;
        assert!(std::mem::align_of::<T>() <= page);
        // SAFETY: an anonymous private mapping of `len` bytes, not aliasing anything.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(last_errno());
        }
        // SAFETY: [addr, addr + len) is the mapping made just above.
        let locked = unsafe { libc::mlock(addr, len) };
        if locked != 0 {
            let err = last_errno();
            // SAFETY: unmapping the mapping made above, which nothing references yet.
            unsafe { libc::munmap(addr, len) };
            return Err(err);
        }
        // SAFETY: as above; the advice only concerns core dumps (failure is harmless).
        unsafe { libc::madvise(addr, len, libc::MADV_DONTDUMP) };
        let ptr = NonNull::new(addr.cast::<T>()).ok_or(libc::ENOMEM)?;
        // SAFETY: the mapping is page-aligned (>= align_of::<T>), writable and at least
        // size_of::<T>() bytes; nothing was there to drop.
        unsafe { ptr.as_ptr().write(value) };
        Ok(LockedBox {
            ptr,
            len,
            _owns: PhantomData,
        })
    }
}

impl<T> std::ops::Deref for LockedBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: ptr holds an initialised T for the box's whole life (written in new,
        // dropped only in drop).
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for LockedBox<T> {
    fn drop(&mut self) {
        let base = self.ptr.as_ptr();
        // SAFETY: base holds the initialised T, dropped exactly once, here; afterwards the
        // whole mapping is plain bytes that this box alone owns, so zeroing it is sound.
        unsafe {
            std::ptr::drop_in_place(base);
            let bytes = std::slice::from_raw_parts_mut(base.cast::<u8>(), self.len);
            zeroize::Zeroize::zeroize(bytes);
            libc::munlock(base.cast(), self.len);
            libc::munmap(base.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_box_holds_its_value() {
        let b = LockedBox::new([7u8; 100]).unwrap();
        assert_eq!(b[99], 7);
    }

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
