//! How a target's threads share its CPU under data_plane_threads = "auto": the second
//! reader that parks while confined to one CPU (`Spare`), the work lock a thread holds
//! while it works on a call (`take_work`), and `lock`, how the plane takes its mutexes (one
//! that a caught panic left poisoned is taken over, not a second panic).

use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::sys;

/// A target's second reader under data_plane_threads = "auto". With one reader, that
/// reader waits in ADDFD|SEND until the target has run and taken the fd, so the target's
/// next open_by_handle_at finds nobody in RECV; on an idle machine the two then drift to
/// different CPUs and each call wakes a halted CPU (p50 7x the reference's, unpinned:
/// docs/performance.md). A second reader blocked in RECV is woken where the target runs
/// (SYNC_WAKE_UP) instead. Confined to one CPU, it cannot run while the first waits and
/// only adds a switch per call (about 1 us, pinned), so it parks there: its affinity is
/// looked at once a second. It is there to read, not to work alongside: under "auto" a
/// thread works on a call only while it holds the target's `work` lock, given up for the
/// wait in ADDFD|SEND, so a target's calls use at most one CPU of the plane at a time (a
/// target crawling through symlinks on two threads had put its neighbour's p99 at 11x).
pub(super) struct Spare {
    checked: Instant,
    confined: bool,
}

impl Spare {
    pub(super) const RECHECK: Duration = Duration::from_secs(1);

    pub(super) fn new() -> Spare {
        Spare {
            checked: Instant::now(),
            confined: sys::cpus_allowed() < 2,
        }
    }

    pub(super) fn confined(&mut self) -> bool {
        if self.checked.elapsed() >= Self::RECHECK {
            self.checked = Instant::now();
            self.confined = sys::cpus_allowed() < 2;
        }
        self.confined
    }
}

/// The target's work lock (Spare), spun for up to WORK_SPIN before sleeping for it: a
/// call of the target's other thread usually ends within that (3-7 us of work), and a
/// futex sleep and wake-up per call cost more CPU than the call itself (4 target threads,
/// unpinned: 22.8 us per call against 11.2 with one plane thread). A call that crawls
/// (a path walk of milliseconds, a lease break) is waited for asleep.
pub(super) fn take_work(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    const WORK_SPIN: Duration = Duration::from_micros(20);
    let start = Instant::now();
    loop {
        for _ in 0..32 {
            match m.try_lock() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
            }
        }
        if start.elapsed() >= WORK_SPIN {
            return lock(m);
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
