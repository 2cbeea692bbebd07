//! The parent's side once the child holds the filter: register with fhmon, probe (fail-open
//! only), tell the child to exec CMD, then stay CMD's parent, forwarding signals and
//! registering again whenever fhmon goes away, until CMD exits. Every wait here also reads
//! the forwarded signals (wait.rs): before CMD runs they stop the launch, after they are
//! CMD's.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use fhmon_native::intake::{FrameDecoder, Message};
use fhmon_native::sys::{self, launch as os};

use crate::args::{self, Invocation, Options};
use crate::channel;
use crate::child::{Child, reap};
use crate::errnames;
use crate::register::{RegError, Registration, read_answer};
use crate::run::{Outcome, exec_exit_status, exec_failure_message};
use crate::stuck_calls::restart_stuck_calls;
use crate::wait::{Ready, wait};

/// Register, probe (fail-open only), let the child exec, then stay its parent.
pub(crate) fn supervise(inv: &Invocation, child: Child, signals: BorrowedFd<'_>) -> Outcome {
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
