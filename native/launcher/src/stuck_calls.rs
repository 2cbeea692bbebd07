//! Re-kicking the calls a dead fhmon left unanswered, before the launcher registers again:
//! the native counterpart of monitor/stuck_calls.py (the keeper's and fhmon serve's). Its
//! own file because it reads /proc (thread_state, a parser of target-controlled bytes, is
//! fuzzed by src/fuzzing.rs) and owns the stop-wait timing.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use fhmon_native::sys::launch as os;

/// Seconds for every thread to stop before SIGCONT regardless (monitor/stuck_calls.py).
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Make the child's calls that a dead fhmon received but never answered trap again: SIGSTOP
/// interrupts the wait (the kernel drops the notification), SIGCONT resumes the thread
/// into the restarted syscall with a new id (monitor/stuck_calls.py says why it is safe).
pub(crate) fn restart_stuck_calls(pidfd: BorrowedFd<'_>, pid: i32) {
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
