//! The child's side of the launch: fork, drop to --user, NO_NEW_PRIVS, load the handle
//! filter, hand the listener to the parent, answer the start-up probe, exec CMD (or report
//! why not) on "go"; and the parent's end of that hand-over (fork_under_filter, reap).
//! Apart because child_main is the only code that runs under the filter: it keeps no copy
//! of the listener once sent, and never returns.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use fhmon_native::sys::{self, launch as os};

use crate::channel;
use crate::errnames;
use crate::filter;
use crate::run::{RESET, exec_exit_status};
use crate::wait::{Ready, wait};

const ALREADY_LISTENED: &str = "this process already runs under another seccomp notify \
    listener (a container runtime's seccomp agent, or an enclosing `fhmon launch`), and the \
    kernel allows only one (EBUSY): run fhmon launch outside it, or register the process \
    through that agent";

pub(crate) struct Child {
    pub(crate) pid: i32,
    pub(crate) listener: OwnedFd,
    pub(crate) channel: UnixStream,
}

pub(crate) enum Setup {
    Failed(String),
    Signal(i32),
}

pub(crate) fn reap(pid: i32, kill: bool) {
    if kill {
        let _ = os::kill(pid, libc::SIGKILL);
    }
    let _ = os::waitpid(pid);
}

/// Fork a child that drops to `user`, installs the handle filter and hands its listener
/// back. The child keeps no copy of the listener (a target holding its own could answer
/// its own calls); it then waits on the channel for a probe or its argv.
pub(crate) fn fork_under_filter(
    user: Option<(u32, u32)>,
    argv: &[CString],
    mask: &os::SigMask,
    timeout: f64,
    signals: BorrowedFd<'_>,
) -> Result<Child, Setup> {
    let program = filter::program();
    let (parent_end, child_end) =
        UnixStream::pair().map_err(|e| Setup::Failed(format!("socketpair: {e}")))?;
    let pid = match os::fork() {
        Err(e) => return Err(Setup::Failed(format!("fork: {}", errnames::text(e)))),
        Ok(None) => {
            drop(parent_end);
            child_main(child_end, user, argv, &program, mask)
        }
        Ok(Some(pid)) => pid,
    };
    drop(child_end);
    // Same user as CMD in KubeVirt (107): a non-dumpable launcher cannot be ptraced or
    // have the listener taken (pidfd_getfd) by a compromised virtiofsd without
    // CAP_SYS_PTRACE. The child stays dumpable (fhmon reads its memory).
    let _ = os::not_dumpable();
    let deadline = Instant::now() + Duration::from_secs_f64(timeout);
    let failed = |text: String| {
        reap(pid, true);
        Setup::Failed(text)
    };
    match wait(&[parent_end.as_fd()], signals, Some(deadline)) {
        Ready::Signal(sig) => {
            reap(pid, true);
            return Err(Setup::Signal(sig));
        }
        Ready::Timeout => return Err(failed("the child did not answer".into())),
        Ready::Fd(_) => {}
    }
    let mut buf = [0u8; 4096];
    match sys::recv_with_fd(parent_end.as_fd(), &mut buf) {
        Ok((n, Some(listener))) if n >= 1 && buf[0] == channel::LISTENER => Ok(Child {
            pid,
            listener,
            channel: parent_end,
        }),
        Ok((n, _)) => {
            let text = String::from_utf8_lossy(&buf[1.min(n)..n]).into_owned();
            Err(failed(if text.is_empty() {
                "the child exited".into()
            } else {
                text
            }))
        }
        Err(e) => Err(failed(errnames::text(e))),
    }
}

/// The child's whole life: never returns.
fn child_main(
    mut chan: UnixStream,
    user: Option<(u32, u32)>,
    argv: &[CString],
    program: &[libc::sock_filter],
    mask: &os::SigMask,
) -> ! {
    let name = argv[0].to_string_lossy().into_owned();
    let mut report = |text: String| -> ! {
        let mut out = vec![channel::ERROR];
        out.extend_from_slice(text.as_bytes());
        let _ = chan.write_all(&out);
        os::exit_now(127)
    };
    if let Some((uid, gid)) = user {
        if let Err(e) = os::drop_to(uid, gid) {
            report(format!("{name}: [Errno {e}] {}", errnames::text(e)));
        }
    }
    if let Err(e) = os::no_new_privs() {
        report(format!(
            "{name}: [Errno {e}] prctl(NO_NEW_PRIVS): {}",
            errnames::text(e)
        ));
    }
    let listener = match os::seccomp_new_listener(program) {
        Ok(fd) => fd,
        Err(libc::EBUSY) => report(ALREADY_LISTENED.into()),
        Err(e) => report(format!(
            "{name}: [Errno {e}] seccomp(SET_MODE_FILTER, NEW_LISTENER): {}",
            errnames::text(e)
        )),
    };
    if os::send_with_fds(chan.as_fd(), &[channel::LISTENER], &[listener.as_raw_fd()]).is_err() {
        os::exit_now(127);
    }
    drop(listener);
    let mut pending: Vec<u8> = Vec::new();
    let command = loop {
        let frame = match channel::parse_frame(&pending) {
            Ok(Some(f)) => {
                let (frame, used) = ((f.kind, f.payload.to_vec()), f.used);
                pending.drain(..used);
                frame
            }
            Ok(None) => {
                let mut buf = [0u8; 4096];
                match chan.read(&mut buf) {
                    Ok(0) | Err(_) => os::exit_now(0), // the parent gave up
                    Ok(n) => pending.extend_from_slice(&buf[..n]),
                }
                continue;
            }
            Err(channel::TooLong) => os::exit_now(126),
        };
        match frame {
            (channel::PROBE, share) => {
                let outcome = probe_handles(&String::from_utf8_lossy(&share));
                let mut out = vec![channel::PROBED];
                out.extend_from_slice(outcome.as_bytes());
                out.push(0);
                let _ = chan.write_all(&out);
            }
            (channel::GO_WITH, payload) => break channel::split_argv(&payload),
            _ => os::exit_now(126),
        }
    };
    let command: Vec<CString> = command
        .into_iter()
        .filter_map(|a| CString::new(a).ok())
        .collect();
    if command.is_empty() {
        os::exit_now(126);
    }
    os::default_dispositions(&RESET);
    os::set_sigmask(mask);
    let code = os::execvp(&command); // chan is close-on-exec: EOF means CMD runs
    let _ = chan.write_all(&channel::exec_failed(code, command[0].as_bytes()));
    os::exit_now(exec_exit_status(code))
}

/// What virtiofsd does at start-up, done under the filter before exec: a handle of the
/// shared directory's root (name_to_handle_at, AT_EMPTY_PATH on an O_PATH fd), then
/// open_by_handle_at of it. "" when both succeed (so both reached whoever holds the
/// listener: the kernel alone refuses open_by_handle_at without CAP_DAC_READ_SEARCH), else
/// the call and its errno. A runtime's seccomp profile that answers ERRNO outranks the
/// filter's USER_NOTIF, and shows here as that errno.
fn probe_handles(share: &str) -> String {
    let open = |flags: i32| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(share)
            .map(OwnedFd::from)
    };
    let (root, mount) = match (open(libc::O_PATH), open(0)) {
        (Ok(r), Ok(m)) => (r, m),
        (Err(e), _) | (_, Err(e)) => {
            let code = e.raw_os_error().unwrap_or(libc::EIO);
            return format!("cannot open the share {share}: {}", errnames::text(code));
        }
    };
    let failed = |call: &str, code: i32| {
        format!(
            "{call} of the share's root: {} ({})",
            errnames::name(code),
            errnames::text(code)
        )
    };
    let mut handle = [0u8; fhmon_native::handle::MAX_HANDLE_SZ];
    let (handle_type, len, _) =
        match sys::name_to_handle_at(root.as_fd(), c"", libc::AT_EMPTY_PATH, &mut handle) {
            Ok(h) => h,
            Err(e) => return failed("name_to_handle_at", e),
        };
    match sys::open_by_handle_at(
        mount.as_fd(),
        handle_type,
        &handle[..len],
        libc::O_PATH | libc::O_CLOEXEC,
    ) {
        Ok(_) => String::new(),
        Err(e) => failed("open_by_handle_at", e),
    }
}
