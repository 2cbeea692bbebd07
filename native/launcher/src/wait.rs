//! Waiting, the launcher's one way to block: on some fds, the signalfd of the forwarded
//! signals and a deadline at once, so that a signal is never missed while the parent waits
//! for the child, for fhmon or for CMD's exit. Shared by the child's set-up (child.rs) and
//! the parent's loops (supervise.rs).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use fhmon_native::sys::{self, launch as os};

pub(crate) enum Ready {
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
pub(crate) fn wait(
    fds: &[BorrowedFd<'_>],
    signals: BorrowedFd<'_>,
    deadline: Option<Instant>,
) -> Ready {
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
