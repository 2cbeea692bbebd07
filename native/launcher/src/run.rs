//! The launch itself: parse, fork under the filter (child.rs), register, probe, let CMD run
//! and stay its parent (supervise.rs); when fhmon cannot serve CMD, run it unserved
//! (--fail-open) here; and the exit statuses and messages for a CMD that could not run.
//!
//! One thread, one poll loop. SIGTERM, SIGINT and SIGHUP are blocked from the start and
//! read from a signalfd, so there is no moment at which one kills the launcher instead of
//! being forwarded; the child restores the mask just before it execs CMD. Every fd is
//! close-on-exec: CMD (and CMD run unserved, in this very process) inherits none of them.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::AsFd;

use fhmon_native::sys::launch as os;

use crate::args::{self, Invocation, Mode};
use crate::child::{Setup, fork_under_filter};
use crate::errnames;
use crate::supervise::supervise;
use crate::users;

const FORWARDED: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
/// Dispositions a command must get back: the forwarded ones, and those a parent (Rust's
/// runtime, CPython) may have left ignored.
pub(crate) const RESET: [i32; 5] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGPIPE,
    libc::SIGXFSZ,
];

/// Launching failed before CMD ran; the message is for the operator (exit status 125).
#[derive(Debug)]
pub struct LaunchError(pub String);

/// How far a launch got.
pub(crate) enum Outcome {
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
