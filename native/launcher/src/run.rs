//! The launch itself: fork under the filter, register, probe, let CMD run, stay its parent.
//!
//! One thread, one poll loop. SIGTERM, SIGINT and SIGHUP are blocked from the start and
//! read from a signalfd, so there is no moment at which one kills the launcher instead of
//! being forwarded; the child restores the mask just before it execs CMD. Every fd is
//! close-on-exec: CMD (and CMD run unserved, in this very process) inherits none of them.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use fhmon_native::intake::{self, FrameDecoder, Message};
use fhmon_native::sys::{self, launch as os};

use crate::args::{self, Invocation, Mode, Options};
use crate::channel;
use crate::errnames;
use crate::filter;
use crate::users;

const FORWARDED: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
/// Dispositions a command must get back: the forwarded ones, and those a parent (Rust's
/// runtime, CPython) may have left ignored.
const RESET: [i32; 5] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGPIPE,
    libc::SIGXFSZ,
];
/// Seconds for every thread to stop before SIGCONT regardless (monitor/stuck_calls.py).
const STOP_WAIT: Duration = Duration::from_secs(2);

const ALREADY_LISTENED: &str = "this process already runs under another seccomp notify \
    listener (a container runtime's seccomp agent, or an enclosing `fhmon launch`), and the \
    kernel allows only one (EBUSY): run fhmon launch outside it, or register the process \
    through that agent";

/// Launching failed before CMD ran; the message is for the operator (exit status 125).
#[derive(Debug)]
pub struct LaunchError(pub String);

/// How far a launch got.
enum Outcome {
    /// CMD ran (or its exec failed): the status to exit with
    Exit(i32),
    /// fhmon cannot serve CMD; why
    FallBack(String),
}

/// The program: parse `args` (after argv[0]), launch, return the exit status.
pub fn main_with(args: &[Vec<u8>]) -> i32 {
    let invocation = match args::parse(args) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("fhmon-launch: error: {}", e.0);
            return 2;
        }
    };
    if invocation.mode == Mode::Help {
        print!("{}", args::USAGE);
        return 0;
    }
    if invocation.mode == Mode::ServedArgv {
        let mut out = std::io::stdout().lock();
        for arg in args::served_argv(&invocation.argv, &invocation.options) {
            let _ = out.write_all(&arg).and_then(|()| out.write_all(b"\0"));
        }
        return 0;
    }
    match launch(&invocation) {
        Ok(code) => code,
        Err(LaunchError(message)) => {
            eprintln!("fhmon launch: {message}");
            125
        }
    }
}

fn read_table(path: &str) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Run CMD registered with fhmon; its exit status (128+N for a signal N).
pub fn launch(inv: &Invocation) -> Result<i32, LaunchError> {
    if inv.argv.is_empty() {
        return Err(LaunchError("no command given after --".into()));
    }
    let timeout = inv.options.registration_timeout;
    if !(timeout > 0.0 && timeout.is_finite()) {
        return Err(LaunchError(
            "--registration-timeout must be positive".into(),
        ));
    }
    let user = match &inv.user {
        Some(spec) => Some(
            users::parse_user(spec, &read_table("/etc/passwd"), &read_table("/etc/group"))
                .map_err(LaunchError)?,
        ),
        None => None,
    };
    let argv: Vec<CString> = inv
        .argv
        .iter()
        .map(|a| CString::new(a.clone()))
        .collect::<Result<_, _>>()
        .map_err(|_| LaunchError("an argument of CMD holds a NUL byte".into()))?;
    let mask = os::block_signals(&FORWARDED);
    let signals = os::signalfd(&FORWARDED)
        .map_err(|e| LaunchError(format!("signalfd: {}", errnames::text(e))))?;
    let outcome = match fork_under_filter(user, &argv, &mask, timeout, signals.as_fd()) {
        Err(Setup::Failed(text)) => {
            Outcome::FallBack(format!("could not install the filter: {text}"))
        }
        Err(Setup::Signal(sig)) => Outcome::Exit(128 + sig),
        Ok(child) => supervise(inv, child, signals.as_fd()),
    };
    match outcome {
        Outcome::Exit(code) => Ok(code),
        Outcome::FallBack(reason) if !inv.options.fail_open => Err(LaunchError(reason)),
        Outcome::FallBack(reason) => {
            eprintln!(
                "fhmon launch: running {} without fhmon (no file handles): {reason}",
                String::from_utf8_lossy(&inv.argv[0])
            );
            drop(signals);
            Ok(exec_unserved(&argv, user, &mask))
        }
    }
}

/// Become argv exactly as given, in this process (no filter: it is only ever installed in
/// the child). Returns only when exec fails, with the shell's status for that.
fn exec_unserved(argv: &[CString], user: Option<(u32, u32)>, mask: &os::SigMask) -> i32 {
    os::default_dispositions(&RESET);
    let dropped = match user {
        Some((uid, gid)) => os::drop_to(uid, gid),
        None => Ok(()),
    };
    let _ = std::io::stderr().flush();
    let code = match dropped {
        Ok(()) => {
            os::set_sigmask(mask); // a pending SIGTERM ends us here
            os::execvp(argv)
        }
        Err(e) => e,
    };
    eprintln!(
        "fhmon launch: {}",
        exec_failure_message(code, &argv[0].to_string_lossy())
    );
    exec_exit_status(code)
}

/// A shell's convention: 127 when the command is not there, 126 when it cannot run.
pub fn exec_exit_status(code: i32) -> i32 {
    if code == libc::ENOENT || code == libc::ENOTDIR {
        127
    } else {
        126
    }
}

/// One line for a command that could not be executed: errno name, path, and a hint.
pub fn exec_failure_message(code: i32, command: &str) -> String {
    let mut text = format!(
        "cannot execute {command}: {} ({})",
        errnames::name(code),
        errnames::text(code)
    );
    if code == libc::ENOENT || code == libc::ENOTDIR {
        let place = if command.contains('/') {
            "at that path"
        } else {
            "on PATH"
        };
        text += &format!(
            "; not found {place}: is virtiofsd installed? Distributions put it in \
             /usr/libexec/virtiofsd, which is not on PATH, so give the full path"
        );
    } else if code == libc::EACCES {
        text += "; check that it is executable by the --user given and not on a noexec mount";
    }
    text
}

// --- waiting --------------------------------------------------------------------------

enum Ready {
    Fd(usize),
    Signal(i32),
    Timeout,
}

fn millis_until(deadline: Option<Instant>) -> i32 {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            // round up: never wake just before the deadline and spin
            (left.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
        }
    }
}

/// Wait until one of `fds` is readable (or hung up), a forwarded signal arrives, or the
/// deadline passes. Signals come first.
fn wait(fds: &[BorrowedFd<'_>], signals: BorrowedFd<'_>, deadline: Option<Instant>) -> Ready {
    loop {
        if let Some(sig) = os::read_signalfd(signals) {
            return Ready::Signal(sig);
        }
        let mut set: Vec<libc::pollfd> = std::iter::once(signals)
            .chain(fds.iter().copied())
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        match sys::poll_many(&mut set, millis_until(deadline)) {
            Ok(0) if deadline.is_some_and(|d| Instant::now() >= d) => return Ready::Timeout,
            Ok(_) => {
                if set[0].revents != 0 {
                    continue; // read at the top
                }
                if let Some(i) = set[1..].iter().position(|p| p.revents != 0) {
                    return Ready::Fd(i);
                }
            }
            Err(libc::EINTR) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

// --- the filtered child -----------------------------------------------------------------

struct Child {
    pid: i32,
    listener: OwnedFd,
    channel: UnixStream,
}

enum Setup {
    Failed(String),
    Signal(i32),
}

fn reap(pid: i32, kill: bool) {
    if kill {
        let _ = os::kill(pid, libc::SIGKILL);
    }
    let _ = os::waitpid(pid);
}

/// Fork a child that drops to `user`, installs the handle filter and hands its listener
/// back. The child keeps no copy of the listener (a target holding its own could answer
/// its own calls); it then waits on the channel for a probe or its argv.
fn fork_under_filter(
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

// --- registration -------------------------------------------------------------------------

enum RegError {
    Os(i32),
    Launch(String),
}

/// The launcher's side of a registration: the listener copy stays here for the target's
/// whole life; the connection is renewed when it drops.
struct Registration<'a> {
    socket: &'a [u8],
    share: &'a str,
    pid: i32,
    listener: OwnedFd,
    /// the first ACCEPT's share id: every re-registration must land on that share
    share_id: Option<[u8; 32]>,
}

impl Registration<'_> {
    fn place(&self) -> String {
        String::from_utf8_lossy(self.socket).into_owned()
    }

    /// Connect and send HELLO with the listener and the child's pidfd.
    fn send_hello(&self) -> Result<OwnedFd, RegError> {
        let sock = os::connect_unix(self.socket).map_err(RegError::Os)?;
        // Refuse to hand the listener to anything but root: SO_PEERCRED names the process
        // that bound and listens on the socket; whoever holds the listener answers the
        // target's calls.
        let (pid, uid, _) = os::peer_cred(sock.as_fd()).map_err(RegError::Os)?;
        if uid != 0 {
            return Err(RegError::Launch(format!(
                "the server at {} runs as uid {uid} (pid {pid}), not root: refusing to hand \
                 it the listener (is that fhmon's socket?)",
                self.place()
            )));
        }
        // The child's pidfd proves to fhmon which process the target is, in whatever pid
        // namespace this launcher runs (self.pid is only this namespace's pid).
        let hello = intake::encode(&Message::Hello {
            target_pid: self.pid as u32,
            share: self.share.to_string(),
            client: format!("fhmon-launch/{}", std::process::id()),
            flags: intake::HELLO_TARGET_PIDFD,
            version: intake::PROTOCOL_VERSION,
            share_id: self.share_id,
        })
        .map_err(|e| RegError::Launch(e.0))?;
        let pidfd = sys::pidfd_open(self.pid, 0).map_err(RegError::Os)?;
        let sent = os::send_with_fds(
            sock.as_fd(),
            &hello,
            &[self.listener.as_raw_fd(), pidfd.as_raw_fd()],
        )
        .map_err(RegError::Os)?;
        if sent != hello.len() {
            return Err(RegError::Os(libc::EAGAIN));
        }
        Ok(sock)
    }
}

/// Read what is there from a registration's socket: Some(answer) once whole.
fn read_answer(
    sock: BorrowedFd<'_>,
    decoder: &mut FrameDecoder,
) -> Result<Option<Message>, RegError> {
    let mut buf = [0u8; 4096];
    match os::recv_nowait(sock, &mut buf) {
        Ok(0) => Err(RegError::Launch(
            "fhmon closed the connection without answering".into(),
        )),
        Ok(n) => {
            decoder
                .feed(&buf[..n])
                .map_err(|e| RegError::Launch(format!("fhmon's answer is not valid: {e}")))?;
            decoder
                .next_message()
                .map_err(|e| RegError::Launch(format!("fhmon's answer is not valid: {e}")))
        }
        Err(libc::EAGAIN) | Err(libc::EINTR) => Ok(None),
        Err(e) => Err(RegError::Os(e)),
    }
}

/// Register, probe (fail-open only), let the child exec, then stay its parent.
fn supervise(inv: &Invocation, child: Child, signals: BorrowedFd<'_>) -> Outcome {
    let Child {
        pid,
        listener,
        mut channel,
    } = child;
    let pidfd = match sys::pidfd_open(pid, 0) {
        Ok(fd) => fd,
        Err(e) => {
            reap(pid, true);
            return Outcome::FallBack(format!("pidfd_open: {}", errnames::text(e)));
        }
    };
    let mut reg = Registration {
        socket: &inv.socket,
        share: &inv.share,
        pid,
        listener,
        share_id: None,
    };
    let started = match start(inv, &mut reg, &mut channel, signals) {
        Start::Running(sock) => sock,
        Start::Stopped(sig) => {
            reap(pid, true);
            return Outcome::Exit(128 + sig);
        }
        Start::Done(outcome) => {
            reap(pid, true); // the child never ran CMD: never left waiting
            return outcome;
        }
    };
    // Signals are CMD's from here on.
    let forward = |sig: i32| {
        let _ = os::pidfd_send_signal(pidfd.as_fd(), sig);
    };
    let mut data = Vec::new();
    loop {
        match wait(&[channel.as_fd()], signals, None) {
            Ready::Signal(sig) => forward(sig),
            Ready::Timeout => {}
            Ready::Fd(_) => {
                let mut buf = [0u8; 4096];
                match channel.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => data.extend_from_slice(&buf[..n]),
                }
            }
        }
    }
    drop(channel);
    if let Some((code, name)) = channel::exec_outcome(&data) {
        let _ = os::waitpid(pid);
        eprintln!("fhmon launch: {}", exec_failure_message(code, &name));
        return Outcome::Exit(exec_exit_status(code));
    }
    Outcome::Exit(stay_parent(&mut reg, started, pidfd.as_fd(), signals))
}

enum Start {
    /// CMD was told to run; the registered connection
    Running(OwnedFd),
    /// a forwarded signal came before CMD ran
    Stopped(i32),
    Done(Outcome),
}

/// Everything before CMD runs.
fn start(
    inv: &Invocation,
    reg: &mut Registration<'_>,
    channel: &mut UnixStream,
    signals: BorrowedFd<'_>,
) -> Start {
    let options: &Options = &inv.options;
    let timeout = Duration::from_secs_f64(options.registration_timeout);
    let shown = args::seconds(options.registration_timeout);
    let place = reg.place();
    let deadline = Instant::now() + timeout;
    let fall_back = |text: String| Start::Done(Outcome::FallBack(text));
    let sock = loop {
        match reg.send_hello() {
            Ok(sock) => break sock,
            // a full backlog: fhmon is there but busy; try again until the deadline
            Err(RegError::Os(libc::EAGAIN)) => {
                let soon = (Instant::now() + Duration::from_millis(10)).min(deadline);
                if let Ready::Signal(sig) = wait(&[], signals, Some(soon)) {
                    return Start::Stopped(sig);
                }
                if Instant::now() >= deadline {
                    return fall_back(format!("fhmon at {place} did not answer within {shown}s"));
                }
            }
            Err(RegError::Os(e)) => {
                return fall_back(format!(
                    "cannot reach fhmon at {place}: {}",
                    errnames::text(e)
                ));
            }
            Err(RegError::Launch(text)) => return fall_back(text),
        }
    };
    let mut decoder = FrameDecoder::new();
    let answer = loop {
        match wait(&[sock.as_fd()], signals, Some(deadline)) {
            Ready::Signal(sig) => return Start::Stopped(sig),
            Ready::Timeout => {
                return fall_back(format!("fhmon at {place} did not answer within {shown}s"));
            }
            Ready::Fd(_) => match read_answer(sock.as_fd(), &mut decoder) {
                Ok(Some(answer)) => break answer,
                Ok(None) => {}
                Err(RegError::Os(e)) => {
                    return fall_back(format!(
                        "cannot reach fhmon at {place}: {}",
                        errnames::text(e)
                    ));
                }
                Err(RegError::Launch(text)) => return fall_back(text),
            },
        }
    };
    match answer {
        Message::Accept { share_id, .. } => reg.share_id = Some(share_id),
        Message::Refuse { errno, reason } => {
            return fall_back(format!(
                "fhmon refused the registration: {reason} ({})",
                errnames::name(errno as i32)
            ));
        }
        other => return fall_back(format!("fhmon answered {}, not ACCEPT", other.name())),
    }
    if options.fail_open {
        if channel
            .write_all(&channel::frame(channel::PROBE, inv.share.as_bytes()))
            .is_err()
        {
            return fall_back(
                "registered, but the start-up probe failed: the child's channel \
                              failed"
                    .into(),
            );
        }
        let deadline = Instant::now() + timeout;
        let mut data = Vec::new();
        let failed = loop {
            if let Some(outcome) = channel::probe_outcome(&data) {
                break outcome;
            }
            match wait(&[channel.as_fd()], signals, Some(deadline)) {
                Ready::Signal(sig) => return Start::Stopped(sig),
                Ready::Timeout => {
                    return fall_back(format!(
                        "registered, but the start-up probe got no answer within {shown}s \
                         (is it {place} that holds the listener?)"
                    ));
                }
                Ready::Fd(_) => {
                    let mut buf = [0u8; 4096];
                    match channel.read(&mut buf) {
                        Ok(0) => break "the child exited during the probe".into(),
                        Ok(n) => data.extend_from_slice(&buf[..n]),
                        Err(e) => break format!("the child's channel failed: {e}"),
                    }
                }
            }
        };
        if !failed.is_empty() {
            return fall_back(format!(
                "registered, but the start-up probe failed: {failed}"
            ));
        }
    }
    let command = args::served_argv(&inv.argv, options);
    if channel.write_all(&channel::go_with(&command)).is_err() {
        return fall_back("the filtered child exited before CMD could run".into());
    }
    Start::Running(sock)
}

/// Stay CMD's parent until it exits: forward signals, and when fhmon goes away, register
/// again with backoff after re-kicking the calls the old fhmon left unanswered. While no
/// fhmon holds the listener the target's trapped calls wait (this process holds a copy, so
/// the filter never loses its last listener).
fn stay_parent(
    reg: &mut Registration<'_>,
    sock: OwnedFd,
    pidfd: BorrowedFd<'_>,
    signals: BorrowedFd<'_>,
) -> i32 {
    enum State {
        Registered(OwnedFd),
        Waiting { at: Instant, delay: Duration },
        Asking(OwnedFd, FrameDecoder, Duration),
    }
    let mut state = State::Registered(sock);
    let mut refused = String::new();
    let retry = |delay: Duration| State::Waiting {
        at: Instant::now() + delay,
        delay: (delay * 2).min(Duration::from_secs(1)),
    };
    loop {
        let (watched, deadline) = match &state {
            State::Registered(s) | State::Asking(s, _, _) => (Some(s.as_fd()), None),
            State::Waiting { at, .. } => (None, Some(*at)),
        };
        let mut fds = vec![pidfd];
        fds.extend(watched);
        let ready = wait(&fds, signals, deadline);
        match ready {
            Ready::Signal(sig) => {
                let _ = os::pidfd_send_signal(pidfd, sig);
                continue;
            }
            Ready::Fd(0) => {
                let status = os::waitpid(reg.pid).unwrap_or(0);
                return os::exit_code(status);
            }
            _ => {}
        }
        state = match state {
            State::Registered(s) => {
                let mut buf = [0u8; 4096];
                match os::recv_nowait(s.as_fd(), &mut buf) {
                    Ok(n) if n > 0 => State::Registered(s),
                    Err(libc::EAGAIN) | Err(libc::EINTR) => State::Registered(s),
                    _ => {
                        drop(s);
                        eprintln!("fhmon launch: connection to fhmon lost; registering again");
                        // The old fhmon is gone (EOF comes when its fds close): re-kick its
                        // unanswered calls now, while no fhmon can be answering any call.
                        restart_stuck_calls(pidfd, reg.pid);
                        retry(Duration::from_millis(20))
                    }
                }
            }
            State::Waiting { at, delay } if Instant::now() < at => State::Waiting { at, delay },
            State::Waiting { delay, .. } => match reg.send_hello() {
                Ok(s) => State::Asking(s, FrameDecoder::new(), delay),
                Err(RegError::Os(_)) => retry(delay),
                Err(RegError::Launch(text)) => {
                    if text != refused {
                        eprintln!("fhmon launch: {text}"); // once per reason
                        refused = text;
                    }
                    retry(delay)
                }
            },
            State::Asking(s, mut decoder, delay) => match read_answer(s.as_fd(), &mut decoder) {
                Ok(None) => State::Asking(s, decoder, delay),
                Ok(Some(Message::Accept { .. })) => {
                    eprintln!("fhmon launch: registered again");
                    State::Registered(s)
                }
                Ok(Some(other)) => {
                    let why = match &other {
                        Message::Refuse { reason, .. } => reason.clone(),
                        m => m.name().to_string(),
                    };
                    eprintln!("fhmon launch: re-registration refused: {why}");
                    retry(delay)
                }
                Err(RegError::Os(_)) => retry(delay),
                Err(RegError::Launch(text)) => {
                    if text != refused {
                        eprintln!("fhmon launch: {text}");
                        refused = text;
                    }
                    retry(delay)
                }
            },
        };
    }
}

// --- stuck calls ---------------------------------------------------------------------------

/// Make the child's calls that a dead fhmon received but never answered trap again: SIGSTOP
/// interrupts the wait (the kernel drops the notification), SIGCONT resumes the thread
/// into the restarted syscall with a new id (monitor/stuck_calls.py says why it is safe).
fn restart_stuck_calls(pidfd: BorrowedFd<'_>, pid: i32) {
    if os::pidfd_send_signal(pidfd, libc::SIGSTOP).is_err() {
        return;
    }
    let deadline = Instant::now() + STOP_WAIT;
    while Instant::now() < deadline && alive(pidfd) && !all_threads_stopped(pid) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = os::pidfd_send_signal(pidfd, libc::SIGCONT);
}

fn alive(pidfd: BorrowedFd<'_>) -> bool {
    os::pidfd_send_signal(pidfd, 0) != Err(libc::ESRCH)
}

/// Every thread of pid is stopped (T/t) or dead: its pending call has been dropped.
pub fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        let Ok(stat) = std::fs::read(task.path().join("stat")) else {
            return true;
        };
        thread_state(&stat).is_none_or(|s| matches!(s, b'T' | b't' | b'Z' | b'X'))
    })
}

/// The state letter of a /proc/PID/task/TID/stat line (after the last ')').
pub fn thread_state(stat: &[u8]) -> Option<u8> {
    let at = stat.iter().rposition(|&b| b == b')')?;
    stat[at + 1..]
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace())
}
