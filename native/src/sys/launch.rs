//! The native launcher's syscalls (native/launcher, `fhmon-launch`): processes, signals,
//! credentials, the seccomp filter and fd passing. Part of the one syscall module: each
//! function takes and returns plain values and reports failure as an errno.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use super::{Errno, last_errno, owned};

fn check(ret: libc::c_long) -> Result<libc::c_long, Errno> {
    if ret < 0 { Err(last_errno()) } else { Ok(ret) }
}

fn sigset_of(signals: &[i32]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it, sigaddset only sets
    // bits in the set we own (an invalid signal number gives EINVAL and is skipped).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in signals {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// A saved signal mask (what to restore before exec).
#[derive(Clone, Copy)]
pub struct SigMask(libc::sigset_t);

/// Block `signals` in this (single-threaded) process; the mask before.
pub fn block_signals(signals: &[i32]) -> SigMask {
    let set = sigset_of(signals);
    // SAFETY: both pointers are to live sigset_t values; sigprocmask cannot fail with
    // SIG_BLOCK and valid pointers.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
        SigMask(old)
    }
}

/// Set the signal mask back to `mask`.
pub fn set_sigmask(mask: &SigMask) {
    // SAFETY: mask.0 is a sigset_t sigprocmask filled; the old mask is not asked for.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &mask.0, std::ptr::null_mut());
    }
}

/// A signalfd (non-blocking, close-on-exec) for `signals`, which must be blocked.
pub fn signalfd(signals: &[i32]) -> Result<OwnedFd, Errno> {
    let set = sigset_of(signals);
    // SAFETY: set is a live sigset_t; -1 asks for a new fd, returned or -1.
    owned(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) }.into())
}

/// The next signal a signalfd holds, None when none is pending.
pub fn read_signalfd(fd: BorrowedFd<'_>) -> Option<i32> {
    // SAFETY: signalfd_siginfo is plain old data; read writes at most its size into it.
    unsafe {
        let mut info: libc::signalfd_siginfo = std::mem::zeroed();
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        let n = libc::read(
            fd.as_raw_fd(),
            (&mut info as *mut libc::signalfd_siginfo).cast(),
            size,
        );
        (n == size as isize).then_some(info.ssi_signo as i32)
    }
}

/// Put the default disposition back for `signals` (ignored ones survive exec otherwise:
/// Rust's runtime ignores SIGPIPE).
pub fn default_dispositions(signals: &[i32]) {
    for &sig in signals {
        // SAFETY: SIG_DFL is a valid disposition for any catchable signal; an invalid
        // number only gives SIG_ERR.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// fork(2): Ok(None) in the child, Ok(Some(pid)) in the parent. The caller must be
/// single-threaded (the launcher never starts a thread), so the child may allocate.
pub fn fork() -> Result<Option<i32>, Errno> {
    // SAFETY: fork has no memory-safety preconditions in a single-threaded process.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(last_errno()),
        0 => Ok(None),
        pid => Ok(Some(pid)),
    }
}

/// _exit(2): end this process now (a forked child never runs Rust's exit path).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit only ends the process.
    unsafe { libc::_exit(code) }
}

/// execvp(argv[0], argv); returns only on failure, with the errno.
pub fn execvp(argv: &[CString]) -> Errno {
    if argv.is_empty() {
        return libc::EINVAL;
    }
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: ptrs is a NULL-terminated array of NUL-terminated strings that `argv` keeps
    // alive for the call; execvp reads them only.
    unsafe { libc::execvp(ptrs[0], ptrs.as_ptr()) };
    last_errno()
}

/// waitpid(pid, 0): the raw status, retried on EINTR.
pub fn waitpid(pid: i32) -> Result<i32, Errno> {
    let mut status = 0;
    loop {
        // SAFETY: status is a live int the kernel writes.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret >= 0 {
            return Ok(status);
        }
        let e = last_errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// The shell's reading of a wait status: the exit code, or 128 + the signal.
pub fn exit_code(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// kill(pid, sig).
pub fn kill(pid: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: kill takes two integers.
    check(unsafe { libc::kill(pid, sig) }.into()).map(|_| ())
}

/// pidfd_send_signal(pidfd, sig): never reaches a process that reused the pid.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: i32) -> Result<(), Errno> {
    // SAFETY: integers and a NULL siginfo (the kernel fills in the sender).
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    })
    .map(|_| ())
}

/// Drop to uid/gid with no supplementary groups (setgroups, setgid, setuid: all threads).
pub fn drop_to(uid: u32, gid: u32) -> Result<(), Errno> {
    // SAFETY: setgroups with size 0 reads no memory; setgid/setuid take integers.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()).into())?;
        check(libc::setgid(gid).into())?;
        check(libc::setuid(uid).into())?;
    }
    Ok(())
}

/// prctl(PR_SET_NO_NEW_PRIVS, 1): needed before an unprivileged seccomp filter.
pub fn no_new_privs() -> Result<(), Errno> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into()).map(|_| ())
}

/// prctl(PR_SET_DUMPABLE, 0): a same-user process then needs CAP_SYS_PTRACE to reach us.
pub fn not_dumpable() -> Result<(), Errno> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }.into()).map(|_| ())
}

/// seccomp(SET_MODE_FILTER, NEW_LISTENER, program): the listener fd (close-on-exec).
pub fn seccomp_new_listener(program: &[libc::sock_filter]) -> Result<OwnedFd, Errno> {
    let len = u16::try_from(program.len()).map_err(|_| libc::EINVAL)?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: prog points at `program`, live for the call, with its true length; the
    // kernel copies it and returns a new fd or -1.
    let fd = owned(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        )
    })?;
    // SAFETY: F_SETFD on the fd we own.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) }.into())?;
    Ok(fd)
}

/// sendmsg on a unix stream socket: all of `data` in one message with `fds` (SCM_RIGHTS).
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> Result<usize, Errno> {
    let mut control = [0u64; 8]; // room for a cmsghdr with up to 8 fds
    let space = if fds.is_empty() {
        0
    } else {
        // SAFETY: CMSG_SPACE is arithmetic.
        unsafe { libc::CMSG_SPACE((fds.len() * 4) as u32) as usize }
    };
    if space > std::mem::size_of_val(&control) {
        return Err(libc::EINVAL);
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid "no name, no control" value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if space > 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds `space` bytes, enough for one cmsghdr with
        // fds.len() ints (checked above); CMSG_FIRSTHDR of it is non-null.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as _;
            let out = libc::CMSG_DATA(cmsg).cast::<i32>();
            for (i, fd) in fds.iter().enumerate() {
                out.add(i).write_unaligned(*fd);
            }
        }
    }
    // SAFETY: msg points at the live iovec (over `data`, only read) and control buffer.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    check(n as libc::c_long).map(|n| n as usize)
}

/// SO_PEERCRED of a connected unix socket: (pid, uid, gid) of whoever listens on it.
pub fn peer_cred(sock: BorrowedFd<'_>) -> Result<(i32, u32, u32), Errno> {
    // SAFETY: ucred is plain old data; getsockopt writes at most `len` bytes into it.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        check(
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
            .into(),
        )?;
        Ok((cred.pid, cred.uid, cred.gid))
    }
}

/// A non-blocking, close-on-exec unix stream socket connected to `path` (connect on a unix
/// socket completes at once or fails: EAGAIN when the listener's backlog is full).
pub fn connect_unix(path: &[u8]) -> Result<OwnedFd, Errno> {
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid empty address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.is_empty() || path.len() >= addr.sun_path.len() || path.contains(&0) {
        return Err(if path.is_empty() {
            libc::ENOENT
        } else {
            libc::ENAMETOOLONG
        });
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: integer arguments; a new fd or -1.
    let sock = owned(
        unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        }
        .into(),
    )?;
    let len = (std::mem::size_of::<libc::sa_family_t>() + path.len() + 1) as libc::socklen_t;
    // SAFETY: addr is a live sockaddr_un holding a NUL-terminated path of `len` bytes.
    let ret = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    check(ret.into())?;
    Ok(sock)
}

/// recv(MSG_DONTWAIT) into buf: Ok(0) at EOF, Err(EAGAIN) when nothing is there.
pub fn recv_nowait(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: buf is exclusively borrowed; recv writes at most buf.len() bytes.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    check(n as libc::c_long).map(|n| n as usize)
}
